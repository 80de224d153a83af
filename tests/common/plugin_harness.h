// The harness of the tests that dlopen a backend plugin and drive it directly, with no core
// (naive_threads_test, plugin_p2p_concurrency_test, shm_lanes_test): the host table, an
// in-memory store, descriptor builders and a GoogleTest environment that loads the plugins.
// Header-only; needs the public ABI headers, GoogleTest and the standard library, never libmncl.
#ifndef MNCL_TESTS_COMMON_PLUGIN_HARNESS_H
#define MNCL_TESTS_COMMON_PLUGIN_HARNESS_H

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mncl/mncl_plugin.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/coll.h"  // the plugin kit (plugins/common)

namespace mncl_testing {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs fn(r) for r in [0, n), each on its own thread, and joins them all.
template <typename Fn>
void on_threads(int n, Fn &&fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto &t : threads) t.join();
}

// ---------------------------------------------------------------------------------------------
// The host: per-thread last error (as the ABI requires), logs to stderr (the plugin filters by
// MNCL_TEST_LOG_LEVEL, or a default level), and get_env with per-test pins and defaults.
// ---------------------------------------------------------------------------------------------

inline thread_local std::string t_last_error;
inline const char *g_log_tag = "plugin";  // the "[tag level file:line]" prefix of log lines

inline std::string vformat(const char *fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(&out[0], out.size() + 1, fmt, args);
  return out;
}

inline void host_set_error(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  t_last_error = vformat(fmt, args);
  va_end(args);
}

inline void host_log(int32_t level, const char *file, int32_t line, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string text = vformat(fmt, args);
  va_end(args);
  std::fprintf(stderr, "[%s %d %s:%d] %s\n", g_log_tag, level, file, line, text.c_str());
}

// What get_env answers: a pinned name its pinned value (nullptr for ""), whatever the process
// environment holds; any other name the environment, else its default, if one is set. Answers
// are interned, so they stay valid while a test re-pins the name from another thread.
class HostEnv {
 public:
  void pin(const std::string &name, const std::string &value) {
    const std::lock_guard<std::mutex> lock(mu_);
    pinned_[name] = value.empty() ? nullptr : intern(value);
  }
  void set_default(const std::string &name, const std::string &value) {
    const std::lock_guard<std::mutex> lock(mu_);
    defaults_[name] = intern(value);
  }
  const char *get(const char *name) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      const auto it = pinned_.find(name);
      if (it != pinned_.end()) return it->second;
    }
    if (const char *v = std::getenv(name)) return v;
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = defaults_.find(name);
    return it == defaults_.end() ? nullptr : it->second;
  }

 private:
  const char *intern(const std::string &v) { return strings_.insert(v).first->c_str(); }

  std::mutex mu_;
  std::set<std::string> strings_;
  std::map<std::string, const char *> pinned_, defaults_;
};

inline HostEnv &host_env() {
  static HostEnv env;
  return env;
}

inline const char *host_get_env(const char *name) {
  return host_env().get(name);
}

struct HostOptions {
  const char *log_tag = "plugin";
  int32_t log_level = MNCL_LOG_WARN;  // unless MNCL_TEST_LOG_LEVEL says otherwise
  std::map<std::string, std::string> env_pinned;
  std::map<std::string, std::string> env_defaults;
};

inline mncl_host_v1_t make_host(const HostOptions &options) {
  g_log_tag = options.log_tag;
  for (const auto &kv : options.env_pinned) host_env().pin(kv.first, kv.second);
  for (const auto &kv : options.env_defaults) host_env().set_default(kv.first, kv.second);
  const char *level = std::getenv("MNCL_TEST_LOG_LEVEL");
  return {
      sizeof(mncl_host_v1_t), MNCL_VERSION, level ? std::atoi(level) : options.log_level, host_log,
      host_set_error,         host_get_env};
}

// ---------------------------------------------------------------------------------------------
// An in-memory mncl_store_v1_t: std::map + mutex + condition variable, thread-safe, with the
// abort switch of the core's store callbacks (once thrown, every call returns
// MNCL_ERR_ABORTED). keys() and max_keys() let a test check what plugins leave behind.
// ---------------------------------------------------------------------------------------------

class MemStore {
 public:
  MemStore() {
    table_ = {sizeof(mncl_store_v1_t), this,
              &MemStore::set_cb,       &MemStore::get_cb,
              &MemStore::release_cb,   &MemStore::add_cb,
              &MemStore::wait_cb,      &MemStore::del_cb};
  }
  MemStore(const MemStore &) = delete;
  MemStore &operator=(const MemStore &) = delete;

  const mncl_store_v1_t *table() const { return &table_; }

  void abort() {
    const std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  std::vector<std::string> keys() {
    const std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto &kv : kv_) out.push_back(kv.first);
    return out;
  }
  size_t max_keys() {  // the most keys held at once
    const std::lock_guard<std::mutex> lock(mu_);
    return max_keys_;
  }

 private:
  using Lock = std::unique_lock<std::mutex>;
  static MemStore *self(void *ctx) { return static_cast<MemStore *>(ctx); }

  // Waits until every key exists: MNCL_OK, or MNCL_ERR_TIMEOUT / MNCL_ERR_ABORTED with an error.
  mncl_status_t wait_for(Lock &lock, const std::vector<std::string> &keys, int64_t timeout_ms) {
    const std::string *missing = nullptr;
    const auto ready = [&] {
      if (aborted_) return true;
      for (const auto &k : keys) {
        if (kv_.count(k) == 0) {
          missing = &k;
          return false;
        }
      }
      return true;
    };
    const bool ok =
        cv_.wait_until(lock, Clock::now() + std::chrono::milliseconds(timeout_ms), ready);
    if (aborted_) {
      host_set_error("store: aborted");
      return MNCL_ERR_ABORTED;
    }
    if (!ok) {
      host_set_error("store: key '%s' not set within %lld ms", missing ? missing->c_str() : "",
                     static_cast<long long>(timeout_ms));
      return MNCL_ERR_TIMEOUT;
    }
    return MNCL_OK;
  }
  void stored() {  // after a write, under the lock
    max_keys_ = std::max(max_keys_, kv_.size());
    cv_.notify_all();
  }

  static mncl_status_t set_cb(void *ctx, const char *key, const void *value, size_t len) {
    MemStore *s = self(ctx);
    const Lock lock(s->mu_);
    if (s->aborted_) return MNCL_ERR_ABORTED;
    s->kv_[key].assign(static_cast<const char *>(value), len);
    s->stored();
    return MNCL_OK;
  }
  static mncl_status_t get_cb(void *ctx, const char *key, void **value, size_t *len,
                              int64_t timeout_ms) {
    MemStore *s = self(ctx);
    Lock lock(s->mu_);
    if (const mncl_status_t st = s->wait_for(lock, {key}, timeout_ms); st != MNCL_OK) return st;
    const std::string &v = s->kv_[key];
    *value = std::malloc(v.size() + 1);
    std::memcpy(*value, v.data(), v.size());
    *len = v.size();
    return MNCL_OK;
  }
  static void release_cb(void *, void *value) { std::free(value); }
  static mncl_status_t add_cb(void *ctx, const char *key, int64_t delta, int64_t *result) {
    MemStore *s = self(ctx);
    const Lock lock(s->mu_);
    if (s->aborted_) return MNCL_ERR_ABORTED;
    const auto it = s->kv_.find(key);
    *result = (it == s->kv_.end() ? 0 : std::stoll(it->second)) + delta;
    s->kv_[key] = std::to_string(*result);
    s->stored();
    return MNCL_OK;
  }
  static mncl_status_t wait_cb(void *ctx, const char *const *keys, size_t nkeys,
                               int64_t timeout_ms) {
    MemStore *s = self(ctx);
    Lock lock(s->mu_);
    return s->wait_for(lock, std::vector<std::string>(keys, keys + nkeys), timeout_ms);
  }
  static mncl_status_t del_cb(void *ctx, const char *key) {
    MemStore *s = self(ctx);
    const Lock lock(s->mu_);
    if (s->aborted_) return MNCL_ERR_ABORTED;
    s->kv_.erase(key);
    return MNCL_OK;
  }

  mncl_store_v1_t table_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
  size_t max_keys_ = 0;
  bool aborted_ = false;
};

// ---------------------------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------------------------

// Rank r of `size` ranks, all on this host, with no device, bootstrapped through `store`.
inline mncl_bootstrap_v1_t make_bootstrap(int r, int size, int64_t timeout_ms, const char *comm_id,
                                          const mncl_store_v1_t *store) {
  return {sizeof(mncl_bootstrap_v1_t), r, size, r, size, 1, -1, timeout_ms, comm_id, store};
}

inline mncl_coll_v1_t make_coll(int32_t kind, int32_t dtype, int32_t op, int32_t root,
                                const void *sendbuf, void *recvbuf, size_t count, uint64_t seq,
                                int64_t timeout_ms) {
  mncl_coll_v1_t c = mncl::kit::make_coll(kind, dtype, op, root, sendbuf, recvbuf, count);
  c.seq = seq;
  c.timeout_ms = timeout_ms;
  return c;
}

// ---------------------------------------------------------------------------------------------
// The plugins, loaded and initialized once for the whole test program.
// ---------------------------------------------------------------------------------------------

struct Plugin {
  void *handle = nullptr;
  const mncl_plugin_v1_t *v1 = nullptr;
  const mncl_plugin_v2_t *v2 = nullptr;  // looked up for every plugin, required by kV2 only
};

// Before the first test, dlopens each plugin, looks its tables up and initializes it through
// the table of its `abi`; after the last, finalizes it and (unless keep_loaded) dlcloses it.
class PluginsEnv : public ::testing::Environment {
 public:
  enum Abi { kV1, kV2 };
  struct Entry {
    std::string name;
    const char *path;
    Abi abi;
    Plugin *out;
    bool keep_loaded = false;
  };

  PluginsEnv(const HostOptions &host, std::vector<Entry> plugins)
      : host_(make_host(host)), plugins_(std::move(plugins)) {}

  void SetUp() override {
    for (const Entry &e : plugins_) {
      Plugin &p = *e.out;
      p.handle = dlopen(e.path, RTLD_NOW | RTLD_LOCAL);
      ASSERT_NE(p.handle, nullptr) << dlerror();
      p.v1 = static_cast<const mncl_plugin_v1_t *>(dlsym(p.handle, MNCL_PLUGIN_V1_SYMBOL));
      p.v2 = static_cast<const mncl_plugin_v2_t *>(dlsym(p.handle, MNCL_PLUGIN_V2_SYMBOL));
      ASSERT_NE(p.v1, nullptr) << e.name << ": no " MNCL_PLUGIN_V1_SYMBOL;
      if (e.abi == kV2) {
        ASSERT_NE(p.v2, nullptr) << e.name << ": no " MNCL_PLUGIN_V2_SYMBOL;
      }
      const mncl_status_t st = e.abi == kV2 ? p.v2->init(&host_) : p.v1->init(&host_);
      ASSERT_EQ(st, MNCL_OK) << e.name << ": " << t_last_error;
    }
  }
  void TearDown() override {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
      Plugin &p = *it->out;
      void (*finalize)(void) =
          it->abi == kV2 ? (p.v2 ? p.v2->finalize : nullptr) : (p.v1 ? p.v1->finalize : nullptr);
      if (finalize != nullptr) finalize();
      if (p.handle != nullptr && !it->keep_loaded) dlclose(p.handle);
    }
  }

 private:
  const mncl_host_v1_t host_;  // the plugins keep a pointer to it
  std::vector<Entry> plugins_;
};

// Registers the environment before main (gtest_main) runs the tests; gtest owns and deletes it.
inline ::testing::Environment *add_plugins_env(const HostOptions &host,
                                               std::vector<PluginsEnv::Entry> plugins) {
  return ::testing::AddGlobalTestEnvironment(new PluginsEnv(host, std::move(plugins)));
}

}  // namespace mncl_testing

#endif  // MNCL_TESTS_COMMON_PLUGIN_HARNESS_H

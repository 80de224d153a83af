#include "core/store_bridge.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"

namespace mncl::core {

namespace {

StoreBridge &bridge(void *ctx) {
  return *static_cast<StoreBridge *>(ctx);
}

// Runs fn, turning a C++ exception into a status and the thread's last error: the table is
// called from plugins, so nothing may propagate.
template <typename Fn>
mncl_status_t guarded(Fn &&fn) {
  try {
    fn();
    return MNCL_OK;
  } catch (const Error &e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc &) {
    set_last_error("out of memory in the bootstrap store");
    return MNCL_ERR_SYSTEM;
  } catch (const std::exception &e) {
    set_last_error(std::string("bootstrap store: ") + e.what());
    return MNCL_ERR_INTERNAL;
  }
}

bootstrap::WaitOptions wait_options(StoreBridge &b, int64_t timeout_ms) {
  bootstrap::WaitOptions opts;
  opts.timeout = std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  opts.aborted = b.aborted();
  return opts;
}

// Runs one wait of up to timeout_ms as waits of at most kPeerCheckMs, checking the peers
// between them: try_once(slice_ms) returns true once waited for, false at the slice's end.
// Throws MNCL_ERR_REMOTE when a peer exited or aborted; returns false when the whole timeout
// has passed.
template <typename TryOnce>
bool wait_watching_peers(StoreBridge &b, int64_t timeout_ms, TryOnce try_once) {
  if (b.peers() == nullptr || timeout_ms <= StoreBridge::kPeerCheckMs) {
    return try_once(std::max<int64_t>(timeout_ms, 0));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  struct Watching {
    std::atomic<int> &count;
    explicit Watching(std::atomic<int> &c) : count(c) { count.fetch_add(1); }
    ~Watching() { count.fetch_sub(1); }
  } watching(b.watching_count());
  for (;;) {
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now())
                             .count();
    if (try_once(std::clamp<int64_t>(left, 0, StoreBridge::kPeerCheckMs))) return true;
    if (left <= StoreBridge::kPeerCheckMs) return false;
    const PeerWatch::Finding gone = b.peers()->check();
    if (gone.status != MNCL_OK) {
      // What was awaited may have come just before its sender went: take it if it is there.
      if (try_once(0)) return true;
      // REMOTE either way: to a plugin, MNCL_ERR_ABORTED means this rank's own abort (naive
      // words its message by it); the core reports a peer's abort as such (Comm::execute_now).
      throw Error(MNCL_ERR_REMOTE, gone.reason);
    }
  }
}

mncl_status_t check_key(const char *key) {
  if (key != nullptr && *key != '\0') return MNCL_OK;
  set_last_error("bootstrap store: the key is NULL or empty");
  return MNCL_ERR_INVALID_ARGUMENT;
}

mncl_status_t store_set(void *ctx, const char *key, const void *value, size_t len) {
  if (auto s = check_key(key); s != MNCL_OK) return s;
  return guarded([&] { bridge(ctx).store().set(key, value, len); });
}

mncl_status_t store_get(void *ctx, const char *key, void **value, size_t *len, int64_t timeout_ms) {
  if (auto s = check_key(key); s != MNCL_OK) return s;
  return guarded([&] {
    auto &b = bridge(ctx);
    MNCL_CHECK(!b.aborted()->load(), MNCL_ERR_ABORTED, "communicator aborted");
    bootstrap::Bytes bytes;
    const bool found = wait_watching_peers(b, timeout_ms, [&](int64_t slice_ms) {
      try {
        bytes = b.store().get(key, wait_options(b, slice_ms));
        return true;
      } catch (const Error &e) {
        if (e.status() != MNCL_ERR_TIMEOUT) throw;
        return false;
      }
    });
    MNCL_CHECK(found, MNCL_ERR_TIMEOUT, "store key '%s' not set within %.1f s", key,
               timeout_ms / 1000.0);
    // malloc(0) may return NULL: always allocate at least one byte.
    void *copy = std::malloc(bytes.empty() ? 1 : bytes.size());
    MNCL_CHECK(copy != nullptr, MNCL_ERR_SYSTEM, "out of memory for store value '%s' (%zu B)", key,
               bytes.size());
    if (!bytes.empty()) std::memcpy(copy, bytes.data(), bytes.size());
    *value = copy;
    *len = bytes.size();
  });
}

void store_release(void *, void *value) {
  std::free(value);
}

mncl_status_t store_add(void *ctx, const char *key, int64_t delta, int64_t *result) {
  if (auto s = check_key(key); s != MNCL_OK) return s;
  return guarded([&] {
    auto &b = bridge(ctx);
    MNCL_CHECK(!b.aborted()->load(), MNCL_ERR_ABORTED, "communicator aborted");
    const int64_t v = b.store().add(key, delta);
    if (result) *result = v;
  });
}

mncl_status_t store_wait(void *ctx, const char *const *keys, size_t nkeys, int64_t timeout_ms) {
  return guarded([&] {
    auto &b = bridge(ctx);
    MNCL_CHECK(!b.aborted()->load(), MNCL_ERR_ABORTED, "communicator aborted");
    std::vector<std::string> names;
    for (size_t i = 0; i < nkeys; ++i) {
      MNCL_CHECK(keys[i] && *keys[i], MNCL_ERR_INVALID_ARGUMENT, "store wait: key %zu is empty", i);
      names.emplace_back(keys[i]);
    }
    std::vector<std::string> missing;
    wait_watching_peers(b, timeout_ms, [&](int64_t slice_ms) {
      missing = b.store().wait(names, wait_options(b, slice_ms));
      return missing.empty();
    });
    if (!missing.empty()) {
      std::string list;
      for (const auto &k : missing) list += (list.empty() ? "'" : ", '") + k + "'";
      throw Error(MNCL_ERR_TIMEOUT, format("store keys not set within %.1f s: %s",
                                           timeout_ms / 1000.0, list.c_str()));
    }
  });
}

mncl_status_t store_del(void *ctx, const char *key) {
  if (auto s = check_key(key); s != MNCL_OK) return s;
  return guarded([&] { bridge(ctx).store().erase(key); });
}

}  // namespace

StoreBridge::StoreBridge(std::shared_ptr<bootstrap::Store> store, const std::atomic<bool> *aborted,
                         std::shared_ptr<PeerWatch> peers)
    : store_(std::move(store)), aborted_(aborted), peers_(std::move(peers)) {
  table_ = mncl_store_v1_t{sizeof(mncl_store_v1_t), this,      store_set,  store_get,
                           store_release,           store_add, store_wait, store_del};
}

}  // namespace mncl::core

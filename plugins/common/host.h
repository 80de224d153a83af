// Plugin kit: living with the host services (mncl_host_v1_t) and the no-exception ABI.
//
//   MNCL_KIT_LOG(host, MNCL_LOG_INFO, "naive: comm of %d ranks", n);   // checks the level first
//   return kit::report(host, MNCL_ERR_TIMEOUT, "naive recv #%llu: ...", ...); // set_error+status
//   throw kit::Error(MNCL_ERR_REMOTE, kit::format("rank %d sent %zu bytes", r, n));
//   return kit::guard(host, "naive execute", [&] { ...; return MNCL_OK; });  // at the ABI edge
//   kit::copy_cstr(reason, reason_len, "no InfiniBand device");        // into caller buffers
//   kit::read_size(host, "MNCL_SHM_CHUNK", 64 << 10, 1 << 30, &chunk);  // "1M": byte settings
#pragma once

#include <mncl/mncl_plugin.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

// Logs through the host if `level` is enabled; the arguments are not evaluated otherwise.
#define MNCL_KIT_LOG(host, level, ...)                                                   \
  do {                                                                                   \
    const mncl_host_v1_t *mncl_kit_host_ = (host);                                       \
    if (mncl_kit_host_ != nullptr && mncl_kit_host_->log != nullptr &&                   \
        static_cast<int32_t>(level) <= mncl_kit_host_->log_level) {                      \
      mncl_kit_host_->log(static_cast<int32_t>(level), __FILE__, __LINE__, __VA_ARGS__); \
    }                                                                                    \
  } while (0)

namespace mncl::kit {

// printf into a std::string.
inline std::string vformat(const char *fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::vsnprintf(&out[0], out.size(), fmt, args);
  out.resize(static_cast<size_t>(n));
  return out;
}

__attribute__((format(printf, 1, 2))) inline std::string format(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string out = vformat(fmt, args);
  va_end(args);
  return out;
}

// ASCII lower case: keyword values of the plugins' variables are taken in any case.
inline std::string lower(std::string text) {
  for (char &c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// A failure inside a plugin: thrown by plugin code, turned into set_error + status by guard().
// Without a message it means "the host already holds the message" (a store callback set it),
// and guard() returns the status without overwriting that message.
class Error : public std::runtime_error {
 public:
  Error(mncl_status_t status, const std::string &message)
      : std::runtime_error(message), status_(status), has_message_(true) {}
  explicit Error(mncl_status_t status)
      : std::runtime_error("(message set by the host)"), status_(status), has_message_(false) {}
  mncl_status_t status() const { return status_; }
  bool has_message() const { return has_message_; }

 private:
  mncl_status_t status_;
  bool has_message_;
};

// True if the host table has every v1 field (a newer core passes a larger struct).
inline bool host_is_usable(const mncl_host_v1_t *host) {
  return host != nullptr && host->struct_size >= sizeof(mncl_host_v1_t) &&
         host->set_error != nullptr && host->log != nullptr;
}

// Sets the calling thread's error message through the host and returns `status`, so error
// paths read `return report(host, MNCL_ERR_..., "...", ...);`. Safe with a null host.
__attribute__((format(printf, 3, 4))) inline mncl_status_t report(const mncl_host_v1_t *host,
                                                                  mncl_status_t status,
                                                                  const char *fmt, ...) {
  if (host != nullptr && host->set_error != nullptr) {
    va_list args;
    va_start(args, fmt);
    const std::string message = vformat(fmt, args);
    va_end(args);
    host->set_error("%s", message.c_str());  // never pass text as a format string
  }
  return status;
}

// "65536", "64K", "1M", "1G": a byte count. False if malformed.
inline bool parse_bytes(const char *text, size_t *out) {
  if (text[0] < '0' || text[0] > '9') return false;  // strtoull takes " -1" (as 2^64 - 1)
  errno = 0;
  char *end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0) return false;
  unsigned long long mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ull << 10;
  if (*end == 'M' || *end == 'm') mult = 1ull << 20;
  if (*end == 'G' || *end == 'g') mult = 1ull << 30;
  if (mult != 1) ++end;
  if (*end != '\0' || v > SIZE_MAX / mult) return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

// A byte-count setting read through the host (parse_bytes), between lo and hi; *value is left
// alone when it is unset. MNCL_ERR_INVALID_ARGUMENT naming it when malformed or out of range.
inline mncl_status_t read_size(const mncl_host_v1_t *host, const char *name, size_t lo, size_t hi,
                               size_t *value) {
  const char *text = host->get_env ? host->get_env(name) : nullptr;
  if (text == nullptr) return MNCL_OK;
  size_t v = 0;
  if (!parse_bytes(text, &v) || v < lo || v > hi) {
    return report(host, MNCL_ERR_INVALID_ARGUMENT,
                  "%s='%s' is not a number between %zu and %zu (K, M, G: 2^10, 2^20, 2^30)", name,
                  text, lo, hi);
  }
  *value = v;
  return MNCL_OK;
}

// Copies src into a caller's buffer of dst_len bytes, truncating, always NUL-terminated
// (probe's `reason`). Does nothing if dst is null or dst_len is 0.
inline void copy_cstr(char *dst, size_t dst_len, const char *src) {
  if (dst == nullptr || dst_len == 0) return;
  if (src == nullptr) src = "";
  size_t n = std::strlen(src);
  if (n >= dst_len) n = dst_len - 1;
  std::memcpy(dst, src, n);
  dst[n] = '\0';
}

// Runs f (returning mncl_status_t) and guarantees that no exception crosses the ABI:
// kit::Error becomes its status and message, std::bad_alloc MNCL_ERR_SYSTEM ("out of memory"
// is a system failure in mncl.h), anything else MNCL_ERR_INTERNAL with its what() text.
// `where` prefixes the message ("naive execute").
template <typename F>
mncl_status_t guard(const mncl_host_v1_t *host, const char *where, F &&f) noexcept {
  try {
    return f();
  } catch (const Error &e) {
    if (!e.has_message()) return e.status();
    return report(host, e.status(), "%s", e.what());
  } catch (const std::bad_alloc &) {
    return report(host, MNCL_ERR_SYSTEM, "%s: out of memory", where);
  } catch (const std::exception &e) {
    return report(host, MNCL_ERR_INTERNAL, "%s: internal error: %s", where, e.what());
  } catch (...) {
    return report(host, MNCL_ERR_INTERNAL, "%s: internal error: unknown exception", where);
  }
}

// The checks every comm_create makes on the core's bootstrap descriptor: the core checks it
// already, but a bad table here would crash on first use. MNCL_OK, or the reported error.
// `needs_store` is false for backends that bootstrap elsewhere (flat: MPI).
inline mncl_status_t check_bootstrap(const mncl_host_v1_t *host, const mncl_bootstrap_v1_t *bs,
                                     const char *where, bool needs_store = true) {
  const bool store_ok = !needs_store || (bs != nullptr && bs->store != nullptr &&
                                         bs->store->struct_size >= sizeof(mncl_store_v1_t));
  if (bs == nullptr || bs->struct_size < sizeof(mncl_bootstrap_v1_t) || !store_ok || bs->size < 1 ||
      bs->rank < 0 || bs->rank >= bs->size) {
    return report(host, MNCL_ERR_INVALID_ARGUMENT, "%s: invalid bootstrap descriptor", where);
  }
  return MNCL_OK;
}

// The communicators comm_abort may still reach. The plugin ABI lets comm_abort come from
// another thread while any call blocks, comm_destroy included (an application that dlopens a
// plugin may do that to end a teardown waiting for a dead peer). destroy_comm runs the waiting
// part of the teardown first (Comm::close(), for types that have one), then takes the
// communicator out of this set, waiting for aborts in progress, then frees it; abort_comm only
// acts on a member, counted while it runs (outside the lock: gloo's abort may take a while).
// So an abort ends before the free or finds the communicator gone, never freed memory.
// create_comm adds what it makes; flat's split adds its own with track_comm, and flat's
// comm_destroy takes its communicators out with untrack_comm.
struct LiveComms {
  std::mutex mutex;
  std::condition_variable cv;
  std::unordered_map<const void *, int> aborting;  // member -> aborts in progress
};
// Made with the plugin's first communicator and freed by release_live_comms(), which the
// plugin's finalize calls (the loader calls finalize when no communicator is left, before it
// unloads the plugin). Not a static object: its destructor ran at exit, before the core's exit
// handler where the plugin was loaded after that was registered, while the core's watchdog
// could still be aborting a communicator on another thread (a crash in gloo at exit).
inline std::atomic<LiveComms *> &live_comms_slot() {
  static std::atomic<LiveComms *> slot{nullptr};  // trivially destroyed: nothing runs at exit
  return slot;
}
inline LiveComms &live_comms() {
  std::atomic<LiveComms *> &slot = live_comms_slot();
  LiveComms *live = slot.load(std::memory_order_acquire);
  if (live != nullptr) return *live;
  auto *made = new LiveComms;
  if (slot.compare_exchange_strong(live, made, std::memory_order_acq_rel)) return *made;
  delete made;  // another thread's came first
  return *live;
}
// For the plugin's finalize: no communicator is left, and none comes before the next init.
inline void release_live_comms() {
  delete live_comms_slot().exchange(nullptr, std::memory_order_acq_rel);
}
inline void track_comm(const void *comm) {
  if (comm == nullptr) return;
  LiveComms &live = live_comms();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.aborting.emplace(comm, 0);
}
// Takes comm out once no abort runs on it; afterwards abort_comm leaves it alone.
inline void untrack_comm(const void *comm) {
  LiveComms &live = live_comms();
  std::unique_lock<std::mutex> lock(live.mutex);
  live.cv.wait(lock, [&] {
    auto it = live.aborting.find(comm);
    return it == live.aborting.end() || it->second == 0;
  });
  live.aborting.erase(comm);
}

template <typename T, typename = void>
struct HasClose : std::false_type {};
template <typename T>
struct HasClose<T, std::void_t<decltype(std::declval<T &>().close())>> : std::true_type {};

// The plugin table's comm_create frame: checks the descriptor, stores make()'s communicator in
// *comm (make may throw kit::Error), logs it. `backend` names the plugin in messages.
template <typename Make>
mncl_status_t create_comm(const mncl_host_v1_t *host, const char *backend,
                          const mncl_bootstrap_v1_t *bs, void **comm, Make &&make,
                          bool needs_store = true) noexcept {
  const std::string where = std::string(backend) + " comm_create";
  return guard(host, where.c_str(), [&] {
    if (const mncl_status_t st = check_bootstrap(host, bs, where.c_str(), needs_store);
        st != MNCL_OK) {
      return st;
    }
    *comm = make();
    track_comm(*comm);
    MNCL_KIT_LOG(host, MNCL_LOG_INFO, "%s: comm '%s' rank %d of %d created", backend,
                 bs->comm_id ? bs->comm_id : "?", bs->rank, bs->size);
    return MNCL_OK;
  });
}

// comm_destroy and comm_abort entries for a backend's Comm type (see LiveComms). Comm::close(),
// if the type has one, is the part of the teardown that waits for peers: comm_abort can end it.
// The communicator is freed even when close() fails; the failure is still reported.
template <typename Comm>
mncl_status_t destroy_comm(const mncl_host_v1_t *host, const char *where, void *comm) noexcept {
  auto *c = static_cast<Comm *>(comm);
  mncl_status_t closed = MNCL_OK;
  if constexpr (HasClose<Comm>::value) {
    closed = guard(host, where, [&] {
      c->close();
      return MNCL_OK;
    });
  }
  const mncl_status_t freed = guard(host, where, [&] {
    untrack_comm(comm);
    delete c;
    return MNCL_OK;
  });
  return closed != MNCL_OK ? closed : freed;
}
template <typename Comm>
mncl_status_t abort_comm(const mncl_host_v1_t *host, const char *where, void *comm) noexcept {
  return guard(host, where, [&] {
    LiveComms &live = live_comms();
    {
      std::lock_guard<std::mutex> lock(live.mutex);
      auto it = live.aborting.find(comm);
      if (it == live.aborting.end()) return MNCL_OK;  // destroyed already: nothing to end
      ++it->second;
    }
    struct Done {  // counted down however abort() ends
      LiveComms &live;
      const void *comm;
      ~Done() {
        {
          std::lock_guard<std::mutex> lock(live.mutex);
          --live.aborting[comm];
        }
        live.cv.notify_all();
      }
    } done{live, comm};
    static_cast<Comm *>(comm)->abort();
    return MNCL_OK;
  });
}

// The plugin table's execute entry for a backend whose Comm has execute(const mncl_coll_v1_t&).
template <typename Comm>
mncl_status_t execute_on(const mncl_host_v1_t *host, const char *where, void *comm,
                         const mncl_coll_v1_t *coll) noexcept {
  return guard(host, where, [&] {
    static_cast<Comm *>(comm)->execute(*coll);
    return MNCL_OK;
  });
}

}  // namespace mncl::kit

// The C API of libmncl (mncl.h): handle checks, then a call into the core, with every C++
// exception turned into a status and the thread's last-error message at this boundary.
#include <mncl/mncl.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/coll.h"   // the plugin kit's descriptor builder
#include "common/dtype.h"  // the plugin kit's dtype/op tables
#include "common/error.h"
#include "common/log.h"
#include "core/comm.h"
#include "core/validate.h"

// The opaque handles of mncl.h.
struct mncl_comm {
  explicit mncl_comm(std::shared_ptr<mncl::core::Comm> comm)
      : impl(std::move(comm)), rank(impl->rank()), size(impl->size()), backend(impl->backend()) {}
  // Calls of any thread inside this handle (Pinned): mncl_comm_destroy sets `closing`, then
  // waits for them to leave before it frees anything they use; a call that pins once
  // `closing` is set is refused. A handle's memory is never freed (retire()), so that a call
  // that found it live an instant before destroy began may still pin it, and be refused. On a
  // line of their own: every call of every thread on this communicator writes `calls`.
  alignas(64) std::atomic<int> calls{0};
  std::atomic<bool> closing{false};
  // Shared with a mncl_comm_abort running on another thread, which may outlast the handle.
  alignas(64) std::shared_ptr<mncl::core::Comm> impl;
  // What mncl_comm_rank, _size and _backend answer without pinning (the name outlives the
  // communicator).
  const int rank, size;
  const std::string backend;
  mncl_comm *retired_next = nullptr;  // see retire()
  // Keep the handle this small: every byte of it is kept for each communicator ever made.
};
struct mncl_request {
  std::shared_ptr<mncl::core::Operation> op;
  // Not the handle, which mncl_comm_destroy frees (and a later mncl_comm_create may reuse):
  // expired once the communicator is gone, by when destroy has ended every operation it issued.
  std::weak_ptr<mncl::core::Comm> comm;
  // Set when the operation runs as another (gatherv as alltoallv): prefixes its error message.
  std::string runs_as;
  // A thread is in mncl_test / mncl_wait on it (under g_handles_mutex): a second one is refused,
  // since the first may free the request under it.
  bool claimed = false;
};

namespace {

using mncl::Error;
using mncl::format;

// Live handles, so a stale or garbage handle is refused instead of dereferenced.
std::mutex g_handles_mutex;
std::unordered_set<const void *> g_comms;
std::unordered_set<const void *> g_destroying;  // in g_comms, inside mncl_comm_destroy
// Requests by handle. A handle is a number from a counter, never an address: it is never
// reused, so a completed request's handle is refused for good instead of naming a later request
// that happened to get the same memory (a caller telling a wait that ran out of time from an
// operation that timed out relies on that: see mncl_wait).
std::unordered_map<uintptr_t, std::unique_ptr<mncl_request>> g_requests;
uintptr_t g_last_request = 0;

void track(std::unordered_set<const void *> &set, const void *p) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  set.insert(p);
}
// Bumped whenever a handle dies: a thread's cached "this comm is live" answer holds while the
// count is unchanged, so the hot path skips the lock and the hash lookup.
std::atomic<uint64_t> g_deaths{0};
thread_local const void *t_live_comm = nullptr;
thread_local uint64_t t_live_deaths = 0;

void untrack(std::unordered_set<const void *> &set, const void *p) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  set.erase(p);
  g_deaths.fetch_add(1, std::memory_order_release);
}

// Live and not being destroyed: every call but mncl_comm_abort (comm_ref) needs that.
bool comm_is_live(const void *comm) {
  const uint64_t deaths = g_deaths.load(std::memory_order_acquire);
  if (comm == t_live_comm && deaths == t_live_deaths) return true;
  {
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    if (g_comms.count(comm) == 0 || g_destroying.count(comm) != 0) return false;
  }
  t_live_comm = comm;
  t_live_deaths = deaths;
  return true;
}

// A live communicator, held for the length of a call: mncl_comm_destroy on another thread waits
// for it to be let go before it frees the communicator (each call ends by its own timeout, or
// at once after mncl_comm_abort).
// A handle this library made and has not destroyed (its memory, never freed, may be read).
mncl_comm &live_handle(mncl_comm_t comm, const char *fn) {
  MNCL_CHECK(comm != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  MNCL_CHECK(comm_is_live(comm), MNCL_ERR_INVALID_ARGUMENT,
             "%s: comm %p is not a live communicator (destroyed, being destroyed, or never "
             "created)",
             fn, static_cast<void *>(comm));
  return *comm;
}

class Pinned {
 public:
  Pinned(mncl_comm_t comm, const char *fn) : handle_(comm) {
    live_handle(comm, fn);
    // Sequentially consistent, as destroy's store of `closing` and load of `calls`: either
    // destroy sees this call inside, or this call sees destroy begun. The check above may have
    // used an answer cached just before destroy began; the handle is still this library's.
    comm->calls.fetch_add(1);
    if (comm->closing.load()) {
      comm->calls.fetch_sub(1);
      throw Error(MNCL_ERR_INVALID_ARGUMENT,
                  format("%s: comm %p is being destroyed (by another thread)", fn,
                         static_cast<void *>(comm)));
    }
    comm_ = comm->impl.get();
  }
  ~Pinned() { handle_->calls.fetch_sub(1); }
  Pinned(const Pinned &) = delete;
  Pinned &operator=(const Pinned &) = delete;
  mncl::core::Comm *operator->() const { return comm_; }
  mncl::core::Comm &operator*() const { return *comm_; }

 private:
  mncl_comm_t handle_;
  mncl::core::Comm *comm_ = nullptr;
};

Pinned comm_of(mncl_comm_t comm, const char *fn) {
  return Pinned(comm, fn);
}

// Handles destroyed: kept (reachable from this list, for leak checkers) instead of freed; see
// mncl_comm. About 200 bytes each; linked through the handles, so that keeping one never fails.
mncl_comm *g_retired = nullptr;
void retire(mncl_comm_t handle) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  handle->retired_next = g_retired;
  g_retired = handle;
}

// For calls that may come from any thread at any time (mncl_comm_abort): a reference taken
// under the registry's lock keeps the communicator alive even if another thread's
// mncl_comm_destroy frees the handle meanwhile.
std::shared_ptr<mncl::core::Comm> comm_ref(mncl_comm_t comm, const char *fn) {
  MNCL_CHECK(comm != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  MNCL_CHECK(g_comms.count(comm) != 0, MNCL_ERR_INVALID_ARGUMENT,
             "%s: comm %p is not a live communicator (destroyed, or never created)", fn,
             static_cast<void *>(comm));
  return comm->impl;
}

template <typename T>
void require_out(T *out, const char *fn, const char *name) {
  MNCL_CHECK(out != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
}

// Runs body; on failure records the message and returns the status. Nothing escapes.
// mncl_last_error() is the last *failed* call's message (mncl.h), as errno: a call that
// succeeds leaves it as it was, though the plugin calls inside clear it to read their own.
// A body may return a status of its own (mncl_test, mncl_wait: the operation's, its message
// set); a failure it returns keeps its message.
template <typename Body>
mncl_status_t guard(Body &&body) noexcept {
  try {
    const std::string before = mncl::last_error();  // "" (no allocation) but after a failure
    mncl_status_t status = MNCL_OK;
    if constexpr (std::is_void_v<decltype(body())>) {
      body();
    } else {
      status = body();
    }
    if (status == MNCL_OK) mncl::set_last_error(before);
    return status;
  } catch (const Error &e) {
    mncl::set_last_error(e.what());
    // The application receives the message; the log keeps it for MNCL_DEBUG=info runs.
    MNCL_INFO("%s: %s", mncl::status_name(e.status()), e.what());
    return e.status();
  } catch (const std::bad_alloc &) {
    mncl::set_last_error("out of memory");
    return MNCL_ERR_SYSTEM;
  } catch (const std::system_error &e) {
    // The system refused a resource (a thread: EAGAIN at the process limit, a mutex).
    mncl::set_last_error(
        format("system error: %s (the system refused a resource: a thread, at "
               "a limit on processes or threads, ulimit -u or a container's "
               "pids limit, or memory)",
               e.what()));
    return MNCL_ERR_SYSTEM;
  } catch (const std::exception &e) {
    mncl::set_last_error(format("internal error: %s", e.what()));
    return MNCL_ERR_INTERNAL;
  } catch (...) {
    mncl::set_last_error("internal error: unknown exception");
    return MNCL_ERR_INTERNAL;
  }
}

mncl_coll_v1_t make_coll(int kind, const void *sendbuf, void *recvbuf, size_t count,
                         mncl_dtype_t dtype, int op, int root, void *stream) {
  mncl_coll_v1_t c = mncl::kit::make_coll(kind, dtype, op, root, sendbuf, recvbuf, count);
  c.stream = stream;
  return c;
}

// A non-blocking call's messages name it (mncl_iallreduce), not the collective the core
// checked and ran, whose messages begin with the blocking function's name (mncl_allreduce).
// Batches are left alone: mncl_isendrecv runs as one as well.
std::string as_nonblocking(std::string message, int kind) {
  const char *blocking = mncl::core::coll_function_name(kind);
  const size_t n = std::strlen(blocking);
  const bool named = kind != MNCL_COLL_SENDRECV_BATCH && message.compare(0, n, blocking) == 0 &&
                     (message.size() == n || message[n] == ':' || message[n] == ' ');
  if (named) message.insert(std::strlen("mncl_"), "i");
  return message;
}
// The status of a non-blocking call, its message (if it failed) naming it.
mncl_status_t named_nonblocking(int kind, mncl_status_t status) {
  if (status != MNCL_OK) mncl::set_last_error(as_nonblocking(mncl::last_error(), kind));
  return status;
}

mncl_status_t run_blocking(mncl_comm_t comm, const mncl_coll_v1_t &coll) {
  return guard([&] { comm_of(comm, mncl::core::coll_function_name(coll.kind))->run(coll); });
}

// Hands a started operation to the caller as a request handle.
void issue(mncl_comm_t comm, std::shared_ptr<mncl::core::Operation> op, mncl_request_t *request,
           std::string runs_as = std::string()) {
  auto state = std::make_unique<mncl_request>();
  state->op = std::move(op);
  state->comm = comm->impl;  // comm was found live by the call that started op
  state->runs_as = std::move(runs_as);
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  const uintptr_t id = ++g_last_request;
  g_requests.emplace(id, std::move(state));
  *request = reinterpret_cast<mncl_request_t>(id);
}

// The pending request behind a handle, claimed for this thread (release() when done with it);
// throws INVALID_ARGUMENT for a handle that is not pending or that another thread is waiting on.
mncl_request *claim(mncl_request_t handle, const char *fn) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  const auto it = g_requests.find(reinterpret_cast<uintptr_t>(handle));
  MNCL_CHECK(it != g_requests.end(), MNCL_ERR_INVALID_ARGUMENT,
             "%s: request %p is not pending (already completed, or never issued)", fn,
             static_cast<void *>(handle));
  MNCL_CHECK(!it->second->claimed, MNCL_ERR_INVALID_ARGUMENT,
             "%s: request %p is being tested or waited on by another thread", fn,
             static_cast<void *>(handle));
  it->second->claimed = true;
  return it->second.get();
}
void release(mncl_request *request) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  request->claimed = false;
}

mncl_status_t run_nonblocking(mncl_comm_t comm, const mncl_coll_v1_t &coll,
                              mncl_request_t *request) {
  return named_nonblocking(coll.kind, guard([&] {
                             const char *fn = mncl::core::coll_function_name(coll.kind);
                             require_out(request, fn, "request");
                             *request = nullptr;
                             issue(comm, comm_of(comm, fn)->start(coll), request);
                           }));
}

// Completes a finished request: frees it and returns the operation's status, its message set.
// Anything that may throw comes before the request is freed.
mncl_status_t finish(mncl_request_t handle, mncl_request *request) {
  const mncl::core::Operation &op = *request->op;
  if (op.status != MNCL_OK) {  // (a request comes from a non-blocking call)
    mncl::set_last_error(request->runs_as.empty() ? as_nonblocking(op.error, op.coll.kind)
                                                  : request->runs_as + ": " + op.error);
  }
  const mncl_status_t status = op.status;
  std::unique_ptr<mncl_request> gone;  // freed after the lock
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  const auto it = g_requests.find(reinterpret_cast<uintptr_t>(handle));
  gone = std::move(it->second);
  g_requests.erase(it);
  return status;
}

// Polls or waits for a request's operation. A request that outlived its communicator is
// answered from its recorded result (destroy ends every operation first).
bool await(mncl_request *request, int64_t timeout_ms, const char *fn) {
  if (mncl::core::settle(*request->op)) return true;
  // A reference, not the handle: the communicator stays whole while this call uses it, even
  // if another thread destroys it meanwhile.
  const std::shared_ptr<mncl::core::Comm> comm = request->comm.lock();
  if (comm == nullptr) {
    // Destroyed meanwhile (on another thread, since settle() above): destroy ends every
    // operation before the communicator goes, so this one has its result now.
    MNCL_CHECK(mncl::core::settle(*request->op), MNCL_ERR_INTERNAL,
               "%s: the request's communicator was destroyed, yet its operation has no result", fn);
    return true;
  }
  return comm->wait(*request->op, timeout_ms);
}

}  // namespace

extern "C" {

MNCL_API int mncl_get_version(void) {
  return MNCL_VERSION;
}

MNCL_API const char *mncl_status_string(mncl_status_t status) {
  switch (status) {
    case MNCL_OK:
      return "MNCL_OK: success";
    case MNCL_ERR_INVALID_ARGUMENT:
      return "MNCL_ERR_INVALID_ARGUMENT: invalid argument";
    case MNCL_ERR_NOT_SUPPORTED:
      return "MNCL_ERR_NOT_SUPPORTED: not supported by this backend";
    case MNCL_ERR_TIMEOUT:
      return "MNCL_ERR_TIMEOUT: operation timed out";
    case MNCL_ERR_REMOTE:
      return "MNCL_ERR_REMOTE: a peer failed or disconnected";
    case MNCL_ERR_ABORTED:
      return "MNCL_ERR_ABORTED: communicator aborted";
    case MNCL_ERR_PLUGIN:
      return "MNCL_ERR_PLUGIN: no usable backend plugin";
    case MNCL_ERR_BOOTSTRAP:
      return "MNCL_ERR_BOOTSTRAP: rendezvous failed";
    case MNCL_ERR_SYSTEM:
      return "MNCL_ERR_SYSTEM: system error";
    case MNCL_ERR_INTERNAL:
      return "MNCL_ERR_INTERNAL: internal error";
    case MNCL_IN_PROGRESS:
      return "MNCL_IN_PROGRESS: operation in progress";
  }
  return "MNCL_ERR_UNKNOWN: unknown status code";
}

MNCL_API const char *mncl_last_error(void) {
  return mncl::last_error();
}

// One table for the API and the plugins: the plugin kit's.
MNCL_API size_t mncl_dtype_size(mncl_dtype_t dtype) {
  return mncl::kit::dtype_size(dtype);
}

MNCL_API const char *mncl_dtype_name(mncl_dtype_t dtype) {
  return mncl::kit::dtype_name(dtype);
}

MNCL_API const char *mncl_op_name(mncl_op_t op) {
  return mncl::kit::op_name(op);
}

// --- communicators ---------------------------------------------------------------------------

namespace {
// Hands a split's new communicator (NULL for MNCL_SPLIT_NONE) to the caller as a handle.
void adopt_child(std::unique_ptr<mncl::core::Comm> child, mncl_comm_t *newcomm) {
  if (!child) return;
  auto handle = std::make_unique<mncl_comm>(std::move(child));
  track(g_comms, handle.get());
  *newcomm = handle.release();
}
}  // namespace

MNCL_API mncl_status_t mncl_comm_create(const mncl_config_t *config, mncl_comm_t *comm) {
  return guard([&] {
    require_out(comm, "mncl_comm_create", "comm");
    *comm = nullptr;
    auto handle = std::make_unique<mncl_comm>(mncl::core::Comm::create(config));
    track(g_comms, handle.get());
    *comm = handle.release();
  });
}

MNCL_API mncl_status_t mncl_comm_destroy(mncl_comm_t comm) {
  return guard([&] {
    comm_of(comm, "mncl_comm_destroy");  // the usual messages for NULL and dead handles
    std::shared_ptr<mncl::core::Comm> c;
    {
      // From here only mncl_comm_abort still takes the handle (comm_ref), so that another
      // thread can cut destroy short (mncl.h: "at any time"); every other call, a second
      // destroy included, is refused. The handle is freed whatever destroy() reports. Checked
      // again under the lock: another thread's destroy may have freed it since.
      std::lock_guard<std::mutex> lock(g_handles_mutex);
      MNCL_CHECK(g_comms.count(comm) != 0, MNCL_ERR_INVALID_ARGUMENT,
                 "mncl_comm_destroy: comm %p is not a live communicator (destroyed by another "
                 "thread)",
                 static_cast<void *>(comm));
      MNCL_CHECK(g_destroying.insert(comm).second, MNCL_ERR_INVALID_ARGUMENT,
                 "mncl_comm_destroy: comm %p is being destroyed by another thread",
                 static_cast<void *>(comm));
      g_deaths.fetch_add(1, std::memory_order_release);  // drops cached liveness answers
      c = comm->impl;
    }
    comm->closing.store(true);  // see Pinned: calls that pin from now on are refused
    struct Release {
      mncl_comm_t handle;
      const std::shared_ptr<mncl::core::Comm> &comm;
      ~Release() {
        {
          std::lock_guard<std::mutex> lock(g_handles_mutex);
          g_destroying.erase(handle);
        }
        untrack(g_comms, handle);
        // The Comm lives on while an abort still holds it (comm_ref); calls that outlasted
        // destroy's wait may still read the handle's reference.
        if (!comm->callers_left()) handle->impl.reset();
        retire(handle);
      }
    } release{comm, c};
    // Kept for good where calls of other threads outlived destroy's wait for them: they still
    // use the Comm (its backend communicator was not freed either).
    struct KeepIfInUse {
      const std::shared_ptr<mncl::core::Comm> &comm;
      ~KeepIfInUse() {
        if (comm->callers_left()) new std::shared_ptr<mncl::core::Comm>(comm);
      }
    } keep{c};
    c->destroy(&comm->calls);
    MNCL_CHECK(!c->callers_left(), MNCL_ERR_TIMEOUT,
               "mncl_comm_destroy: calls of other threads on this communicator did not return "
               "within its timeout (+30 s); it was left to the process's exit (see the log)");
  });
}

MNCL_API mncl_status_t mncl_comm_abort(mncl_comm_t comm) {
  return guard([&] { comm_ref(comm, "mncl_comm_abort")->abort(); });
}

MNCL_API mncl_status_t mncl_comm_split(mncl_comm_t comm, int color, int key, mncl_comm_t *newcomm) {
  return guard([&] {
    // A NULL newcomm fails the split on every rank (Comm::split_impl), not on this one alone.
    if (newcomm != nullptr) *newcomm = nullptr;
    adopt_child(comm_of(comm, "mncl_comm_split")
                    ->split(color, key, nullptr, "mncl_comm_split", newcomm != nullptr),
                newcomm);
  });
}

MNCL_API mncl_status_t mncl_comm_split_config(mncl_comm_t comm, int color, int key,
                                              const mncl_config_t *config, mncl_comm_t *newcomm) {
  return guard([&] {
    if (newcomm != nullptr) *newcomm = nullptr;
    adopt_child(comm_of(comm, "mncl_comm_split_config")
                    ->split(color, key, config, "mncl_comm_split_config", newcomm != nullptr),
                newcomm);
  });
}

MNCL_API mncl_status_t mncl_comm_split_type(mncl_comm_t comm, mncl_split_type_t type, int key,
                                            const mncl_config_t *config, mncl_comm_t *newcomm) {
  // A C caller may pass any int: read the bits, as reading an out-of-range value through the
  // C++ enum type is undefined (and UBSan says so).
  int raw_type = 0;
  static_assert(sizeof type == sizeof raw_type, "mncl_split_type_t is int-sized");
  std::memcpy(&raw_type, &type, sizeof raw_type);
  return guard([&] {
    if (newcomm != nullptr) *newcomm = nullptr;
    adopt_child(comm_of(comm, "mncl_comm_split_type")
                    ->split_type(raw_type, key, config, newcomm != nullptr),
                newcomm);
  });
}

MNCL_API mncl_status_t mncl_comm_rank(mncl_comm_t comm, int *rank) {
  return guard([&] {
    require_out(rank, "mncl_comm_rank", "rank");
    *rank = live_handle(comm, "mncl_comm_rank").rank;
  });
}

MNCL_API mncl_status_t mncl_comm_size(mncl_comm_t comm, int *size) {
  return guard([&] {
    require_out(size, "mncl_comm_size", "size");
    *size = live_handle(comm, "mncl_comm_size").size;
  });
}

MNCL_API mncl_status_t mncl_comm_host_info(mncl_comm_t comm, int *local_rank, int *local_size,
                                           int *host_index, int *num_hosts) {
  return guard([&] {
    // Pinned, not from the handle: a handle is kept for good once destroyed (retire()), so
    // every byte added to it is kept per communicator ever made (fault.leak_cycles).
    const mncl::core::Comm::HostInfo hosts = comm_of(comm, "mncl_comm_host_info")->host_info();
    if (local_rank != nullptr) *local_rank = hosts.local_rank;
    if (local_size != nullptr) *local_size = hosts.local_size;
    if (host_index != nullptr) *host_index = hosts.host_index;
    if (num_hosts != nullptr) *num_hosts = hosts.num_hosts;
  });
}

MNCL_API mncl_status_t mncl_comm_backend(mncl_comm_t comm, const char **name) {
  return guard([&] {
    require_out(name, "mncl_comm_backend", "name");
    *name = live_handle(comm, "mncl_comm_backend").backend.c_str();
  });
}

// --- blocking collectives --------------------------------------------------------------------

MNCL_API mncl_status_t mncl_allreduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t count, mncl_dtype_t dtype, mncl_op_t op,
                                      void *stream) {
  return run_blocking(
      comm, make_coll(MNCL_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1, stream));
}

MNCL_API mncl_status_t mncl_reduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                   size_t count, mncl_dtype_t dtype, mncl_op_t op, int root,
                                   void *stream) {
  return run_blocking(
      comm, make_coll(MNCL_COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, stream));
}

MNCL_API mncl_status_t mncl_bcast(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                  int root, void *stream) {
  return run_blocking(comm, make_coll(MNCL_COLL_BCAST, buf, buf, count, dtype, -1, root, stream));
}

MNCL_API mncl_status_t mncl_scatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                    size_t count, mncl_dtype_t dtype, int root, void *stream) {
  return run_blocking(
      comm, make_coll(MNCL_COLL_SCATTER, sendbuf, recvbuf, count, dtype, -1, root, stream));
}

MNCL_API mncl_status_t mncl_gather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                   size_t count, mncl_dtype_t dtype, int root, void *stream) {
  return run_blocking(
      comm, make_coll(MNCL_COLL_GATHER, sendbuf, recvbuf, count, dtype, -1, root, stream));
}

MNCL_API mncl_status_t mncl_allgather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t count, mncl_dtype_t dtype, void *stream) {
  return run_blocking(
      comm, make_coll(MNCL_COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, -1, -1, stream));
}

MNCL_API mncl_status_t mncl_reduce_scatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                           size_t recvcount, mncl_dtype_t dtype, mncl_op_t op,
                                           void *stream) {
  return run_blocking(comm, make_coll(MNCL_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype,
                                      op, -1, stream));
}

MNCL_API mncl_status_t mncl_alltoall(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                     size_t count, mncl_dtype_t dtype, void *stream) {
  return run_blocking(
      comm, make_coll(MNCL_COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, -1, -1, stream));
}

MNCL_API mncl_status_t mncl_barrier(mncl_comm_t comm, void *stream) {
  return run_blocking(
      comm, make_coll(MNCL_COLL_BARRIER, nullptr, nullptr, 0, MNCL_UINT8, -1, -1, stream));
}

MNCL_API mncl_status_t mncl_send(mncl_comm_t comm, const void *buf, size_t count,
                                 mncl_dtype_t dtype, int peer, void *stream) {
  return run_blocking(comm,
                      make_coll(MNCL_COLL_SEND, buf, nullptr, count, dtype, -1, peer, stream));
}

MNCL_API mncl_status_t mncl_recv(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                 int peer, void *stream) {
  return run_blocking(comm,
                      make_coll(MNCL_COLL_RECV, nullptr, buf, count, dtype, -1, peer, stream));
}

static mncl_coll_v1_t make_coalesced(const void *const *sendbufs, void *const *recvbufs,
                                     const size_t *counts, size_t nbufs, mncl_dtype_t dtype,
                                     mncl_op_t op, void *stream) {
  mncl_coll_v1_t c =
      make_coll(MNCL_COLL_ALLREDUCE_COALESCED, nullptr, nullptr, 0, dtype, op, -1, stream);
  c.nbufs = nbufs;
  c.sendbufs = sendbufs;
  c.recvbufs = recvbufs;
  c.counts = counts;
  return c;
}

MNCL_API mncl_status_t mncl_allreduce_coalesced(mncl_comm_t comm, const void *const *sendbufs,
                                                void *const *recvbufs, const size_t *counts,
                                                size_t nbufs, mncl_dtype_t dtype, mncl_op_t op,
                                                void *stream) {
  return run_blocking(comm, make_coalesced(sendbufs, recvbufs, counts, nbufs, dtype, op, stream));
}

// allgatherv / alltoallv: the per-rank arrays are packed into one, as plugin ABI v3 carries
// them (mncl_plugin_v3.h); start() keeps its own copy for non-blocking calls.
struct VArrays {
  const size_t *a, *b, *c, *d;  // allgatherv: recvcounts, displs; alltoallv: all four
  const char *names[4];
};

mncl_status_t run_v(mncl_comm_t comm, int kind, const void *sendbuf, size_t sendcount,
                    void *recvbuf, const VArrays &arrays, mncl_dtype_t dtype, void *stream,
                    mncl_request_t *request) {
  const mncl_status_t status = guard([&] {
    const char *fn = mncl::core::coll_function_name(kind);
    if (request != nullptr) *request = nullptr;
    const Pinned pinned = comm_of(comm, fn);
    auto &c = *pinned;
    const int narrays = kind == MNCL_COLL_ALLGATHERV ? 2 : 4;
    const size_t *in[4] = {arrays.a, arrays.b, arrays.c, arrays.d};
    const size_t size = static_cast<size_t>(c.size());
    std::vector<size_t> packed;
    packed.reserve(size * static_cast<size_t>(narrays));
    for (int k = 0; k < narrays; ++k) {
      MNCL_CHECK(in[k] != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                 arrays.names[k]);
      packed.insert(packed.end(), in[k], in[k] + size);
    }
    mncl_coll_v1_t coll =
        mncl::kit::make_v_coll(kind, dtype, sendbuf, recvbuf, sendcount, c.size(), packed.data());
    coll.stream = stream;
    if (request == nullptr) {
      c.run(coll);
      return;
    }
    issue(comm, c.start(coll), request);
  });
  return request != nullptr ? named_nonblocking(kind, status) : status;
}

mncl_status_t run_allgatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                             const size_t *recvcounts, const size_t *displs, mncl_dtype_t dtype,
                             void *stream, mncl_request_t *request) {
  return run_v(comm, MNCL_COLL_ALLGATHERV, sendbuf, sendcount, recvbuf,
               {recvcounts, displs, nullptr, nullptr, {"recvcounts", "displs", "", ""}}, dtype,
               stream, request);
}

mncl_status_t run_alltoallv(mncl_comm_t comm, const void *sendbuf, const size_t *sendcounts,
                            const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                            const size_t *rdispls, mncl_dtype_t dtype, void *stream,
                            mncl_request_t *request) {
  return run_v(comm, MNCL_COLL_ALLTOALLV, sendbuf, 0, recvbuf,
               {sendcounts,
                sdispls,
                recvcounts,
                rdispls,
                {"sendcounts", "sdispls", "recvcounts", "rdispls"}},
               dtype, stream, request);
}

// gatherv / scatterv: a backend with the plugin ABI v5 kinds runs them itself; on any other the
// call is checked in its own terms, then run as an alltoallv whose only non-empty pairs involve
// the root (core/validate.h). Errors of that alltoallv are prefixed with "<fn> (run as an
// alltoallv)", so the caller sees which call they belong to. `nonblocking`: the mncl_i* form,
// which needs `request`.
mncl_status_t run_rooted_v(const char *fn, mncl_comm_t comm, const mncl::core::RootedV &call,
                           void *stream, mncl_request_t *request, bool nonblocking) {
  return guard([&] {
    if (nonblocking) require_out(request, fn, "request");
    if (request != nullptr) *request = nullptr;
    const Pinned pinned = comm_of(comm, fn);
    auto &c = *pinned;
    c.check_usable(fn);
    const int kind = call.gather ? MNCL_COLL_GATHERV : MNCL_COLL_SCATTERV;
    if (c.table().coll_mask & MNCL_COLL_BIT(kind)) {
      const bool is_root = c.rank() == call.root;
      // The root's two arrays, packed as plugin ABI v5 carries them (start() copies them).
      std::vector<size_t> packed;
      if (is_root && call.counts != nullptr && call.displs != nullptr) {
        packed.assign(call.counts, call.counts + c.size());
        packed.insert(packed.end(), call.displs, call.displs + c.size());
      }
      // The checks in the caller's terms (NULL arrays on the root included) before the
      // descriptor is built; Comm's own validation of the descriptor repeats them.
      mncl::core::check_rooted_v(fn, call, c.rank(), c.size(), c.table());
      mncl_coll_v1_t coll =
          mncl::kit::make_rooted_v_coll(kind, call.dtype, call.sendbuf, call.recvbuf, call.count,
                                        call.root, c.size(), is_root ? packed.data() : nullptr);
      coll.stream = stream;
      if (!nonblocking) {
        c.run(coll);
        return;
      }
      issue(comm, c.start(coll), request);
      return;
    }
    const mncl::core::AlltoallvForm form =
        mncl::core::rooted_v_as_alltoallv(fn, call, c.rank(), c.size(), c.table());
    mncl_coll_v1_t coll = mncl::kit::make_v_coll(MNCL_COLL_ALLTOALLV, call.dtype, form.sendbuf,
                                                 form.recvbuf, 0, c.size(), form.packed.data());
    coll.stream = stream;
    const std::string runs_as = std::string(fn) + " (run as an alltoallv)";
    try {
      if (!nonblocking) {
        c.run(coll);
        return;
      }
      issue(comm, c.start(coll), request, runs_as);
    } catch (const Error &e) {
      throw Error(e.status(), runs_as + ": " + e.what());
    }
  });
}

mncl::core::RootedV gatherv_call(const void *sendbuf, size_t sendcount, void *recvbuf,
                                 const size_t *recvcounts, const size_t *displs, mncl_dtype_t dtype,
                                 int root) {
  return {true, sendbuf, recvbuf, sendcount, recvcounts, displs, dtype, root};
}

mncl::core::RootedV scatterv_call(const void *sendbuf, const size_t *sendcounts,
                                  const size_t *displs, void *recvbuf, size_t recvcount,
                                  mncl_dtype_t dtype, int root) {
  return {false, sendbuf, recvbuf, recvcount, sendcounts, displs, dtype, root};
}

MNCL_API mncl_status_t mncl_gatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                    void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                    mncl_dtype_t dtype, int root, void *stream) {
  return run_rooted_v("mncl_gatherv", comm,
                      gatherv_call(sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, root),
                      stream, nullptr, false);
}

MNCL_API mncl_status_t mncl_scatterv(mncl_comm_t comm, const void *sendbuf,
                                     const size_t *sendcounts, const size_t *displs, void *recvbuf,
                                     size_t recvcount, mncl_dtype_t dtype, int root, void *stream) {
  return run_rooted_v("mncl_scatterv", comm,
                      scatterv_call(sendbuf, sendcounts, displs, recvbuf, recvcount, dtype, root),
                      stream, nullptr, false);
}

MNCL_API mncl_status_t mncl_igatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                     void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                     mncl_dtype_t dtype, int root, void *stream,
                                     mncl_request_t *request) {
  return run_rooted_v("mncl_igatherv", comm,
                      gatherv_call(sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, root),
                      stream, request, true);
}

MNCL_API mncl_status_t mncl_iscatterv(mncl_comm_t comm, const void *sendbuf,
                                      const size_t *sendcounts, const size_t *displs, void *recvbuf,
                                      size_t recvcount, mncl_dtype_t dtype, int root, void *stream,
                                      mncl_request_t *request) {
  return run_rooted_v("mncl_iscatterv", comm,
                      scatterv_call(sendbuf, sendcounts, displs, recvbuf, recvcount, dtype, root),
                      stream, request, true);
}

MNCL_API mncl_status_t mncl_allgatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *displs, mncl_dtype_t dtype, void *stream) {
  return run_allgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, stream,
                        nullptr);
}

MNCL_API mncl_status_t mncl_alltoallv(mncl_comm_t comm, const void *sendbuf,
                                      const size_t *sendcounts, const size_t *sdispls,
                                      void *recvbuf, const size_t *recvcounts,
                                      const size_t *rdispls, mncl_dtype_t dtype, void *stream) {
  return run_alltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype,
                       stream, nullptr);
}

// --- non-blocking collectives ----------------------------------------------------------------

MNCL_API mncl_status_t mncl_iallgatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                        void *recvbuf, const size_t *recvcounts,
                                        const size_t *displs, mncl_dtype_t dtype, void *stream,
                                        mncl_request_t *request) {
  if (request == nullptr) {
    return guard([&] { require_out(request, "mncl_iallgatherv", "request"); });
  }
  return run_allgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, stream,
                        request);
}

MNCL_API mncl_status_t mncl_ialltoallv(mncl_comm_t comm, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls, mncl_dtype_t dtype, void *stream,
                                       mncl_request_t *request) {
  if (request == nullptr) {
    return guard([&] { require_out(request, "mncl_ialltoallv", "request"); });
  }
  return run_alltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype,
                       stream, request);
}

MNCL_API mncl_status_t mncl_iallreduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                       size_t count, mncl_dtype_t dtype, mncl_op_t op, void *stream,
                                       mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1, stream),
      request);
}

MNCL_API mncl_status_t mncl_ireduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                    size_t count, mncl_dtype_t dtype, mncl_op_t op, int root,
                                    void *stream, mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, stream), request);
}

MNCL_API mncl_status_t mncl_ibcast(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                   int root, void *stream, mncl_request_t *request) {
  return run_nonblocking(comm, make_coll(MNCL_COLL_BCAST, buf, buf, count, dtype, -1, root, stream),
                         request);
}

MNCL_API mncl_status_t mncl_iscatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                     size_t count, mncl_dtype_t dtype, int root, void *stream,
                                     mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_SCATTER, sendbuf, recvbuf, count, dtype, -1, root, stream),
      request);
}

MNCL_API mncl_status_t mncl_igather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                    size_t count, mncl_dtype_t dtype, int root, void *stream,
                                    mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_GATHER, sendbuf, recvbuf, count, dtype, -1, root, stream), request);
}

MNCL_API mncl_status_t mncl_iallgather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                       size_t count, mncl_dtype_t dtype, void *stream,
                                       mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, -1, -1, stream),
      request);
}

MNCL_API mncl_status_t mncl_ireduce_scatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                            size_t recvcount, mncl_dtype_t dtype, mncl_op_t op,
                                            void *stream, mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, -1, stream),
      request);
}

MNCL_API mncl_status_t mncl_ialltoall(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t count, mncl_dtype_t dtype, void *stream,
                                      mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, -1, -1, stream), request);
}

MNCL_API mncl_status_t mncl_ibarrier(mncl_comm_t comm, void *stream, mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_BARRIER, nullptr, nullptr, 0, MNCL_UINT8, -1, -1, stream), request);
}

MNCL_API mncl_status_t mncl_isend(mncl_comm_t comm, const void *buf, size_t count,
                                  mncl_dtype_t dtype, int peer, void *stream,
                                  mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_SEND, buf, nullptr, count, dtype, -1, peer, stream), request);
}

MNCL_API mncl_status_t mncl_irecv(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                  int peer, void *stream, mncl_request_t *request) {
  return run_nonblocking(
      comm, make_coll(MNCL_COLL_RECV, nullptr, buf, count, dtype, -1, peer, stream), request);
}

MNCL_API mncl_status_t mncl_iallreduce_coalesced(mncl_comm_t comm, const void *const *sendbufs,
                                                 void *const *recvbufs, const size_t *counts,
                                                 size_t nbufs, mncl_dtype_t dtype, mncl_op_t op,
                                                 void *stream, mncl_request_t *request) {
  return run_nonblocking(comm, make_coalesced(sendbufs, recvbufs, counts, nbufs, dtype, op, stream),
                         request);
}

}  // extern "C"

// --- batched point to point ------------------------------------------------------------------

namespace {

// The caller's ops as plugin ABI v4 ops, checking what only the public struct has: its size (the
// array's stride), its kind enum and its reserved field.
std::vector<mncl_p2p_v4_t> import_ops(const char *fn, const mncl_p2p_op_t *ops, size_t nops) {
  std::vector<mncl_p2p_v4_t> out;
  if (nops == 0) return out;
  MNCL_CHECK(ops != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: ops is NULL with nops = %zu", fn,
             nops);
  constexpr size_t kOwn = sizeof(mncl_p2p_op_t);
  const size_t stride = ops[0].struct_size;
  MNCL_CHECK(stride >= kOwn && stride <= (1u << 12), MNCL_ERR_INVALID_ARGUMENT,
             "%s: op 0: struct_size is %zu, not the size of an mncl_p2p_op_t (%zu bytes here); "
             "fill ops with mncl_p2p_op() or set struct_size = sizeof(mncl_p2p_op_t)",
             fn, stride, kOwn);
  MNCL_CHECK(nops <= SIZE_MAX / stride, MNCL_ERR_INVALID_ARGUMENT,
             "%s: nops %zu overflows the address space", fn, nops);
  out.reserve(nops);
  const auto *base = reinterpret_cast<const unsigned char *>(ops);
  for (size_t i = 0; i < nops; ++i) {
    const unsigned char *bytes = base + i * stride;
    mncl_p2p_op_t op;
    std::memcpy(&op, bytes, kOwn);
    MNCL_CHECK(op.struct_size == stride, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %zu: struct_size is %zu but op 0's is %zu; every op carries the same size, "
               "which is the array's stride",
               fn, i, op.struct_size, stride);
    // A newer caller's longer op: accepted only while the fields this library lacks are zero.
    for (size_t b = kOwn; b < stride; ++b) {
      MNCL_CHECK(bytes[b] == 0, MNCL_ERR_NOT_SUPPORTED,
                 "%s: op %zu sets fields unknown to this library (struct_size %zu, an "
                 "mncl_p2p_op_t here is %zu bytes, version %d); upgrade libmncl",
                 fn, i, stride, kOwn, MNCL_VERSION);
    }
    MNCL_CHECK(op.kind == MNCL_P2P_SEND || op.kind == MNCL_P2P_RECV, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %zu: kind %d is not an mncl_p2p_kind_t (MNCL_P2P_SEND 0, MNCL_P2P_RECV 1)",
               fn, i, op.kind);
    MNCL_CHECK(op.reserved0 == 0, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %zu: reserved0 is %d; it must be zero", fn, i, op.reserved0);
    mncl_p2p_v4_t v4{};
    v4.kind = op.kind == MNCL_P2P_SEND ? MNCL_COLL_SEND : MNCL_COLL_RECV;
    v4.peer = op.peer;
    v4.dtype = op.dtype;
    v4.buf = op.buf;
    v4.count = op.count;
    out.push_back(v4);
  }
  return out;
}

// Blocking (request NULL) or not: validates every op, starts them together, and for a blocking
// call waits for all of them.
mncl_status_t run_batch(const char *fn, mncl_comm_t comm, std::vector<mncl_p2p_v4_t> ops,
                        void *stream, mncl_request_t *request) {
  const Pinned pinned = comm_of(comm, fn);
  auto &c = *pinned;
  auto op = c.start_batch(fn, std::move(ops), stream, request == nullptr);
  if (request != nullptr) {
    issue(comm, std::move(op), request);
    return MNCL_OK;
  }
  c.wait(*op, -1);
  if (op->status != MNCL_OK) throw Error(op->status, op->error);
  return MNCL_OK;
}

mncl_status_t sendrecv_batch(const char *fn, mncl_comm_t comm, const mncl_p2p_op_t *ops,
                             size_t nops, void *stream, mncl_request_t *request, bool nonblocking) {
  return guard([&] {
    if (nonblocking) {
      require_out(request, fn, "request");
      *request = nullptr;
    }
    run_batch(fn, comm, import_ops(fn, ops, nops), stream, request);
  });
}

mncl_status_t sendrecv(const char *fn, mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                       int dest, void *recvbuf, size_t recvcount, int source, mncl_dtype_t dtype,
                       void *stream, mncl_request_t *request, bool nonblocking) {
  return guard([&] {
    if (nonblocking) {
      require_out(request, fn, "request");
      *request = nullptr;
    }
    std::vector<mncl_p2p_v4_t> ops(2);
    ops[0] = {MNCL_COLL_SEND, dest, dtype, 0, const_cast<void *>(sendbuf), sendcount, 0};
    ops[1] = {MNCL_COLL_RECV, source, dtype, 0, recvbuf, recvcount, 0};
    run_batch(fn, comm, std::move(ops), stream, request);
  });
}

}  // namespace

extern "C" {

MNCL_API mncl_status_t mncl_sendrecv_batch(mncl_comm_t comm, const mncl_p2p_op_t *ops, size_t nops,
                                           void *stream) {
  return sendrecv_batch("mncl_sendrecv_batch", comm, ops, nops, stream, nullptr, false);
}

MNCL_API mncl_status_t mncl_isendrecv_batch(mncl_comm_t comm, const mncl_p2p_op_t *ops, size_t nops,
                                            void *stream, mncl_request_t *request) {
  return sendrecv_batch("mncl_isendrecv_batch", comm, ops, nops, stream, request, true);
}

MNCL_API mncl_status_t mncl_sendrecv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                     int dest, void *recvbuf, size_t recvcount, int source,
                                     mncl_dtype_t dtype, void *stream) {
  return sendrecv("mncl_sendrecv", comm, sendbuf, sendcount, dest, recvbuf, recvcount, source,
                  dtype, stream, nullptr, false);
}

MNCL_API mncl_status_t mncl_isendrecv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                      int dest, void *recvbuf, size_t recvcount, int source,
                                      mncl_dtype_t dtype, void *stream, mncl_request_t *request) {
  return sendrecv("mncl_isendrecv", comm, sendbuf, sendcount, dest, recvbuf, recvcount, source,
                  dtype, stream, request, true);
}

// --- completion ------------------------------------------------------------------------------

// finish() runs inside guard() too: nothing it might throw crosses the C ABI.
MNCL_API mncl_status_t mncl_test(mncl_request_t request, int *done) {
  return guard([&]() -> mncl_status_t {
    require_out(done, "mncl_test", "done");
    *done = 0;
    MNCL_CHECK(request != nullptr, MNCL_ERR_INVALID_ARGUMENT, "mncl_test: request is NULL");
    mncl_request *state = claim(request, "mncl_test");
    bool finished = false;
    try {
      finished = await(state, 0, "mncl_test");
    } catch (...) {
      release(state);
      throw;
    }
    if (!finished) {
      release(state);
      return MNCL_OK;
    }
    *done = 1;
    return finish(request, state);
  });
}

MNCL_API mncl_status_t mncl_wait(mncl_request_t request, int64_t timeout_ms) {
  return guard([&]() -> mncl_status_t {
    MNCL_CHECK(request != nullptr, MNCL_ERR_INVALID_ARGUMENT, "mncl_wait: request is NULL");
    MNCL_CHECK(timeout_ms >= -1, MNCL_ERR_INVALID_ARGUMENT,
               "mncl_wait: timeout_ms %lld is negative (use -1 to wait until the operation ends)",
               static_cast<long long>(timeout_ms));
    mncl_request *state = claim(request, "mncl_wait");
    bool finished = false;
    try {
      finished = await(state, timeout_ms, "mncl_wait");
    } catch (...) {
      release(state);
      throw;
    }
    if (!finished) release(state);
    MNCL_CHECK(finished, MNCL_ERR_TIMEOUT,
               "mncl_wait: the operation did not finish within %lld ms (the request stays valid)",
               static_cast<long long>(timeout_ms));
    return finish(request, state);
  });
}

}  // extern "C"

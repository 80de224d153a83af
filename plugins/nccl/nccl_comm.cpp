#include "nccl/nccl_comm.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>

#include "common/coll.h"
#include "common/dtype.h"
#include "common/host.h"
#include "nccl/buffers.h"

namespace mncl::nccl {

namespace {

using Clock = std::chrono::steady_clock;
using kit::format;

ncclDataType_t nccl_dtype(int32_t dtype) {
  switch (dtype) {
    case MNCL_INT8:
      return ncclInt8;
    case MNCL_UINT8:
      return ncclUint8;
    case MNCL_INT32:
      return ncclInt32;
    case MNCL_UINT32:
      return ncclUint32;
    case MNCL_INT64:
      return ncclInt64;
    case MNCL_UINT64:
      return ncclUint64;
    case MNCL_FLOAT16:
      return ncclFloat16;
    case MNCL_BFLOAT16:
      return ncclBfloat16;
    case MNCL_FLOAT32:
      return ncclFloat32;
    default:
      return ncclFloat64;
  }
}

// MNCL_AVG is NCCL's ncclAvg: integer sums divided with truncation, as mncl.h defines it.
ncclRedOp_t nccl_op(int32_t op) {
  switch (op) {
    case MNCL_PROD:
      return ncclProd;
    case MNCL_MIN:
      return ncclMin;
    case MNCL_MAX:
      return ncclMax;
    case MNCL_AVG:
      return ncclAvg;
    default:
      return ncclSum;
  }
}

mncl_status_t status_of(ncclResult_t r) {
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return MNCL_ERR_INVALID_ARGUMENT;
    case ncclRemoteError:
    case ncclSystemError:
      return MNCL_ERR_REMOTE;  // a peer or the network went away
    case ncclUnhandledCudaError:
      return MNCL_ERR_SYSTEM;
    default:
      return MNCL_ERR_INTERNAL;
  }
}

void cuda_check(cudaError_t e, const char *call) {
  if (e != cudaSuccess) {
    throw kit::Error(MNCL_ERR_SYSTEM, format("nccl: %s failed: %s (%s)", call, cudaGetErrorName(e),
                                             cudaGetErrorString(e)));
  }
}

// Whether this thread has a current CUDA context, from the driver that the runtime loaded
// (the plugin does not link libcuda: it must load where there is none). Unknown: true. The
// lookup is made once (the first comm has initialized the runtime, which loads the driver):
// a dlopen per call, even RTLD_NOLOAD, searches the library path when it fails.
bool context_current() {
  using GetCurrent = int (*)(void **);
  static const GetCurrent get_current = []() -> GetCurrent {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return driver != nullptr ? reinterpret_cast<GetCurrent>(dlsym(driver, "cuCtxGetCurrent"))
                             : nullptr;
  }();
  if (get_current == nullptr) return true;
  void *context = nullptr;
  return get_current(&context) != 0 || context != nullptr;
}

// Makes the communicator's GPU current for the call and restores the caller's afterwards. A
// thread without a context gets none back: since CUDA 12, cudaSetDevice(0) there would create
// a context on GPU 0 (hundreds of MiB, refused in exclusive-process mode) in every rank.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (!context_current() || cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  int device_ = -1, previous_ = -1;
};

// A kit::Error's text without its "nccl: ", for messages that get it again (fail()).
const char *without_prefix(const char *message) {
  constexpr char kPrefix[] = "nccl: ";
  return std::strncmp(message, kPrefix, sizeof kPrefix - 1) == 0 ? message + sizeof kPrefix - 1
                                                                 : message;
}

// Where a buffer lives: host memory, managed memory (any GPU may use it), or the ordinal of
// the GPU whose memory it is.
constexpr int kHostMemory = -1, kManagedMemory = -2;
int memory_location(const void *ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-less error so later calls do not report it
    return kHostMemory;
  }
  if (attr.type == cudaMemoryTypeManaged) return kManagedMemory;
  return attr.type == cudaMemoryTypeDevice ? attr.device : kHostMemory;
}

}  // namespace

Pending::~Pending() {
  if (event != nullptr) cudaEventDestroy(event);
}

// ---------------------------------------------------------------------------------------------
// Creation and teardown
// ---------------------------------------------------------------------------------------------

Comm::Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host)
    : host_(host),
      rank_(bs.rank),
      size_(bs.size),
      device_(bs.device < 0 ? 0 : bs.device),
      timeout_ms_(bs.timeout_ms) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    throw kit::Error(MNCL_ERR_PLUGIN,
                     format("nccl: no CUDA device (cudaGetDeviceCount: %s)",
                            e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)));
  }
  if (device_ >= count && bs.local_size > count) {
    // Fewer GPUs visible than ranks on the host: each process was given its own subset
    // (CUDA_VISIBLE_DEVICES per task, as Slurm's --gpus-per-task does), so take ours in turn.
    // Ranks that really share a GPU are refused by NCCL's duplicate-GPU check at init.
    MNCL_KIT_LOG(host_, MNCL_LOG_INFO,
                 "rank %d: device %d of %d visible; using device %d (a per-process GPU set)", rank_,
                 device_, count, device_ % count);
    device_ %= count;
  }
  if (device_ >= count) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     format("nccl: rank %d was given CUDA device %d but this host has %d; set "
                            "MNCL_DEVICE (or config.device), or start at most %d ranks per host",
                            rank_, device_, count, count));
  }
  DeviceGuard guard(device_);

  // The unique id: made by rank 0, read by the others from the store; the last reader
  // deletes it (and its counter).
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  const mncl_store_v1_t &store = *bs.store;
  if (rank_ == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (size_ > 1) {
      if (mncl_status_t st = store.set(store.ctx, "id", &id, sizeof id)) throw kit::Error(st);
    }
  } else {
    void *value = nullptr;
    size_t len = 0;
    if (mncl_status_t st = store.get(store.ctx, "id", &value, &len, timeout_ms_)) {
      throw kit::Error(st);
    }
    const bool ok = len == sizeof id;
    if (ok) std::memcpy(&id, value, sizeof id);
    store.release(store.ctx, value);
    if (!ok) {
      throw kit::Error(
          MNCL_ERR_REMOTE,
          format("nccl: rank 0 published a %zu-byte NCCL id (expected %zu)", len, sizeof id));
    }
    int64_t readers = 0;
    if (mncl_status_t st = store.add(store.ctx, "id/n", 1, &readers)) throw kit::Error(st);
    if (readers == size_ - 1) {
      store.del(store.ctx, "id");
      store.del(store.ctx, "id/n");
    }
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; completion is polled with a deadline
  config.commName = bs.comm_id;
  try {
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      throw kit::Error(status_of(r),
                       format("nccl: ncclCommInitRankConfig failed: %s", ncclGetErrorString(r)));
    }
    wait_ready("ncclCommInitRankConfig", timeout_ms_);
    cuda_check(cudaMalloc(&barrier_buf_, sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemset(barrier_buf_, 0, sizeof(float)), "cudaMemset");
  } catch (...) {
    if (comm_ != nullptr && !nccl_aborted_.exchange(true)) ncclCommAbort(comm_);
    if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
    throw;
  }
  watchdog_ = std::thread([this] { watchdog_loop(); });
  MNCL_KIT_LOG(host_, MNCL_LOG_INFO, "comm '%s' rank %d of %d on CUDA device %d",
               bs.comm_id ? bs.comm_id : "?", rank_, size_, device_);
}

Comm::~Comm() {
  close();
  std::optional<DeviceGuard> guard;  // for the last abort and cudaFree
  try {
    guard.emplace(device_);
  } catch (const std::exception &) {
  }
  {
    // Also waits for an abort still running on another thread before the members go.
    std::unique_lock<std::shared_mutex> lock(comm_lock_);
    if (!nccl_aborted_.exchange(true)) ncclCommAbort(comm_);
  }
  if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
}

// The teardown's waiting part (kit::destroy_comm calls it before freeing): comm_abort from
// another thread ends it (fail() aborts the NCCL communicator, and every wait checks for that).
void Comm::close() {
  if (closed_) return;
  closed_ = true;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  try {
    DeviceGuard guard(device_);
    if (!failed_.load()) {
      // Let what is in flight finish (each wait is bounded), then leave NCCL cleanly.
      std::vector<std::shared_ptr<Pending>> left;
      {
        std::lock_guard<std::mutex> lock(pending_mutex_);
        left.swap(pending_);
      }
      for (const auto &op : left) wait(*op);
      ncclResult_t finalized = ncclInternalError;
      {
        std::shared_lock<std::shared_mutex> lock(comm_lock_);  // as every NCCL call (fail())
        check_usable("ncclCommFinalize");
        finalized = ncclCommFinalize(comm_);
      }
      check(finalized, "ncclCommFinalize");
      wait_ready("ncclCommFinalize", timeout_ms_);
      // Under the lock: an abort from another thread (allowed while we finalize) either ran
      // before, and then nothing is left to destroy, or finds the comm gone.
      std::unique_lock<std::shared_mutex> lock(comm_lock_);
      if (!nccl_aborted_.exchange(true)) ncclCommDestroy(comm_);
    }
  } catch (const std::exception &e) {
    MNCL_KIT_LOG(host_, MNCL_LOG_WARN, "rank %d: clean shutdown failed (%s); aborting", rank_,
                 e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Failure handling
// ---------------------------------------------------------------------------------------------

void Comm::fail(mncl_status_t status, const std::string &message) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failed_.load()) {
      failure_status_ = status;
      failure_ = message;
      failed_.store(true);
      MNCL_KIT_LOG(host_, MNCL_LOG_ERROR, "rank %d: %s; aborting the NCCL communicator", rank_,
                   message.c_str());
    }
  }
  // Ends kernels waiting for a dead peer; nothing else runs on the comm meanwhile. The flag is
  // taken under the lock, so that whoever saw it set can wait for the abort by taking the lock.
  std::unique_lock<std::shared_mutex> lock(comm_lock_);
  if (comm_ != nullptr && !nccl_aborted_.exchange(true)) ncclCommAbort(comm_);
}

void Comm::check_usable(const char *what) {
  if (!failed_.load()) return;
  std::lock_guard<std::mutex> lock(failure_mutex_);
  throw kit::Error(failure_status_, format("nccl %s: %s", what, failure_.c_str()));
}

void Comm::check(ncclResult_t result, const char *what) {
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) {
    wait_ready(what, timeout_ms_);
    return;
  }
  std::string detail;
  if (comm_ != nullptr && !nccl_aborted_.load()) {
    std::shared_lock<std::shared_mutex> lock(comm_lock_);
    if (!nccl_aborted_.load()) detail = ncclGetLastError(comm_);
  }
  const std::string message = format("%s failed: %s%s%s", what, ncclGetErrorString(result),
                                     detail.empty() ? "" : ": ", detail.c_str());
  const mncl_status_t status = status_of(result);
  // Even a usage error is final: a non-blocking comm keeps a failed group's error as its
  // asynchronous error, and the other ranks may have launched their part.
  if (comm_ != nullptr) fail(status, message);
  throw kit::Error(status, "nccl: " + message);
}

// ncclCommGetAsyncError; after ncclCommAbort (the comm is gone), ncclInternalError.
ncclResult_t Comm::async_state() {
  std::shared_lock<std::shared_mutex> lock(comm_lock_);
  if (nccl_aborted_.load()) return ncclInternalError;
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(comm_, &state);
  return state;
}

// Throws if the comm failed, or fails it (and throws) on an asynchronous NCCL error. Returns
// ncclSuccess or ncclInProgress.
ncclResult_t Comm::check_async(const char *what) {
  check_usable(what);
  const ncclResult_t state = async_state();
  if (state != ncclSuccess && state != ncclInProgress) {
    check_usable(what);  // aborted meanwhile: report that
    fail(status_of(state),
         format("%s: asynchronous NCCL error: %s", what, ncclGetErrorString(state)));
    check_usable(what);
  }
  return state;
}

void Comm::wait_ready(const char *what, int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::microseconds(5);
  while (check_async(what) != ncclSuccess) {
    if (Clock::now() >= deadline) {
      fail(MNCL_ERR_TIMEOUT, format("%s did not complete within %.1f s (a peer may have failed)",
                                    what, timeout_ms / 1000.0));
      check_usable(what);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void Comm::abort() {
  fail(MNCL_ERR_ABORTED,
       "the communicator was aborted (comm_abort: mncl_comm_abort, or the core's watchdog)");
}

void Comm::watchdog_loop() {
  cudaSetDevice(device_);  // event queries need the comm's device current on this thread
  // By default (global capture mode) an event query from any thread while the application's
  // thread captures a CUDA graph in global mode is an unsafe call: it fails and invalidates
  // that capture (PyTorch's NCCL watchdog had this bug). This thread never captures, so in
  // thread-local mode nothing restricts it, and its queries are safe: they are of events
  // recorded outside any capture (enqueue() records none in a capture).
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  cudaThreadExchangeStreamCaptureMode(&mode);
  for (;;) {
    std::string overdue;
    {
      std::unique_lock<std::mutex> lock(pending_mutex_);
      stop_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; });
      if (stopping_) return;
      const auto now = Clock::now();
      auto done = [&](const std::shared_ptr<Pending> &op) {
        const cudaError_t q = cudaEventQuery(op->event);
        if (q == cudaErrorNotReady) {
          if (overdue.empty() && now - op->start > std::chrono::milliseconds(op->timeout_ms)) {
            overdue = format(
                "%s #%llu did not complete on the GPU within %.1f s (a peer may "
                "have failed)",
                op->what, static_cast<unsigned long long>(op->seq), op->timeout_ms / 1000.0);
          }
          return false;
        }
        return true;  // finished (or failed: the async error check below reports it)
      };
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
    }
    if (!overdue.empty()) fail(MNCL_ERR_TIMEOUT, overdue);
    if (failed_.load()) continue;
    const ncclResult_t state = async_state();
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(status_of(state), format("asynchronous NCCL error: %s", ncclGetErrorString(state)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------------

void Comm::execute(const mncl_coll_v1_t &coll) {
  bool must_wait = false;
  auto op = enqueue(coll, &must_wait);
  if (op && must_wait) wait(*op);
}

std::shared_ptr<Pending> Comm::post(const mncl_coll_v1_t &coll) {
  bool must_wait = false;
  return enqueue(coll, &must_wait);  // a host-buffer op has completed already
}

namespace {
// Event queries on the application's thread, in thread-local capture mode for their duration:
// in the default global mode, a query while any other thread captures a CUDA graph in global
// mode is prohibited: it fails and invalidates that capture. The events queried here were
// recorded outside any capture (as the watchdog's, which runs in that mode throughout).
class ThreadLocalCaptureMode {
 public:
  ThreadLocalCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~ThreadLocalCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ThreadLocalCaptureMode(const ThreadLocalCaptureMode &) = delete;
  ThreadLocalCaptureMode &operator=(const ThreadLocalCaptureMode &) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeThreadLocal;
};
}  // namespace

bool Comm::test(const Pending &op) {
  if (op.captured) {
    // Recorded into the caller's CUDA graph: it runs when the graph is launched, and completes
    // with it (synchronize the launch stream). Nothing here can wait for it.
    check_usable(op.what);
    return true;
  }
  DeviceGuard guard(device_);
  cudaError_t q;
  {
    ThreadLocalCaptureMode mode;
    q = cudaEventQuery(op.event);
  }
  // Checked before success: an abort ends kernels early, so their events complete, but NCCL
  // promises nothing of the output of operations queued before an error.
  check_usable(op.what);
  if (q == cudaSuccess) {
    // An error the watchdog has not seen yet (it polls every 100 ms) may have cut the kernels
    // short too: the operation counts as done only on a comm without one.
    check_async(op.what);
    return true;
  }
  if (q != cudaErrorNotReady) cuda_check(q, "cudaEventQuery");
  if (Clock::now() - op.start > std::chrono::milliseconds(op.timeout_ms)) {
    fail(MNCL_ERR_TIMEOUT,
         format("%s #%llu did not complete within %.1f s (a peer may have "
                "failed)",
                op.what, static_cast<unsigned long long>(op.seq), op.timeout_ms / 1000.0));
    check_usable(op.what);
  }
  return false;
}

void Comm::wait(const Pending &op) {
  auto pause = std::chrono::microseconds(2);
  while (!test(op)) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

// Whether the caller is recording `stream` into a CUDA graph. An invalidated capture (an
// earlier call on the stream failed) is refused: NCCL would fail inside the group, and with it
// the communicator, for what is the caller's error.
bool Comm::capturing(cudaStream_t stream, const char *what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  if (status == cudaStreamCaptureStatusInvalidated) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     format("nccl %s: stream %p is in a CUDA graph capture that was invalidated "
                            "by an earlier failed call; end that capture first",
                            what, static_cast<void *>(stream)));
  }
  return status == cudaStreamCaptureStatusActive;
}

std::shared_ptr<Pending> Comm::enqueue(const mncl_coll_v1_t &coll, bool *must_wait) {
  const char *what = kit::kind_name(coll.kind);
  check_usable(what);
  if (kit::is_v_kind(coll.kind) &&
      (coll.counts == nullptr || coll.nbufs != static_cast<size_t>(size_))) {
    // The core never sends this; refused before anything reads the arrays or enters a group.
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     format("nccl %s: expected counts and displacements for %d ranks, got %s%zu",
                            what, size_, coll.counts == nullptr ? "none for " : "", coll.nbufs));
  }
  if (kit::is_rooted_v_kind(coll.kind)) {
    // The same: the root needs counts and displacements for every rank, the others none.
    const bool root = coll.root == rank_;
    if (coll.root < 0 || coll.root >= size_ || coll.nbufs != static_cast<size_t>(size_) ||
        (root && coll.counts == nullptr)) {
      throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                       format("nccl %s: expected a root in [0, %d) and, on the root, counts and "
                              "displacements for %d ranks; got root %d, %zu%s",
                              what, size_, size_, coll.root, coll.nbufs,
                              root && coll.counts == nullptr ? " (counts is NULL)" : ""));
    }
    if (root && coll.count != coll.counts[rank_]) {
      throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                       format("nccl %s: the root's own block is %zu elements but counts[%d] is %zu",
                              what, coll.count, rank_, coll.counts[rank_]));
    }
  }
  if (coll.kind == MNCL_COLL_SENDRECV_BATCH && coll.nbufs > 0 && coll.sendbuf == nullptr) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     format("nccl %s: %zu ops announced but none passed", what, coll.nbufs));
  }
  DeviceGuard guard(device_);
  auto stream = static_cast<cudaStream_t>(coll.stream);

  // Host buffers go through device scratch memory, allocated and freed in stream order.
  std::vector<Slot> host_slots;
  for_each_buffer(
      coll, rank_, size_, [&](size_t index, const void *ptr, size_t bytes, bool in, bool out) {
        if (bytes == 0) return;
        const int location = memory_location(ptr);
        if (location == kHostMemory) {
          host_slots.push_back(Slot{index, static_cast<const char *>(ptr), bytes, in, out});
        } else if (location >= 0 && location != device_) {
          // Refused here, before NCCL: its own refusal would come from inside the group and
          // fail the communicator.
          throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                           format("nccl %s: buffer %p is memory of CUDA device %d, but rank %d "
                                  "runs on device %d (NCCL takes one GPU per rank)",
                                  what, ptr, location, rank_, device_));
        }
      });
  const bool captured = capturing(stream, what);
  if (captured && !host_slots.empty()) {
    // Refused before anything is recorded: the capture stays valid.
    throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                     format("nccl %s: buffer %p is host memory, but stream %p is capturing a CUDA "
                            "graph: host buffers are staged with a copy back that the host "
                            "waits for, which a graph cannot hold; pass device memory",
                            what, static_cast<const void *>(host_slots.front().ptr),
                            static_cast<void *>(stream)));
  }
  CollCopy dev(coll);
  struct ScratchFree {  // stream-ordered, so it is safe even while the kernel still runs
    char *p;
    cudaStream_t s;
    ~ScratchFree() {
      if (p != nullptr) cudaFreeAsync(p, s);
    }
  } scratch{nullptr, stream};
  if (!host_slots.empty()) {
    const size_t total = plan_regions(host_slots);
    cuda_check(cudaMallocAsync(reinterpret_cast<void **>(&scratch.p), total, stream),
               "cudaMallocAsync");
    for (const Slot &s : host_slots) {
      dev.set(s.index, scratch.p + s.offset);
      if (s.in) {
        cuda_check(
            cudaMemcpyAsync(scratch.p + s.offset, s.ptr, s.bytes, cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync");
      }
    }
  }

  // Every launch is one NCCL group: inside it calls only record, and the single ncclGroupEnd
  // is where a non-blocking comm may answer ncclInProgress.
  auto free_temps = [&] {  // in stream order, after the kernels ncclGroupEnd enqueued
    for (void *t : inplace_temps_) cudaFreeAsync(t, stream);
    inplace_temps_.clear();
  };
  ncclResult_t r = ncclSuccess;
  try {
    copy_aside_inplace_alltoall(dev.coll, stream);  // outside the group: see there
    std::shared_lock<std::shared_mutex> lock(comm_lock_);
    check_usable(what);
    r = ncclGroupStart();
    if (r == ncclSuccess) {
      try {
        launch(dev.coll, stream);
      } catch (const kit::Error &e) {
        // The group may launch what was recorded: peers would wait for the rest, so the comm
        // fails now (fail() takes the lock exclusively).
        ncclGroupEnd();
        lock.unlock();
        fail(e.status(), without_prefix(e.what()));
        throw;
      }
      r = ncclGroupEnd();
    }
    lock.unlock();
    // With ncclInProgress, NCCL enqueues the group's kernels from its own thread: only once
    // check() has seen the comm ready may the temporaries' frees follow them on the stream.
    check(r, what);
  } catch (...) {
    free_temps();
    throw;
  }
  free_temps();

  auto op = std::make_shared<Pending>();
  op->seq = coll.seq;
  op->what = what;
  if (captured) {
    // No event and no watchdog entry: an event recorded in a capture cannot be queried
    // (cudaErrorCapturedEvent), and the operation only runs when the graph is launched, with
    // no deadline that could start now. A failure on a launch still reaches the watchdog as
    // NCCL's asynchronous error.
    op->captured = true;
    return op;
  }
  cuda_check(cudaEventCreateWithFlags(&op->event, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(op->event, stream), "cudaEventRecord");
  op->start = Clock::now();
  op->timeout_ms = coll.timeout_ms > 0 ? coll.timeout_ms : timeout_ms_;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    // Ops on a stream finish in order: drop the finished ones at the front now and then, so
    // the watchdog's list stays short even at millions of calls per second.
    if (pending_.size() >= 64) {
      ThreadLocalCaptureMode mode;
      size_t finished = 0;
      while (finished < pending_.size() &&
             cudaEventQuery(pending_[finished]->event) == cudaSuccess) {
        ++finished;
      }
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(finished));
    }
    pending_.push_back(op);
  }
  *must_wait = coll.kind == MNCL_COLL_BARRIER;
  if (!host_slots.empty()) {
    // The host sees the result when the call returns, as with a host backend.
    wait(*op);
    for (const Slot &s : host_slots) {
      if (!s.out) continue;
      cuda_check(cudaMemcpyAsync(const_cast<char *>(s.ptr), scratch.p + s.offset, s.bytes,
                                 cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync");
    }
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  return op;
}

// A call inside the group: it only records (ncclInProgress is fine); a failure names NCCL's
// reason. Runs with comm_lock_ held shared, so ncclGetLastError sees a live comm.
void Comm::check_recorded(ncclResult_t r, const char *name) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char *detail = ncclGetLastError(comm_);
  throw kit::Error(status_of(r), format("nccl: %s failed: %s%s%s", name, ncclGetErrorString(r),
                                        detail && *detail ? ": " : "", detail ? detail : ""));
}

void Comm::launch(const mncl_coll_v1_t &c, cudaStream_t stream) {
  const ncclDataType_t dt = nccl_dtype(c.dtype);
  const ncclRedOp_t op = nccl_op(c.op);
  auto call = [this](ncclResult_t r, const char *name) { check_recorded(r, name); };
  // Count 0 is a no-op on every rank (counts agree across ranks), so NCCL never sees it; the
  // v-kinds skip their empty blocks one by one.
  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
      if (c.count > 0) {
        call(ncclAllReduce(c.sendbuf, c.recvbuf, c.count, dt, op, comm_, stream), "ncclAllReduce");
      }
      break;
    case MNCL_COLL_REDUCE:
      if (c.count > 0) {
        call(ncclReduce(c.sendbuf, c.recvbuf, c.count, dt, op, c.root, comm_, stream),
             "ncclReduce");
      }
      break;
    case MNCL_COLL_BCAST:
      if (c.count > 0) {
        call(ncclBroadcast(c.recvbuf, c.recvbuf, c.count, dt, c.root, comm_, stream),
             "ncclBroadcast");
      }
      break;
    case MNCL_COLL_ALLGATHER:
      if (c.count > 0) {
        call(ncclAllGather(c.sendbuf, c.recvbuf, c.count, dt, comm_, stream), "ncclAllGather");
      }
      break;
    case MNCL_COLL_REDUCE_SCATTER:
      if (c.count > 0) {
        call(ncclReduceScatter(c.sendbuf, c.recvbuf, c.count, dt, op, comm_, stream),
             "ncclReduceScatter");
      }
      break;
    case MNCL_COLL_SCATTER:
    case MNCL_COLL_GATHER:
    case MNCL_COLL_ALLTOALL:
      if (c.count > 0) grouped_exchange(c, stream);
      break;
    case MNCL_COLL_ALLGATHERV:
    case MNCL_COLL_ALLTOALLV:
      grouped_exchange_v(c, stream);
      break;
    case MNCL_COLL_GATHERV:
    case MNCL_COLL_SCATTERV:
      grouped_exchange_rooted_v(c, stream);
      break;
    case MNCL_COLL_BARRIER:
      call(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream),
           "ncclAllReduce (barrier)");
      break;
    case MNCL_COLL_SEND:
      if (c.count > 0) call(ncclSend(c.sendbuf, c.count, dt, c.root, comm_, stream), "ncclSend");
      break;
    case MNCL_COLL_RECV:
      if (c.count > 0) call(ncclRecv(c.recvbuf, c.count, dt, c.root, comm_, stream), "ncclRecv");
      break;
    case MNCL_COLL_ALLREDUCE_COALESCED:
      for (size_t i = 0; i < c.nbufs; ++i) {
        if (c.counts[i] == 0) continue;
        call(ncclAllReduce(c.sendbufs[i], c.recvbufs[i], c.counts[i], dt, op, comm_, stream),
             "ncclAllReduce (coalesced)");
      }
      break;
    case MNCL_COLL_SENDRECV_BATCH: {
      // One group: every send and receive of the batch progresses together, which is what
      // keeps a ring shift from deadlocking (separate launches would run one after the other).
      const mncl_p2p_v4_t *ops = kit::p2p_ops(c);
      for (size_t i = 0; i < c.nbufs; ++i) {
        const mncl_p2p_v4_t &o = ops[i];
        if (o.count == 0) continue;
        if (o.kind == MNCL_COLL_SEND) {
          call(ncclSend(o.buf, o.count, nccl_dtype(o.dtype), o.peer, comm_, stream),
               "ncclSend (batch)");
        } else {
          call(ncclRecv(o.buf, o.count, nccl_dtype(o.dtype), o.peer, comm_, stream),
               "ncclRecv (batch)");
        }
      }
      break;
    }
    default:
      throw kit::Error(MNCL_ERR_NOT_SUPPORTED, format("nccl: unknown collective kind %d", c.kind));
  }
}

// In-place alltoall overwrites blocks it still has to send: they are copied aside first, on the
// stream, before the group opens (a CUDA failure inside a group would launch part of it);
// enqueue() frees the copy after the group.
void Comm::copy_aside_inplace_alltoall(mncl_coll_v1_t &c, cudaStream_t stream) {
  if (c.kind != MNCL_COLL_ALLTOALL || c.count == 0 || size_ == 1 || c.sendbuf != c.recvbuf) return;
  const size_t bytes = c.count * kit::dtype_size(c.dtype) * static_cast<size_t>(size_);
  void *copy = nullptr;
  cuda_check(cudaMallocAsync(&copy, bytes, stream), "cudaMallocAsync");
  inplace_temps_.push_back(copy);
  cuda_check(cudaMemcpyAsync(copy, c.sendbuf, bytes, cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpyAsync");
  c.sendbuf = copy;
}

// scatter, gather and alltoall as point-to-point inside the caller's group; the rank's own
// block is a device-to-device copy (none when in place).
void Comm::grouped_exchange(const mncl_coll_v1_t &c, cudaStream_t stream) {
  const ncclDataType_t dt = nccl_dtype(c.dtype);
  const size_t block = c.count * kit::dtype_size(c.dtype);
  const char *send = static_cast<const char *>(c.sendbuf);
  char *recv = static_cast<char *>(c.recvbuf);
  auto call = [this](ncclResult_t r, const char *name) { check_recorded(r, name); };
  auto self_copy = [&](char *dst, const char *src) {
    if (dst != src) {
      cuda_check(cudaMemcpyAsync(dst, src, block, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync");
    }
  };
  const size_t me = static_cast<size_t>(rank_);
  if (c.kind == MNCL_COLL_SCATTER) {
    if (rank_ == c.root) {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) {
          self_copy(recv, send + me * block);
        } else {
          call(ncclSend(send + static_cast<size_t>(p) * block, c.count, dt, p, comm_, stream),
               "ncclSend (scatter)");
        }
      }
    } else {
      call(ncclRecv(recv, c.count, dt, c.root, comm_, stream), "ncclRecv (scatter)");
    }
  } else if (c.kind == MNCL_COLL_GATHER) {
    if (rank_ == c.root) {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) {
          self_copy(recv + me * block, send);
        } else {
          call(ncclRecv(recv + static_cast<size_t>(p) * block, c.count, dt, p, comm_, stream),
               "ncclRecv (gather)");
        }
      }
    } else {
      call(ncclSend(send, c.count, dt, c.root, comm_, stream), "ncclSend (gather)");
    }
  } else {  // alltoall (in place, enqueue() has pointed sendbuf at a copy already)
    for (int p = 0; p < size_; ++p) {
      const size_t off = static_cast<size_t>(p) * block;
      if (p == rank_) {
        self_copy(recv + off, send + off);
        continue;
      }
      call(ncclSend(send + off, c.count, dt, p, comm_, stream), "ncclSend (alltoall)");
      call(ncclRecv(recv + off, c.count, dt, p, comm_, stream), "ncclRecv (alltoall)");
    }
  }
}

// allgatherv and alltoallv as point-to-point inside the caller's group, with the counts and
// displacements of each rank's block (mncl_plugin_v3.h); the rank's own block is a
// device-to-device copy (none for allgatherv in place: it is already there). Empty blocks are
// skipped: NCCL never sees a zero count. Only what lies inside a block is written, so the gaps
// between blocks keep their contents. A peer whose counts disagree with ours is not detected
// here (no rank can check it alone): NCCL's size mismatch or hang ends as an asynchronous error
// or a timeout through the watchdog, like any other failed kernel.
void Comm::grouped_exchange_v(const mncl_coll_v1_t &c, cudaStream_t stream) {
  const ncclDataType_t dt = nccl_dtype(c.dtype);
  const size_t es = kit::dtype_size(c.dtype);
  const kit::VLayout v = kit::v_layout(c);  // shape checked by enqueue()
  const bool gatherv = c.kind == MNCL_COLL_ALLGATHERV;
  const char *send = static_cast<const char *>(c.sendbuf);
  char *recv = static_cast<char *>(c.recvbuf);
  auto call = [this](ncclResult_t r, const char *name) { check_recorded(r, name); };
  for (int p = 0; p < size_; ++p) {
    const size_t i = static_cast<size_t>(p);
    // allgatherv: the same `count` elements go to every rank.
    const char *block = gatherv ? send : send + v.sdispls[i] * es;
    const size_t send_count = gatherv ? c.count : v.sendcounts[i];
    const size_t recv_count = v.recvcounts[i];
    char *dst = recv + v.rdispls[i] * es;
    if (p == rank_) {
      // recvcounts[rank] == the send count (checked by the core); the receive block bounds it.
      if (recv_count > 0 && dst != block) {
        cuda_check(cudaMemcpyAsync(dst, block, recv_count * es, cudaMemcpyDeviceToDevice, stream),
                   "cudaMemcpyAsync");
      }
      continue;
    }
    if (send_count > 0) {
      call(ncclSend(block, send_count, dt, p, comm_, stream),
           gatherv ? "ncclSend (allgatherv)" : "ncclSend (alltoallv)");
    }
    if (recv_count > 0) {
      call(ncclRecv(dst, recv_count, dt, p, comm_, stream),
           gatherv ? "ncclRecv (allgatherv)" : "ncclRecv (alltoallv)");
    }
  }
}

// gatherv and scatterv as point-to-point inside the caller's group (mncl_plugin_v5.h): the
// root receives (gatherv) or sends (scatterv) rank p's block of counts[p] elements at
// displs[p], one ncclRecv or ncclSend per other rank with a non-zero count, and copies its own
// block device to device (none in place: it is already there); every other rank sends or
// receives its block of `count` elements to or from the root, if non-empty. NCCL never sees a
// zero count, and only the blocks of the root's buffer are written. A rank whose count
// disagrees with the root's counts[rank] is not detected here (no rank can check it alone):
// NCCL reports what it reports (a size mismatch as an asynchronous error, or a hang that the
// watchdog ends with a timeout).
void Comm::grouped_exchange_rooted_v(const mncl_coll_v1_t &c, cudaStream_t stream) {
  const ncclDataType_t dt = nccl_dtype(c.dtype);
  const size_t es = kit::dtype_size(c.dtype);
  const bool gatherv = c.kind == MNCL_COLL_GATHERV;
  auto call = [this](ncclResult_t r, const char *name) { check_recorded(r, name); };
  if (rank_ != c.root) {
    if (c.count == 0) return;
    if (gatherv) {
      call(ncclSend(c.sendbuf, c.count, dt, c.root, comm_, stream), "ncclSend (gatherv)");
    } else {
      call(ncclRecv(c.recvbuf, c.count, dt, c.root, comm_, stream), "ncclRecv (scatterv)");
    }
    return;
  }
  const kit::RootedVLayout v = kit::rooted_v_layout(c);  // shape checked by enqueue()
  // The root's blocks: in its receive buffer (gatherv) or its send buffer (scatterv).
  const char *send = static_cast<const char *>(c.sendbuf);
  char *recv = static_cast<char *>(c.recvbuf);
  for (int p = 0; p < size_; ++p) {
    const size_t i = static_cast<size_t>(p), n = v.counts[i];
    if (n == 0) continue;
    if (p == rank_) {
      // counts[root] == count (checked by enqueue()); the in-place forms point at the block.
      char *dst = gatherv ? recv + v.displs[i] * es : recv;
      const char *src = gatherv ? send : send + v.displs[i] * es;
      if (dst != src) {
        cuda_check(cudaMemcpyAsync(dst, src, n * es, cudaMemcpyDeviceToDevice, stream),
                   "cudaMemcpyAsync");
      }
    } else if (gatherv) {
      call(ncclRecv(recv + v.displs[i] * es, n, dt, p, comm_, stream), "ncclRecv (gatherv)");
    } else {
      call(ncclSend(send + v.displs[i] * es, n, dt, p, comm_, stream), "ncclSend (scatterv)");
    }
  }
}

}  // namespace mncl::nccl

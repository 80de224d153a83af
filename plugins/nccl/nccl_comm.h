// The nccl backend's communicator: one non-blocking NCCL communicator on one GPU.
//
// Creation: rank 0 makes the NCCL unique id and publishes it in the bootstrap store ("id");
// the others read it, and the last reader deletes it. The GPU is bs->device (the core's
// choice: config.device, else MNCL_DEVICE, else the local rank), taken modulo the visible
// count when the process sees fewer GPUs than its host has ranks (CUDA_VISIBLE_DEVICES set per
// process, as by Slurm's --gpus-per-task).
//
// Collectives are enqueued on the caller's stream (NULL: the legacy default stream) and
// return, as NCCL's do; each is followed by an event that post/test and the watchdog use.
// scatter, gather, alltoall, allgatherv, alltoallv, gatherv and scatterv are grouped
// ncclSend/ncclRecv (with a device-to-device copy for the rank's own block; the v-kinds with a
// count and displacement per rank, empty blocks skipped), barrier is a one-element allreduce that
// the host waits for, and the coalesced allreduce is one NCCL group. Host buffers are accepted too:
// they are copied through device scratch memory on the same stream and the call waits for the
// result, as a host backend would.
//
// CUDA graphs: on a stream that is capturing, collectives are recorded into the graph (NCCL
// supports capture) and run on each launch. Such an operation has no event and no deadline:
// post/test report it done at once, and barrier does not wait; its completion is the graph
// launch's. Host buffers are refused there (MNCL_ERR_NOT_SUPPORTED, before anything is
// recorded). The watchdog runs in thread-local capture mode, so that its event queries never
// invalidate the application's global-mode capture. NCCL's own rules stay the caller's: the
// same captures on every rank, and peers of scatter/gather(v)/alltoall(v)/allgatherv/
// scatterv/send/recv connected before a global-mode capture (NCCL connects them lazily).
//
// Failures never hang: the communicator is non-blocking (ncclConfig_t.blocking = 0), so every
// NCCL call returns at once and completion is polled with a deadline; a watchdog thread polls
// ncclCommGetAsyncError and the age of every operation in flight, and aborts the NCCL
// communicator (ncclCommAbort) on an asynchronous error or when an operation outlives its
// timeout, which ends kernels waiting for a dead peer. From then on every call fails with the
// reason. comm_abort does the same on request.
#pragma once

#include <cuda_runtime_api.h>
#include <mncl/mncl_plugin.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

namespace mncl::nccl {

// One enqueued operation, for post/test and the watchdog.
struct Pending {
  cudaEvent_t event = nullptr;
  std::chrono::steady_clock::time_point start;
  int64_t timeout_ms = 0;
  uint64_t seq = 0;
  const char *what = "";
  bool captured = false;  // recorded into a CUDA graph: no event, done when the graph runs
  ~Pending();
};

class Comm {
 public:
  // Collective over bs.size ranks. Throws kit::Error.
  Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host);
  // Waits (bounded) for operations in flight, then finalizes; aborts if the comm failed.
  ~Comm();

  // Enqueues coll; returns once enqueued, or once complete for host buffers and barrier.
  void execute(const mncl_coll_v1_t &coll);
  // Enqueues coll and returns a handle for test().
  std::shared_ptr<Pending> post(const mncl_coll_v1_t &coll);
  // true once the operation has completed on the GPU. Throws on failure.
  bool test(const Pending &op);
  // Any thread: aborts the NCCL communicator; later calls fail with MNCL_ERR_ABORTED.
  void abort();
  // The teardown's waiting part (in-flight work, ncclCommFinalize); abort() can end it. The
  // destructor calls it if kit::destroy_comm has not.
  void close();

 private:
  std::shared_ptr<Pending> enqueue(const mncl_coll_v1_t &coll, bool *must_wait);
  bool capturing(cudaStream_t stream, const char *what);
  void launch(const mncl_coll_v1_t &c, cudaStream_t stream);
  void grouped_exchange(const mncl_coll_v1_t &c, cudaStream_t stream);
  void grouped_exchange_v(const mncl_coll_v1_t &c, cudaStream_t stream);
  void grouped_exchange_rooted_v(const mncl_coll_v1_t &c, cudaStream_t stream);
  void copy_aside_inplace_alltoall(mncl_coll_v1_t &c, cudaStream_t stream);
  void wait(const Pending &op);
  void wait_ready(const char *what, int64_t timeout_ms);
  ncclResult_t async_state();
  ncclResult_t check_async(const char *what);
  void check(ncclResult_t result, const char *what);
  void check_recorded(ncclResult_t result, const char *name);
  void check_usable(const char *what);
  // Records the first failure and aborts the NCCL communicator (any thread).
  void fail(mncl_status_t status, const std::string &message);
  void watchdog_loop();

  const mncl_host_v1_t *host_;
  int rank_, size_, device_;
  int64_t timeout_ms_;
  ncclComm_t comm_ = nullptr;
  // NCCL calls hold it shared (they return at once: the comm is non-blocking); ncclCommAbort,
  // which frees the communicator, holds it exclusively, so no call runs on a freed comm.
  std::shared_mutex comm_lock_;
  float *barrier_buf_ = nullptr;       // one device float for barrier
  std::vector<void *> inplace_temps_;  // in-place alltoall copies, freed after the group

  // First failure (async error, timeout, abort): every later call reports it.
  std::mutex failure_mutex_;
  std::atomic<bool> failed_{false};
  mncl_status_t failure_status_ = MNCL_OK;
  std::string failure_;
  std::atomic<bool> nccl_aborted_{false};

  // Operations in flight, watched by the watchdog.
  std::mutex pending_mutex_;
  std::vector<std::shared_ptr<Pending>> pending_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  bool closed_ = false;  // close() ran
  std::thread watchdog_;
};

}  // namespace mncl::nccl

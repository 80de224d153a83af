// CUDA buffers through host-only backends (naive, gloo, flat without CUDA-aware MPI): the
// core's "non_cuda_aware" path, as in ChainerMN.
//
// For one collective whose buffers include device (or managed) memory, Staging::run
//   1. copies every device input into pinned host memory, asynchronously on the caller's
//      stream (coll.stream, NULL = the legacy default stream), so the copy sees every kernel
//      the caller queued before the call, then waits for that stream (within the operation's
//      timeout, see run());
//   2. runs the host collective on a copy of the descriptor whose device pointers are replaced
//      by their pinned stand-ins (in-place forms stay in place: overlapping buffers share one
//      stand-in, at the same offsets);
//   3. copies every device output back on the same stream and waits for it again, so the
//      call returns with the result in device memory, like any blocking host collective, and
//      the pinned buffer is free for the next call.
// The pinned buffer belongs to the Staging object, grows to the largest collective seen and is
// freed with it. A communicator's lanes may stage at the same time (send/recv per peer), so it
// borrows Staging objects from a StagingPool, which keeps a few between calls: pinned memory
// follows the calls running at once, not every peer ever talked to. The first staged
// collective in the process logs a warning that staging is in use.
//
// Device pointers are recognized at run time through the CUDA driver the application has
// loaded (cuda/driver.h); libmncl does not link CUDA, and a process that never loads CUDA pays
// one cheap check per buffer.
#pragma once

#include <mncl/mncl_plugin_v1.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mncl::cuda {

// True if ptr is CUDA device or managed memory (false for host and pinned host memory, and
// whenever CUDA is not loaded and initialized in this process).
bool is_device_pointer(const void *ptr);

// Frees the pinned buffers abandoned after stuck-stream waits (Staging::run) whose copies are
// done; returns how many are still in use. Staged calls do this first; never throws.
size_t free_abandoned_pinned() noexcept;

class Staging {
 public:
  // The rank and size of the communicator (buffer extents depend on them) and the backend's
  // name (for the log line).
  Staging(int rank, int size, std::string backend);
  ~Staging();
  Staging(const Staging &) = delete;
  Staging &operator=(const Staging &) = delete;

  // True if a buffer that this rank reads or writes in coll is device memory, so the
  // collective must go through run(). Cheap when CUDA is absent; coll must be validated.
  bool needed(const mncl_coll_v1_t &coll) const;

  // Runs coll through host_run with device buffers staged as described above. host_run gets a
  // descriptor with host pointers only (stream unchanged) and reports failure by throwing; its
  // exception propagates unchanged. CUDA failures throw mncl::Error(MNCL_ERR_SYSTEM).
  //
  // The call's waits on the caller's stream and host_run share `bounds`' timeout (host_run's
  // descriptor carries what is left of it): past it the call throws
  // mncl::Error(MNCL_ERR_TIMEOUT), once its abort flag is set MNCL_ERR_ABORTED. Copies may
  // then still be queued on the stream, reading or writing the pinned buffer, so the buffer
  // is abandoned: never reused (the next call allocates a new one), freed once a CUDA event
  // recorded after those copies has completed.
  using HostRun = std::function<void(const mncl_coll_v1_t &)>;
  struct WaitBounds {
    int64_t timeout_ms;                // > 0
    const std::atomic<bool> *aborted;  // the communicator's abort flag, or null
    std::string what;                  // names the operation in messages ("mncl_allreduce #3")
    // A marker (StagingPool::mark_stream) to wait for before the inputs are copied: the
    // caller's work when the copies go on another thread's stream. May be null.
    void *inputs_ready = nullptr;
  };
  void run(const mncl_coll_v1_t &coll, const HostRun &host_run, const WaitBounds &bounds);

  // Bytes of pinned host memory held (for tests).
  size_t pinned_bytes() const { return capacity_; }

 private:
  void reserve(size_t bytes, void *context, int ordinal);
  using Deadline = std::chrono::steady_clock::time_point;
  // Waits for the caller's stream until the call's deadline (or bounds' abort); `pending`
  // names what it waits for.
  void wait_for_stream(void *stream, const WaitBounds &bounds, Deadline deadline,
                       const char *pending);
  // Waits for bounds.inputs_ready (if any) until the call's deadline or an abort.
  void wait_for_inputs(const WaitBounds &bounds, Deadline deadline);
  // After a failed copy call: waits for the copies queued before it, best effort.
  void settle_copies(void *stream, const WaitBounds &bounds, Deadline deadline) noexcept;
  // Gives up the pinned buffer, which copies queued on `stream` may still use: it is freed
  // once they are done (a marker after them), looked at by later staged calls.
  void abandon_pinned(void *stream) noexcept;

  int rank_;
  int size_;
  std::string backend_;
  void *pinned_ = nullptr;  // cuMemHostAlloc'ed, portable
  size_t capacity_ = 0;
  void *pinned_context_ = nullptr;  // the context it was allocated under
  int pinned_ordinal_ = -1;
};

// Staging for one communicator, whose lanes may call run() concurrently: each call borrows a
// Staging (the idle one with the largest buffer, else a new one) and gives it back; at most
// kKeptIdle stay allocated between calls, the largest ones.
class StagingPool {
 public:
  static constexpr size_t kKeptIdle = 4;

  StagingPool(int rank, int size, std::string backend);
  // As Staging::needed.
  bool needed(const mncl_coll_v1_t &coll) const;
  // As Staging::run, on a borrowed Staging.
  void run(const mncl_coll_v1_t &coll, const Staging::HostRun &host_run,
           const Staging::WaitBounds &bounds);
  // A marker after the work queued so far on coll.stream, as this thread sees that stream
  // (cudaStreamPerThread is this thread's), recorded in the context of coll's first device
  // buffer; nullptr when the driver has no events or the record fails. For WaitBounds.
  void *mark_stream(const mncl_coll_v1_t &coll) const noexcept;
  // Pinned bytes held between calls, and by how many Staging objects (for tests).
  size_t idle_pinned_bytes() const;
  size_t idle_count() const;

 private:
  std::unique_ptr<Staging> borrow();
  void give_back(std::unique_ptr<Staging> staging);

  int rank_, size_;
  std::string backend_;
  Staging probe_;  // answers needed(); never holds memory
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Staging>> idle_;
};

}  // namespace mncl::cuda

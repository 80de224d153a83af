// The few CUDA driver-API functions the core needs to recognize and stage device buffers, found
// at run time so that libmncl never links CUDA.
//
// Why the driver API (libcuda.so.1) and not the runtime (libcudart.so.N):
//  - Device pointers can only exist in a process that has loaded the driver, so "is libcuda.so.1
//    loaded yet?" (dlopen RTLD_NOLOAD) answers "can this be a device pointer?" without loading
//    anything into processes that never use CUDA, and without guessing which libcudart.so.N the
//    application uses (or whether it linked cudart statically, as PyTorch does).
//  - libcuda.so.1 is installed with the driver under one fixed name, and its entry points and
//    the few types below have kept their ABI since CUDA 4 (the _v2 names), so they are declared
//    here without the toolkit's headers. cudart's cudaPointerAttributes changed layout in 11.0.
//  - A cudaStream_t is a CUstream: the caller's stream works as is.
// The cost is context handling: driver calls need a current context, which Driver::Scope
// provides (the pointer's own context, or its device's primary context — the runtime's).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "common/poll.h"  // the plugin kit's

namespace mncl::cuda {

// Driver-API types and constants used here (cuda.h values; stable ABI).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st *;
using CUstream = struct CUstream_st *;
constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorNotInitialized = 3;
// The special stream handles (cuda.h's CU_STREAM_LEGACY, CU_STREAM_PER_THREAD): the legacy
// default stream, which waits for all work of the context's blocking streams and they for it,
// and the calling thread's own default stream, a blocking stream (cudaStreamPerThread).
inline void *const kLegacyStream = reinterpret_cast<void *>(0x1);
inline void *const kPerThreadStream = reinterpret_cast<void *>(0x2);

// What a pointer is, from cuPointerGetAttributes.
struct PointerInfo {
  bool device = false;          // device or managed memory: host code must not touch it directly
  bool managed = false;         // cudaMallocManaged (staged too: host access is not stream-ordered)
  int ordinal = -1;             // device ordinal
  CUcontext context = nullptr;  // owning context (null for stream-ordered pool allocations)
};

// Process-wide handle on the driver library. All members are thread-safe.
class Driver {
 public:
  // The singleton. Looking it up costs nothing until the driver is loaded by someone.
  static Driver &get();

  // Classifies ptr. Host memory (also pinned host memory) and any failure give device = false:
  // before the application has loaded and initialized CUDA no device pointer can exist.
  PointerInfo classify(const void *ptr);

  // The library the driver was found in ("libcuda.so.1" or MNCL_CUDA_LIBRARY), for messages.
  const std::string &library() const { return library_; }

  // Makes ctx (or, if null, the primary context of `ordinal`) current on this thread for the
  // lifetime of the scope, and restores the previous one afterwards. Throws mncl::Error.
  class Scope {
   public:
    Scope(Driver &driver, CUcontext ctx, int ordinal);
    ~Scope();
    Scope(const Scope &) = delete;
    Scope &operator=(const Scope &) = delete;

   private:
    Driver &driver_;
    bool pushed_ = false;
  };

  // Thin wrappers that throw mncl::Error(MNCL_ERR_SYSTEM) naming the call and the CUDA error.
  // Call them inside a Scope.
  void *host_alloc(size_t bytes);  // pinned, portable across contexts
  void host_free(void *ptr) noexcept;
  void copy_d2h_async(void *dst, const void *src, size_t bytes, void *stream);
  void copy_h2d_async(void *dst, const void *src, size_t bytes, void *stream);

  // Waits until `stream` has finished all the work queued on it. It polls (cuStreamQuery)
  // rather than blocking in cuStreamSynchronize, so that the wait can end: kTimedOut at
  // deadline, kStopped once *aborted (may be null) is true. A CUDA error throws.
  kit::PollResult synchronize(void *stream, std::chrono::steady_clock::time_point deadline,
                              const std::atomic<bool> *aborted);

  // A marker (a CUDA event) recorded after the work queued on `stream` so far, to learn later
  // whether that work is done without touching the stream, which its owner may destroy
  // meanwhile. nullptr when the driver lacks events or the record fails. Inside a Scope.
  void *mark(void *stream) noexcept;
  // Whether the work before `marker` is done; false while it is not, or on any error.
  bool marked_done(void *marker) noexcept;
  // The same, but a CUDA error (a fault of the work before it) throws mncl::Error naming it,
  // instead of looking like work that never ends. Inside a Scope.
  bool marked_done_or_throw(void *marker);
  void drop_mark(void *marker) noexcept;

  // Finds the library if the process has loaded it since the last look; false: no buffer can
  // be CUDA memory yet.
  bool loaded();

  // Whether `stream` (a cudaStream_t) is being captured into a CUDA graph (an active or an
  // invalidated capture). false without a driver, for the NULL stream, or if the driver
  // cannot tell (an old one without cuStreamIsCapturing). Safe during a capture: it is not
  // one of the calls a capture prohibits.
  bool capturing(void *stream);

 private:
  Driver();
  void check(CUresult result, const char *call) const;
  CUcontext primary_context(int ordinal);

  std::mutex mutex_;
  std::string library_;
  void *handle_ = nullptr;
  // dl_iterate_phdr's load counter at the last look; atomic so the "nothing new" answer needs
  // no lock (it is asked once per collective).
  std::atomic<unsigned long long> seen_adds_{~0ull};
  bool disabled_ = false;  // MNCL_CUDA_LIBRARY=none

  struct Api;  // the entry points, resolved once the library is found
  std::atomic<const Api *> api_{nullptr};
  std::map<int, CUcontext> primary_;  // retained primary contexts, by ordinal (never released)
};

}  // namespace mncl::cuda

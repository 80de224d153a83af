// A CPU stand-in for a GPU, its CUDA runtime and NCCL, so that the nccl plugin (and code built
// on cudart) runs in CI without a GPU. Built as two libraries with the real sonames,
// libcudart.so.13 and libnccl.so.2, against the real headers of the toolkit; a test puts their
// folder first on LD_LIBRARY_PATH, and the very libmncl-nccl.so that ships loads them.
//
// What it models (fake_cudart.cpp):
//  - MNCL_FAKE_GPUS devices (default 8; 0: cudaErrorNoDevice). cudaSetDevice is per thread.
//  - Device memory is a memfd mapped twice: the address the caller gets is PROT_NONE, so any
//    host access to device memory crashes as on a GPU; the fake's "kernels" use the other view.
//  - Streams are in-order queues, each run by its own worker thread, so work is asynchronous:
//    a missing synchronization reads stale data. The NULL, legacy and per-thread streams are
//    one stream. cudaMemcpyAsync treats host memory as pageable, as the runtime does: from it,
//    the source is copied at once; into it, the call returns once the stream has done the copy.
//  - Events complete when their stream passes them; cudaEventQuery says cudaErrorNotReady
//    until then. cudaFreeAsync frees in stream order.
//  - A kernel touching memory that is not (or no longer) allocated makes a sticky
//    cudaErrorIllegalAddress, printed to stderr, as a real fault would.
// The driver (fake_driver.cpp, libcuda.so.1), which the runtime loads as the real one does:
//  - what the core's staging path calls (cuPointerGetAttributes, primary contexts, pinned
//    memory, cuMemcpy*Async_v2, cuStreamSynchronize) on the runtime's memory and streams;
//  - a copy from pinned memory reads it when the stream gets there (DMA), not at the call.
// What it models (fake_nccl.cpp): see there.
//
// This header is the two libraries' private interface: fake_nccl.cpp enqueues its "kernels"
// on fake_cudart's streams and reads device memory through its views.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

#define FAKE_GPU_EXPORT __attribute__((visibility("default")))

namespace fake_gpu {

// A process-wide object that is never destroyed: stream threads may still use it at exit.
template <typename T, int kTag = 0>
T &forever() {
  static T *object = new T;
  return *object;
}

// The host view of [ptr, ptr + bytes) if it lies in one device allocation, else nullptr.
// *device receives the allocation's device when non-null.
FAKE_GPU_EXPORT char *device_view(const void *ptr, size_t bytes, int *device = nullptr);
// Queues fn on the stream, after everything queued there before. false: unknown stream.
FAKE_GPU_EXPORT bool enqueue(cudaStream_t stream, std::function<void()> fn);
// The calling thread's current device.
FAKE_GPU_EXPORT int current_device();
// Reports a kernel fault: sticky cudaErrorIllegalAddress from now on, and a line on stderr.
FAKE_GPU_EXPORT void fault(const char *what);
// Waits until the stream has run everything queued so far. false: unknown stream.
FAKE_GPU_EXPORT bool synchronize(cudaStream_t stream);
// The device whose primary context the runtime made current on this thread (cudaSetDevice or
// the first call that needs one), or -1.
FAKE_GPU_EXPORT int runtime_context_device();

}  // namespace fake_gpu

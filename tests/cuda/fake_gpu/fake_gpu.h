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
//  - Stream capture into CUDA graphs: between cudaStreamBeginCapture and cudaStreamEndCapture
//    (created streams only) what is queued on the stream (copies, event records, frees, NCCL
//    kernels) becomes the graph's node list instead of running; cudaGraphLaunch queues the
//    nodes in that order, as often as asked. The capture modes and
//    cudaThreadExchangeStreamCaptureMode rule "potentially unsafe" calls (synchronizations,
//    event queries, cudaMalloc/cudaFree, synchronous copies and memsets) as CUDA documents:
//    a prohibited call fails with cudaErrorStreamCaptureUnsupported and invalidates the
//    capture(s) prohibiting it (cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated), so a
//    Global-mode watchdog thread polling events kills another thread's capture. An event last
//    recorded in a capture answers cudaErrorCapturedEvent; cudaMallocAsync under capture is
//    the graph's memory, kept while any graph, executable graph or launch holds it; a copy into
//    (pageable) host memory is refused, one from host memory reads it at each launch.
//    Not modelled: fork/join of several streams into one capture (cudaStreamWaitEvent), the
//    graph API beyond capture/instantiate/launch/destroy (nodes, updates, child graphs,
//    launching into a capture), per-thread default stream capture, captured host callbacks.
// The driver (fake_driver.cpp, libcuda.so.1), which the runtime loads as the real one does:
//  - what the core's staging path calls (cuPointerGetAttributes, primary contexts, pinned
//    memory, cuMemcpy*Async_v2, cuStreamQuery, cuStreamIsCapturing) on the runtime's
//    memory and streams, with its capture rules;
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
// Queues fn on the stream, after everything queued there before; on a capturing stream it is
// appended to the capture instead (and runs at each launch of the graph; dropped if the capture
// was invalidated). false: unknown stream.
FAKE_GPU_EXPORT bool enqueue(cudaStream_t stream, std::function<void()> fn);
// The same, and on_launch runs on the calling thread just before fn is queued: now, or at each
// cudaGraphLaunch of a graph that captured fn (the fake NCCL counts its kernels in flight so).
FAKE_GPU_EXPORT bool enqueue(cudaStream_t stream, std::function<void()> fn,
                             std::function<void()> on_launch);
// Whether an active (not invalidated) capture is on the stream.
FAKE_GPU_EXPORT bool capturing(cudaStream_t stream);
// The stream's capture status, without the runtime's side effects (an error, a context).
// false: unknown stream.
FAKE_GPU_EXPORT bool capture_status(cudaStream_t stream, cudaStreamCaptureStatus *status);
// Judges a potentially unsafe call (see above), `stream` being the one it synchronizes (or
// NULL): true if it is prohibited, the captures prohibiting it being invalidated.
FAKE_GPU_EXPORT bool prohibited(cudaStream_t stream);
// The calling thread's current device.
FAKE_GPU_EXPORT int current_device();
// Reports a kernel fault: sticky cudaErrorIllegalAddress from now on, and a line on stderr.
FAKE_GPU_EXPORT void fault(const char *what);
// Waits until the stream has run everything queued so far. false: unknown stream.
FAKE_GPU_EXPORT bool synchronize(cudaStream_t stream);
// Whether the stream has run everything queued so far, without waiting. false: unknown stream.
FAKE_GPU_EXPORT bool idle(cudaStream_t stream, bool *idle);
// The device whose primary context the runtime made current on this thread (cudaSetDevice or
// the first call that needs one), or -1.
FAKE_GPU_EXPORT int runtime_context_device();

}  // namespace fake_gpu

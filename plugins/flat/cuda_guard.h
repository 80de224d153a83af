// What flat needs of CUDA when a CUDA-aware MPI lets it take device pointers, without linking
// CUDA: the driver library is looked up only if the process already loaded it (an application
// with no CUDA cannot have device pointers).
//
// CUDA-aware MPI reads and writes device buffers itself, but flat touches some buffers on the
// host: the AVG division, the coalesced pack, the in-place reduce_scatter copy, the pack of
// allgatherv / alltoallv blocks whose displacements do not fit MPI's int. Those forms
// are refused on device memory with MNCL_ERR_NOT_SUPPORTED rather than crashing; the rest runs
// after the caller's stream has been synchronized (MPI does not order itself with streams).
#pragma once

namespace mncl::flat::cuda {

// True if p is CUDA device (or managed) memory. False for host memory, NULL, or no CUDA here.
bool is_device_pointer(const void *p);
// Waits for the work queued on `stream` (a cudaStream_t / CUstream). No-op for NULL or no CUDA.
// Returns false if CUDA reported an error.
bool synchronize(void *stream);

}  // namespace mncl::flat::cuda

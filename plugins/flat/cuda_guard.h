// What flat needs of CUDA when a CUDA-aware MPI lets it take device pointers, without linking
// CUDA: the driver library is looked up only if the process already loaded it (an application
// with no CUDA cannot have device pointers).
//
// CUDA-aware MPI reads and writes device buffers itself, but flat touches some buffers on the
// host: the AVG division, the coalesced pack, the in-place reduce_scatter copy, the pack of
// allgatherv / alltoallv blocks whose displacements do not fit MPI's int. Those forms
// are refused on device memory with MNCL_ERR_NOT_SUPPORTED rather than crashing; the rest runs
// after the caller's stream has finished its queued work (MPI does not order itself with
// streams).
#pragma once

#include <atomic>
#include <chrono>

#include "common/poll.h"

namespace mncl::flat::cuda {

// True if p is CUDA device (or managed) memory. False for host memory, NULL, or no CUDA here.
bool is_device_pointer(const void *p);
// Waits for the work queued on `stream` (a cudaStream_t / CUstream; NULL is the legacy default
// stream), polling cuStreamQuery so that the wait ends at `deadline` (kTimedOut) or once
// *aborted is true (kStopped). kReady at once without CUDA. A CUDA error throws kit::Error
// (MNCL_ERR_SYSTEM) naming it.
kit::PollResult wait_for_stream(void *stream, std::chrono::steady_clock::time_point deadline,
                                const std::atomic<bool> *aborted);

}  // namespace mncl::flat::cuda

// The test-only controls of libmncl-fake-cuda.so, a stand-in for the CUDA driver (libcuda.so.1)
// that runs without a GPU. It exports the driver entry points the core's staging path uses
// (cuPointerGetAttributes, cuMemHostAlloc, cuMemcpy*Async_v2, cuStreamQuery, events, contexts...)
// with the driver's behaviour where the core depends on it:
//  - "device memory" is host memory mapped PROT_NONE, so any direct host access (a host
//    backend handed a device pointer) crashes as it would on a GPU;
//  - asynchronous copies are queued per stream and only happen when cuStreamQuery finds the
//    stream done, so a missing synchronization shows up as stale data; a stream can be held
//    (its work never finishes: CUDA_ERROR_NOT_READY), as behind a kernel that hangs;
//  - every call but cuInit fails with CUDA_ERROR_NOT_INITIALIZED before cuInit, and copies,
//    pinned allocations and queries fail with CUDA_ERROR_INVALID_CONTEXT without a current
//    context, as the real driver does.
// Tests load it with dlopen (or link it) and point the core at it with MNCL_CUDA_LIBRARY.
#ifndef MNCL_TESTS_FAKE_CUDA_H
#define MNCL_TESTS_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fake_cuda_counters {
  uint64_t d2h_copies;   /* cuMemcpyDtoHAsync calls */
  uint64_t h2d_copies;   /* cuMemcpyHtoDAsync calls */
  uint64_t syncs;        /* cuStreamQuery calls that found the stream done */
  uint64_t queries;      /* cuStreamQuery calls */
  uint64_t host_allocs;  /* cuMemHostAlloc calls */
  uint64_t host_frees;   /* cuMemFreeHost calls */
  uint64_t attr_queries; /* cuPointerGetAttributes calls */
  uint64_t bad_context;  /* calls refused for lack of a current context */
  int64_t ctx_depth;     /* contexts pushed and not popped, over all threads */
  int64_t events;        /* events created and not destroyed */
} fake_cuda_counters_t;

/* cuInit(0), as the application's CUDA runtime would do. */
int fake_cuda_init(void);
/* "Device" (PROT_NONE) memory on device `ordinal`; managed != 0 marks it cudaMallocManaged. */
void *fake_cuda_malloc(size_t bytes, int ordinal, int managed);
void fake_cuda_free(void *ptr);
/* Synchronous copies into / out of fake device memory (cudaMemcpy in the tests). */
void fake_cuda_write(void *dev, const void *src, size_t bytes);
void fake_cuda_read(void *dst, const void *dev, size_t bytes);
/* A distinct stream handle (streams are just names to the fake). */
void *fake_cuda_stream_create(void);
/* Copies of the counters; reset zeroes them (ctx_depth and events excepted). */
void fake_cuda_get_counters(fake_cuda_counters_t *out);
void fake_cuda_reset_counters(void);
/* While held != 0 the stream's work never finishes: cuStreamQuery says CUDA_ERROR_NOT_READY
 * and its queued copies wait. cudaStreamPerThread (0x2) is the calling thread's stream, here
 * and in every entry point. */
void fake_cuda_hold_stream(void *stream, int held);
/* The next call to the named entry point ("cuMemcpyDtoHAsync_v2") fails with
 * CUDA_ERROR_LAUNCH_FAILED (719). NULL clears it. */
void fake_cuda_fail_next(const char *entry_point);
/* The same after `successes` calls to it have succeeded. */
void fake_cuda_fail_after(const char *entry_point, int successes);

#ifdef __cplusplus
}
#endif

#endif /* MNCL_TESTS_FAKE_CUDA_H */

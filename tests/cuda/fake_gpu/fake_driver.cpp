// Fake libcuda.so.1: the driver entry points the core's staging path (sdk/cuda/driver.cpp)
// and the nccl plugin (cuCtxGetCurrent) call, on the fake runtime's memory and streams. The
// fake runtime loads it at start-up, so the core finds it loaded, as with a real runtime.
// Result codes and attribute numbers are cuda.h's; see fake_gpu.h for the model.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "../fake_pointer_attributes.h"
#include "fake_gpu.h"

#define FAKE_DRIVER extern "C" FAKE_GPU_EXPORT

namespace {

using CUresult = int;
constexpr CUresult kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3,
                   kInvalidContext = 201, kInvalidHandle = 400, kNotReady = 600,
                   kCaptureUnsupported = 900;

struct Ctx;  // a context is a distinct address per device
Ctx *context_of(int device) {
  return reinterpret_cast<Ctx *>(0x1000 + 16 * device);
}

bool g_initialized = false;
thread_local std::vector<Ctx *> t_pushed;  // cuCtxPushCurrent / cuCtxPopCurrent

std::mutex &pinned_mutex() {
  return fake_gpu::forever<std::mutex>();
}
std::set<const void *> &pinned() {
  return fake_gpu::forever<std::set<const void *>>();
}

// The current context: the top of the pushed ones, else the runtime's primary context.
Ctx *current() {
  if (!t_pushed.empty()) return t_pushed.back();
  const int device = fake_gpu::runtime_context_device();
  return device >= 0 ? context_of(device) : nullptr;
}

CUresult enter(bool needs_context) {
  if (!g_initialized) return kNotInitialized;
  if (needs_context && current() == nullptr) return kInvalidContext;
  return kSuccess;
}

}  // namespace

// The runtime initializes the driver before its first call; so does the fake runtime, which
// loads this library at start-up.
__attribute__((constructor)) static void initialize() {
  g_initialized = true;
}

FAKE_DRIVER CUresult cuInit(unsigned flags) {
  g_initialized = true;
  return flags == 0 ? kSuccess : kInvalidValue;
}

FAKE_DRIVER CUresult cuDriverGetVersion(int *version) {
  if (version == nullptr) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

FAKE_DRIVER CUresult cuGetErrorName(CUresult error, const char **name) {
  switch (error) {
    case kSuccess:
      *name = "CUDA_SUCCESS";
      return kSuccess;
    case kInvalidValue:
      *name = "CUDA_ERROR_INVALID_VALUE";
      return kSuccess;
    case kOutOfMemory:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      return kSuccess;
    case kNotInitialized:
      *name = "CUDA_ERROR_NOT_INITIALIZED";
      return kSuccess;
    case kInvalidContext:
      *name = "CUDA_ERROR_INVALID_CONTEXT";
      return kSuccess;
    case kInvalidHandle:
      *name = "CUDA_ERROR_INVALID_HANDLE";
      return kSuccess;
    case kNotReady:
      *name = "CUDA_ERROR_NOT_READY";
      return kSuccess;
    case kCaptureUnsupported:
      *name = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
      return kSuccess;
    default:
      *name = nullptr;
      return kInvalidValue;
  }
}

FAKE_DRIVER CUresult cuGetErrorString(CUresult error, const char **text) {
  return cuGetErrorName(error, text);
}

FAKE_DRIVER CUresult cuCtxGetCurrent(Ctx **ctx) {
  if (CUresult r = enter(false)) return r;
  *ctx = current();
  return kSuccess;
}

FAKE_DRIVER CUresult cuDevicePrimaryCtxRetain(Ctx **ctx, int device) {
  if (CUresult r = enter(false)) return r;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    return kInvalidValue;
  }
  *ctx = context_of(device);
  return kSuccess;
}

FAKE_DRIVER CUresult cuCtxPushCurrent_v2(Ctx *ctx) {
  if (CUresult r = enter(false)) return r;
  if (ctx == nullptr) return kInvalidContext;
  t_pushed.push_back(ctx);
  return kSuccess;
}

FAKE_DRIVER CUresult cuCtxPopCurrent_v2(Ctx **ctx) {
  if (CUresult r = enter(false)) return r;
  if (t_pushed.empty()) return kInvalidContext;
  if (ctx != nullptr) *ctx = t_pushed.back();
  t_pushed.pop_back();
  return kSuccess;
}

FAKE_DRIVER CUresult cuPointerGetAttributes(unsigned n, const int *attrs, void **data,
                                            unsigned long long ptr) {
  if (CUresult r = enter(false)) return r;
  const void *p = reinterpret_cast<const void *>(ptr);
  int device = -1;
  const bool on_device = fake_gpu::device_view(p, 1, &device) != nullptr;
  bool is_pinned;
  {
    std::lock_guard<std::mutex> lock(pinned_mutex());
    is_pinned = pinned().count(p) > 0;
  }
  fake_cuda::PointerFacts facts;
  if (on_device) {
    facts = {context_of(device), 2, false, device};
  } else if (is_pinned) {
    facts.memory_type = 1;
  }
  return fake_cuda::write_pointer_attributes(n, attrs, data, facts) ? kSuccess : kInvalidValue;
}

FAKE_DRIVER CUresult cuMemHostAlloc(void **ptr, size_t bytes, unsigned flags) {
  (void)flags;
  if (CUresult r = enter(true)) return r;
  void *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return kOutOfMemory;
  std::lock_guard<std::mutex> lock(pinned_mutex());
  pinned().insert(p);
  *ptr = p;
  return kSuccess;
}

FAKE_DRIVER CUresult cuMemFreeHost(void *ptr) {
  if (CUresult r = enter(false)) return r;
  {
    std::lock_guard<std::mutex> lock(pinned_mutex());
    if (pinned().erase(ptr) == 0) return kInvalidValue;
  }
  std::free(ptr);
  return kSuccess;
}

// Both directions run when the stream gets there, reading and writing host memory then (DMA
// from and to pinned memory): a caller that reuses the host buffer too early sees it.
namespace {
CUresult copy_async(void *dst, const void *src, size_t bytes, void *stream, bool to_device) {
  if (CUresult r = enter(true)) return r;
  const void *dev = to_device ? dst : src;
  const void *host = to_device ? src : dst;
  if (fake_gpu::device_view(dev, bytes) == nullptr || fake_gpu::device_view(host, 1) != nullptr) {
    return kInvalidValue;
  }
  const bool queued =
      fake_gpu::enqueue(static_cast<cudaStream_t>(stream), [dst, src, bytes, to_device] {
        char *d = to_device ? fake_gpu::device_view(dst, bytes) : static_cast<char *>(dst);
        const char *s =
            to_device ? static_cast<const char *>(src) : fake_gpu::device_view(src, bytes);
        if (d == nullptr || s == nullptr) return fake_gpu::fault("cuMemcpyAsync on freed memory");
        std::memcpy(d, s, bytes);
      });
  return queued ? kSuccess : kInvalidHandle;
}
}  // namespace

FAKE_DRIVER CUresult cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t bytes,
                                          void *stream) {
  return copy_async(dst, reinterpret_cast<const void *>(src), bytes, stream, false);
}

FAKE_DRIVER CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t bytes,
                                          void *stream) {
  return copy_async(reinterpret_cast<void *>(dst), src, bytes, stream, true);
}

// Potentially unsafe during a capture, as the runtime's (see fake_gpu.h): what the core's
// staging polls.
FAKE_DRIVER CUresult cuStreamQuery(void *stream) {
  if (CUresult r = enter(true)) return r;
  if (fake_gpu::prohibited(static_cast<cudaStream_t>(stream))) return kCaptureUnsupported;
  bool idle = false;
  if (!fake_gpu::idle(static_cast<cudaStream_t>(stream), &idle)) return kInvalidHandle;
  return idle ? kSuccess : kNotReady;
}

// The calling thread's capture mode, shared with the runtime's
// cudaThreadExchangeStreamCaptureMode as CUDA's is (CUstreamCaptureMode values are
// cudaStreamCaptureMode's). Not potentially unsafe.
FAKE_DRIVER CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
  if (mode == nullptr) return kInvalidValue;
  auto m = static_cast<cudaStreamCaptureMode>(*mode);
  if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess) return kInvalidValue;
  *mode = static_cast<int>(m);
  return kSuccess;
}

// The runtime's capture state of the stream (a cudaStream_t is the CUstream). Not potentially
// unsafe: callers ask it during captures. status: a CUstreamCaptureStatus, whose values are
// cudaStreamCaptureStatus's.
FAKE_DRIVER CUresult cuStreamIsCapturing(void *stream, int *status) {
  if (CUresult r = enter(stream == nullptr)) return r;  // a created stream has its context
  if (status == nullptr) return kInvalidValue;
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  if (!fake_gpu::capture_status(static_cast<cudaStream_t>(stream), &s)) return kInvalidHandle;
  *status = static_cast<int>(s);
  return kSuccess;
}

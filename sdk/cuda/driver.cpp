#include "cuda/driver.h"

#include <dlfcn.h>
#include <link.h>

#include <chrono>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

namespace mncl::cuda {

namespace {

// cuda.h values (stable ABI).
using CUpointer_attribute = int;
constexpr CUpointer_attribute kAttrContext = 1;
constexpr CUpointer_attribute kAttrMemoryType = 2;
constexpr CUpointer_attribute kAttrIsManaged = 8;
constexpr CUpointer_attribute kAttrDeviceOrdinal = 9;
constexpr unsigned kMemoryTypeDevice = 2;
constexpr unsigned kMemoryTypeUnified = 4;
constexpr unsigned kHostAllocPortable = 0x01;
constexpr CUresult kCudaErrorNotReady = 600;

constexpr const char *kDefaultLibrary = "libcuda.so.1";

// dl_iterate_phdr callback: the loader's count of objects ever loaded, read from the first
// object (the count is the same in every entry), then stop.
int read_adds(dl_phdr_info *info, size_t size, void *out) {
  if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds) {
    *static_cast<unsigned long long *>(out) = info->dlpi_adds;
  }
  return 1;
}

}  // namespace

struct Driver::Api {
  CUresult (*pointer_get_attributes)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
  CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
  CUresult (*ctx_push)(CUcontext);
  CUresult (*ctx_pop)(CUcontext *);
  CUresult (*mem_host_alloc)(void **, size_t, unsigned);
  CUresult (*mem_free_host)(void *);
  CUresult (*memcpy_dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*stream_query)(CUstream);
  CUresult (*get_error_name)(CUresult, const char **);
  CUresult (*get_error_string)(CUresult, const char **);
  CUresult (*driver_get_version)(int *);
  CUresult (*stream_is_capturing)(CUstream, int *);  // optional: CUstreamCaptureStatus out
  CUresult (*exchange_capture_mode)(int *);          // optional: CUstreamCaptureMode in/out
  // Optional (Driver::mark): without them an abandoned staging buffer is never freed.
  CUresult (*event_create)(void **, unsigned);
  CUresult (*event_record)(void *, CUstream);
  CUresult (*event_query)(void *);
  CUresult (*event_destroy)(void *);
};

namespace {

// This thread in thread-local capture mode for the object's life: in the default global mode,
// a query or record while any other thread captures a CUDA graph in global mode is
// prohibited, fails, and invalidates that capture. The calls made under it capture nothing.
class ThreadLocalCapture {
 public:
  explicit ThreadLocalCapture(CUresult (*exchange)(int *)) : exchange_(exchange) {
    constexpr int kThreadLocal = 1;  // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    mode_ = kThreadLocal;
    exchanged_ = exchange_ != nullptr && exchange_(&mode_) == kCudaSuccess;
  }
  ~ThreadLocalCapture() {
    if (exchanged_) exchange_(&mode_);
  }
  ThreadLocalCapture(const ThreadLocalCapture &) = delete;
  ThreadLocalCapture &operator=(const ThreadLocalCapture &) = delete;

 private:
  CUresult (*exchange_)(int *);
  int mode_;
  bool exchanged_ = false;
};

}  // namespace

Driver &Driver::get() {
  static Driver *driver = new Driver();  // never destroyed: used until the process ends
  return *driver;
}

Driver::Driver() {
  const auto name = env::get("MNCL_CUDA_LIBRARY");
  library_ = name ? *name : kDefaultLibrary;
  disabled_ = library_ == "none";
  if (disabled_) MNCL_INFO("MNCL_CUDA_LIBRARY=none: buffers are never treated as CUDA memory");
}

bool Driver::loaded() {
  if (api_.load(std::memory_order_acquire) != nullptr) return true;
  if (disabled_) return false;
  // Nothing new loaded since the last look: the driver is still absent. This keeps the check
  // at one callback for processes that never use CUDA.
  unsigned long long adds = 0;
  dl_iterate_phdr(read_adds, &adds);
  if (adds == seen_adds_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (api_.load(std::memory_order_relaxed) != nullptr) return true;
  seen_adds_.store(adds, std::memory_order_release);
  // Only ever a library the application (or its CUDA runtime) has loaded: never load CUDA here.
  void *handle = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) return false;

  auto *api = new Api();
  bool complete = true;
  auto resolve = [&](auto &fn, const char *symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
    if (fn == nullptr) {
      MNCL_WARN("%s has no %s: CUDA buffers will not be recognized", library_.c_str(), symbol);
      complete = false;
    }
  };
  resolve(api->pointer_get_attributes, "cuPointerGetAttributes");
  resolve(api->primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  resolve(api->ctx_push, "cuCtxPushCurrent_v2");
  resolve(api->ctx_pop, "cuCtxPopCurrent_v2");
  resolve(api->mem_host_alloc, "cuMemHostAlloc");
  resolve(api->mem_free_host, "cuMemFreeHost");
  resolve(api->memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  resolve(api->memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  resolve(api->stream_query, "cuStreamQuery");
  resolve(api->get_error_name, "cuGetErrorName");
  resolve(api->get_error_string, "cuGetErrorString");
  resolve(api->driver_get_version, "cuDriverGetVersion");
  api->stream_is_capturing =
      reinterpret_cast<decltype(api->stream_is_capturing)>(dlsym(handle, "cuStreamIsCapturing"));
  api->exchange_capture_mode = reinterpret_cast<decltype(api->exchange_capture_mode)>(
      dlsym(handle, "cuThreadExchangeStreamCaptureMode"));
  api->event_create = reinterpret_cast<decltype(api->event_create)>(dlsym(handle, "cuEventCreate"));
  api->event_record = reinterpret_cast<decltype(api->event_record)>(dlsym(handle, "cuEventRecord"));
  api->event_query = reinterpret_cast<decltype(api->event_query)>(dlsym(handle, "cuEventQuery"));
  api->event_destroy =
      reinterpret_cast<decltype(api->event_destroy)>(dlsym(handle, "cuEventDestroy_v2"));
  if (!complete) {
    delete api;
    dlclose(handle);
    disabled_ = true;  // a broken driver stays broken: do not look again
    return false;
  }
  handle_ = handle;
  int version = 0;
  api->driver_get_version(&version);
  MNCL_INFO(
      "CUDA driver found in this process (%s, CUDA %d.%d): CUDA buffers passed to "
      "host-only backends will be staged through pinned host memory",
      library_.c_str(), version / 1000, version % 1000 / 10);
  api_.store(api, std::memory_order_release);
  return true;
}

PointerInfo Driver::classify(const void *ptr) {
  PointerInfo info;
  if (ptr == nullptr || !loaded()) return info;
  const Api *api = api_.load(std::memory_order_acquire);
  CUpointer_attribute attrs[] = {kAttrMemoryType, kAttrIsManaged, kAttrDeviceOrdinal, kAttrContext};
  unsigned memory_type = 0, is_managed = 0;  // unsigned: the driver may write a 1-byte bool
  int ordinal = -1;
  CUcontext context = nullptr;
  void *data[] = {&memory_type, &is_managed, &ordinal, &context};
  // Host memory the driver does not know is CUDA_SUCCESS with zeroed attributes; before the
  // application initializes CUDA every call fails (CUDA_ERROR_NOT_INITIALIZED): host memory.
  if (api->pointer_get_attributes(4, attrs, data, reinterpret_cast<CUdeviceptr>(ptr)) !=
      kCudaSuccess) {
    return info;
  }
  info.managed = is_managed != 0;
  info.device =
      info.managed || memory_type == kMemoryTypeDevice || memory_type == kMemoryTypeUnified;
  info.ordinal = ordinal;
  info.context = context;
  return info;
}

void Driver::check(CUresult result, const char *call) const {
  if (result == kCudaSuccess) return;
  const Api *api = api_.load(std::memory_order_acquire);
  const char *name = "?", *text = "?";
  if (api != nullptr) {
    api->get_error_name(result, &name);
    api->get_error_string(result, &text);
  }
  throw Error(MNCL_ERR_SYSTEM, format("CUDA staging: %s failed: %s (%d): %s", call,
                                      name ? name : "?", result, text ? text : "?"));
}

CUcontext Driver::primary_context(int ordinal) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = primary_.find(ordinal);
  if (it != primary_.end()) return it->second;
  CUcontext ctx = nullptr;
  // Retained for the life of the process: it is the runtime's context, which the application
  // keeps alive anyway, and releasing it could tear it down under the application.
  check(api_.load()->primary_ctx_retain(&ctx, ordinal), "cuDevicePrimaryCtxRetain");
  primary_[ordinal] = ctx;
  return ctx;
}

Driver::Scope::Scope(Driver &driver, CUcontext ctx, int ordinal) : driver_(driver) {
  MNCL_CHECK(driver.loaded(), MNCL_ERR_INTERNAL, "CUDA staging: the CUDA driver is not loaded");
  if (ctx == nullptr) {
    MNCL_CHECK(ordinal >= 0, MNCL_ERR_INTERNAL,
               "CUDA staging: a device buffer with neither a context nor a device ordinal");
    ctx = driver.primary_context(ordinal);
  }
  driver.check(driver.api_.load()->ctx_push(ctx), "cuCtxPushCurrent");
  pushed_ = true;
}

Driver::Scope::~Scope() {
  if (!pushed_) return;
  CUcontext ignored = nullptr;
  driver_.api_.load()->ctx_pop(&ignored);
}

void *Driver::host_alloc(size_t bytes) {
  void *ptr = nullptr;
  check(api_.load()->mem_host_alloc(&ptr, bytes, kHostAllocPortable), "cuMemHostAlloc");
  return ptr;
}

void Driver::host_free(void *ptr) noexcept {
  // Errors ignored: at process exit the driver may already be shut down, freeing everything.
  if (ptr != nullptr && api_.load() != nullptr) api_.load()->mem_free_host(ptr);
}

void Driver::copy_d2h_async(void *dst, const void *src, size_t bytes, void *stream) {
  check(api_.load()->memcpy_dtoh_async(dst, reinterpret_cast<CUdeviceptr>(src), bytes,
                                       static_cast<CUstream>(stream)),
        "cuMemcpyDtoHAsync");
}

void Driver::copy_h2d_async(void *dst, const void *src, size_t bytes, void *stream) {
  check(api_.load()->memcpy_htod_async(reinterpret_cast<CUdeviceptr>(dst), src, bytes,
                                       static_cast<CUstream>(stream)),
        "cuMemcpyHtoDAsync");
}

void *Driver::mark(void *stream) noexcept {
  const Api *api = api_.load(std::memory_order_acquire);
  if (api == nullptr || api->event_create == nullptr || api->event_record == nullptr ||
      api->event_query == nullptr || api->event_destroy == nullptr) {
    return nullptr;
  }
  constexpr unsigned kDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING: the cheapest kind
  const ThreadLocalCapture mode(api->exchange_capture_mode);
  void *event = nullptr;
  if (api->event_create(&event, kDisableTiming) != kCudaSuccess) return nullptr;
  if (api->event_record(event, static_cast<CUstream>(stream)) != kCudaSuccess) {
    api->event_destroy(event);
    return nullptr;
  }
  return event;
}

bool Driver::marked_done(void *marker) noexcept {
  const Api *api = api_.load(std::memory_order_acquire);
  if (marker == nullptr || api == nullptr) return false;
  const ThreadLocalCapture mode(api->exchange_capture_mode);
  return api->event_query(marker) == kCudaSuccess;
}

bool Driver::marked_done_or_throw(void *marker) {
  const Api *api = api_.load(std::memory_order_acquire);
  const ThreadLocalCapture mode(api->exchange_capture_mode);
  const CUresult result = api->event_query(marker);
  if (result == kCudaErrorNotReady) return false;
  check(result, "cuEventQuery");
  return true;
}

void Driver::drop_mark(void *marker) noexcept {
  const Api *api = api_.load(std::memory_order_acquire);
  if (marker != nullptr && api != nullptr) api->event_destroy(marker);
}

bool Driver::capturing(void *stream) {
  if (stream == nullptr || !loaded()) return false;
  const Api *api = api_.load(std::memory_order_acquire);
  if (api->stream_is_capturing == nullptr) return false;
  constexpr int kCaptureStatusNone = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  int status = kCaptureStatusNone;
  if (api->stream_is_capturing(static_cast<CUstream>(stream), &status) != kCudaSuccess) {
    return false;  // not a stream the driver knows: the backend's own calls will say so
  }
  return status != kCaptureStatusNone;
}

kit::PollResult Driver::synchronize(void *stream, std::chrono::steady_clock::time_point deadline,
                                    const std::atomic<bool> *aborted) {
  const Api *api = api_.load();
  // This thread captures nothing here (staging refuses a capturing stream first), so
  // thread-local mode lets the queries through and leaves another thread's capture alone.
  const ThreadLocalCapture mode(api->exchange_capture_mode);
  const auto ready = [&] {
    const CUresult result = api->stream_query(static_cast<CUstream>(stream));
    if (result != kCudaErrorNotReady) check(result, "cuStreamQuery");
    return result == kCudaSuccess;
  };
  return kit::poll_until(ready, deadline, aborted);
}

}  // namespace mncl::cuda

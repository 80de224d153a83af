#include "flat/cuda_guard.h"

#include <dlfcn.h>

#include <cstdint>

#include "common/host.h"

namespace mncl::flat::cuda {

namespace {

// The few driver API declarations used (cuda.h is not needed to build flat).
using CUresult = int;
using PointerGetAttribute = CUresult (*)(void *data, int attribute, unsigned long long ptr);
using StreamQuery = CUresult (*)(void *stream);
using ExchangeCaptureMode = CUresult (*)(int *mode);
constexpr CUresult kNotInitialized = 3;     // CUDA_ERROR_NOT_INITIALIZED
constexpr CUresult kInvalidContext = 201;   // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult kNotReady = 600;         // CUDA_ERROR_NOT_READY
constexpr int kCaptureModeThreadLocal = 1;  // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
constexpr int kAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr unsigned kMemoryTypeHost = 1;     // CU_MEMORYTYPE_HOST

struct Driver {
  PointerGetAttribute get_attribute = nullptr;
  StreamQuery query = nullptr;
  ExchangeCaptureMode exchange_capture_mode = nullptr;  // optional
};

const Driver &driver() {
  static const Driver d = [] {
    Driver out;
    // RTLD_NOLOAD: only a libcuda the application already loaded; never load CUDA ourselves.
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib != nullptr) {
      out.get_attribute =
          reinterpret_cast<PointerGetAttribute>(dlsym(lib, "cuPointerGetAttribute"));
      out.query = reinterpret_cast<StreamQuery>(dlsym(lib, "cuStreamQuery"));
      out.exchange_capture_mode =
          reinterpret_cast<ExchangeCaptureMode>(dlsym(lib, "cuThreadExchangeStreamCaptureMode"));
    }
    return out;
  }();
  return d;
}

}  // namespace

bool is_device_pointer(const void *p) {
  if (p == nullptr || driver().get_attribute == nullptr) return false;
  unsigned type = 0;
  // Unregistered host memory makes the call fail: that is host memory too.
  if (driver().get_attribute(&type, kAttributeMemoryType, reinterpret_cast<uintptr_t>(p)) != 0) {
    return false;
  }
  return type != kMemoryTypeHost;
}

kit::PollResult wait_for_stream(void *stream, std::chrono::steady_clock::time_point deadline,
                                const std::atomic<bool> *aborted) {
  if (driver().query == nullptr) return kit::PollResult::kReady;
  // In thread-local capture mode for the wait: in the default global mode a query while
  // another thread captures a CUDA graph in global mode fails and invalidates that capture.
  int mode = kCaptureModeThreadLocal;
  const bool exchanged =
      driver().exchange_capture_mode != nullptr && driver().exchange_capture_mode(&mode) == 0;
  struct Restore {
    bool exchanged;
    int &mode;
    ~Restore() {
      if (exchanged) driver().exchange_capture_mode(&mode);
    }
  } restore{exchanged, mode};
  return kit::poll_until(
      [&] {
        const CUresult result = driver().query(stream);
        // The legacy default stream needs a current context: a thread without one (or a
        // process that never initialized CUDA) has queued nothing on it.
        if (stream == nullptr && (result == kInvalidContext || result == kNotInitialized)) {
          return true;
        }
        if (result != 0 && result != kNotReady) {
          throw kit::Error(MNCL_ERR_SYSTEM,
                           kit::format("cuStreamQuery on the caller's stream failed with CUDA "
                                       "error %d",
                                       result));
        }
        return result == 0;
      },
      deadline, aborted);
}

}  // namespace mncl::flat::cuda

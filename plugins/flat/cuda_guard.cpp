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
constexpr CUresult kNotReady = 600;      // CUDA_ERROR_NOT_READY
constexpr int kAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr unsigned kMemoryTypeHost = 1;  // CU_MEMORYTYPE_HOST

struct Driver {
  PointerGetAttribute get_attribute = nullptr;
  StreamQuery query = nullptr;
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
  return kit::poll_until(
      [&] {
        const CUresult result = driver().query(stream);
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

#include "flat/cuda_guard.h"

#include <dlfcn.h>

#include <cstdint>

namespace mncl::flat::cuda {

namespace {

// The few driver API declarations used (cuda.h is not needed to build flat).
using CUresult = int;
using PointerGetAttribute = CUresult (*)(void *data, int attribute, unsigned long long ptr);
using StreamSynchronize = CUresult (*)(void *stream);
constexpr int kAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr unsigned kMemoryTypeHost = 1;  // CU_MEMORYTYPE_HOST

struct Driver {
  PointerGetAttribute get_attribute = nullptr;
  StreamSynchronize synchronize = nullptr;
};

const Driver &driver() {
  static const Driver d = [] {
    Driver out;
    // RTLD_NOLOAD: only a libcuda the application already loaded; never load CUDA ourselves.
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib != nullptr) {
      out.get_attribute =
          reinterpret_cast<PointerGetAttribute>(dlsym(lib, "cuPointerGetAttribute"));
      out.synchronize = reinterpret_cast<StreamSynchronize>(dlsym(lib, "cuStreamSynchronize"));
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

bool synchronize(void *stream) {
  if (stream == nullptr || driver().synchronize == nullptr) return true;
  return driver().synchronize(stream) == 0;
}

}  // namespace mncl::flat::cuda

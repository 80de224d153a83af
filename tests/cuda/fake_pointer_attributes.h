// cuPointerGetAttributes for the two fake drivers (fake_cuda.cpp for the staging unit tests,
// fake_gpu/fake_driver.cpp under the fake runtime): what they know of a pointer, written out
// in cuda.h's attribute numbers.
#pragma once

namespace fake_cuda {

struct PointerFacts {
  void *context = nullptr;  // the owning device's context, for device memory
  unsigned memory_type =
      0;  // CU_MEMORYTYPE_HOST 1, DEVICE 2; 0 for memory the driver does not know
  bool managed = false;
  int ordinal = -2;  // the device, for device memory
};

// Fills data[i] for attrs[i]: 1 context, 2 memory type, 8 is managed (written as a 1-byte
// bool, as some drivers do, so the reader must cope), 9 device ordinal. false: another one.
inline bool write_pointer_attributes(unsigned n, const int *attrs, void **data,
                                     const PointerFacts &facts) {
  for (unsigned i = 0; i < n; ++i) {
    switch (attrs[i]) {
      case 1:
        *static_cast<void **>(data[i]) = facts.context;
        break;
      case 2:
        *static_cast<unsigned *>(data[i]) = facts.memory_type;
        break;
      case 8:
        *static_cast<bool *>(data[i]) = facts.managed;
        break;
      case 9:
        *static_cast<int *>(data[i]) = facts.ordinal;
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace fake_cuda

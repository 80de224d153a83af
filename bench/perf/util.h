// Small helpers shared by mncl-perf's files: MNCL errors as exceptions, aligned buffers, a clock,
// and reductions of timings across ranks through MNCL itself.
#pragma once

#include <mncl/mncl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mncl::perf {

// An MNCL call failed: what was called, the status and the library's message.
class MnclError : public std::runtime_error {
 public:
  MnclError(const std::string &what, mncl_status_t status)
      : std::runtime_error(what + ": " + mncl_status_string(status) + ": " + mncl_last_error()),
        status_(status) {}
  mncl_status_t status() const { return status_; }

 private:
  mncl_status_t status_;
};

inline void must(mncl_status_t st, const char *what) {
  if (st != MNCL_OK) throw MnclError(what, st);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Page-aligned, zero-filled (so every page is touched before any timing) host memory.
struct FreeDeleter {
  void operator()(void *p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeDeleter>;
Buffer alloc_buffer(size_t bytes);

// Element-wise op over ranks of `v`, in place (float64 or int64 through mncl_allreduce).
void allreduce_doubles(mncl_comm_t comm, std::vector<double> &v, mncl_op_t op);
int64_t allreduce_sum(mncl_comm_t comm, int64_t v);

}  // namespace mncl::perf

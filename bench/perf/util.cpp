#include "util.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace mncl::perf {

Buffer alloc_buffer(size_t bytes) {
  void *p = nullptr;
  const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  if (posix_memalign(&p, 4096, rounded) != 0) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return Buffer(p);
}

void allreduce_doubles(mncl_comm_t comm, std::vector<double> &v, mncl_op_t op) {
  if (v.empty()) return;
  must(mncl_allreduce(comm, v.data(), v.data(), v.size(), MNCL_FLOAT64, op, nullptr),
       "mncl_allreduce of the timings");
}

int64_t allreduce_sum(mncl_comm_t comm, int64_t v) {
  must(mncl_allreduce(comm, &v, &v, 1, MNCL_INT64, MNCL_SUM, nullptr),
       "mncl_allreduce of the wrong-value counts");
  return v;
}

}  // namespace mncl::perf

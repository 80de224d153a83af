#include "membw.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "util.h"

namespace mncl::perf {

MemBandwidth measure_membw(mncl_comm_t comm, int nranks, size_t bytes) {
  constexpr int kTrials = 3, kPasses = 6;
  const size_t half = std::max<size_t>(bytes / 2, 4096);
  Buffer a = alloc_buffer(half), b = alloc_buffer(half);
  std::memset(a.get(), 1, half);
  MemBandwidth best;
  best.buffer_bytes = half;
  for (int t = 0; t < kTrials; ++t) {
    must(mncl_barrier(comm, nullptr), "mncl_barrier before the copy test");
    const double t0 = now_s();
    for (int p = 0; p < kPasses; ++p) {
      // Alternate directions so neither buffer stays in a "just written" state.
      if (p % 2 == 0)
        std::memcpy(b.get(), a.get(), half);
      else
        std::memcpy(a.get(), b.get(), half);
    }
    const double t1 = now_s();
    // The aggregate is all ranks' bytes over the span from the first start to the last end, on
    // the host-wide monotonic clock. Dividing by each rank's own time instead would count ranks
    // that did not overlap (more ranks than cores, or a late release from the barrier) as if
    // they had copied side by side.
    std::vector<double> span = {-t0, t1};
    allreduce_doubles(comm, span, MNCL_MAX);
    const double wall = span[0] + span[1];
    const double moved = 2.0 * static_cast<double>(half) * kPasses;  // read + write
    const double total = moved * nranks / wall;
    if (total > best.bytes_per_s) {
      best.bytes_per_s = total;
      best.per_rank_bytes_per_s = moved / (t1 - t0);
    }
  }
  return best;
}

}  // namespace mncl::perf

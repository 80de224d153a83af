#include "membw.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "util.h"

namespace mncl::perf {

namespace {

// This rank's host as MNCL tells hosts apart (MNCL_HOSTID, else the host name), hashed (FNV-1a)
// to 52 bits so that a double holds it exactly.
double host_key() {
  std::string id;
  if (const char *e = std::getenv("MNCL_HOSTID"); e && *e) {
    id = e;
  } else {
    char buf[256] = "";
    gethostname(buf, sizeof buf - 1);
    id = buf;
  }
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ULL;
  return static_cast<double>(h >> 12);
}

}  // namespace

MemBandwidth measure_membw(mncl_comm_t comm, int nranks, size_t bytes) {
  constexpr int kTrials = 3, kPasses = 6;
  {
    std::vector<double> lo = {host_key()}, hi = lo;
    allreduce_doubles(comm, lo, MNCL_MIN);
    allreduce_doubles(comm, hi, MNCL_MAX);
    if (lo[0] != hi[0]) {
      MemBandwidth none;
      none.multi_host = true;
      return none;
    }
  }
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

// Small helpers the stand-alone benchmarks share: the median of timings and sizes for tables.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace mncl_bench {

// The median (the mean of the middle two for an even count); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "8 B", "4 KiB", "16 MiB" (whole units, rounded down).
inline std::string human_bytes(std::size_t bytes) {
  char buf[32];
  if (bytes >= (std::size_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  } else {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  }
  return buf;
}

}  // namespace mncl_bench

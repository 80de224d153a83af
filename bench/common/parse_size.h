// Byte sizes on the benchmarks' command lines: "8", "64K", "1M", "2G" (powers of 1024; also
// k/m/g, KB/MB/GB, KiB/MiB/GiB, Ki/Mi/Gi and a trailing B). Anything else, a negative number or
// a value above 1e15 bytes throws std::invalid_argument with a message naming the text.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace mncl::bench {

inline size_t parse_size(const std::string &text) {
  char *end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || errno != 0 || !(v >= 0))
    throw std::invalid_argument("'" + text + "' is not a size (like 8, 64K, 1M, 2G)");
  double mult = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB" || suffix == "Ki") {
    mult = 1024.0;
  } else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB" ||
             suffix == "Mi") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB" ||
             suffix == "Gi") {
    mult = 1024.0 * 1024 * 1024;
  } else if (!suffix.empty() && suffix != "B") {
    throw std::invalid_argument("'" + text + "': unknown suffix '" + suffix + "'");
  }
  const double bytes = v * mult;
  if (bytes > 1e15) throw std::invalid_argument("'" + text + "' is too large");
  return static_cast<size_t>(std::llround(bytes));
}

}  // namespace mncl::bench

// Numbers on the benchmarks' command lines. Byte sizes: "8", "64K", "1M", "2G" (powers of 1024;
// also k/m/g, KB/MB/GB, KiB/MiB/GiB, Ki/Mi/Gi and a trailing B). Anything else, a negative
// number or a value above 1e15 bytes throws std::invalid_argument with a message naming the
// text; so does parse_number for what is not wholly a number of its type, in range.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

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

// The whole of `text` as a number of type T in [lo, hi] (std::atoi took "abc" for 0 and
// "12x" for 12).
template <class T>
T parse_number(const std::string &text, T lo = std::numeric_limits<T>::lowest(),
               T hi = std::numeric_limits<T>::max()) {
  char *end = nullptr;
  errno = 0;
  T value{};
  bool fits = true;
  if constexpr (std::is_floating_point_v<T>) {
    const double v = std::strtod(text.c_str(), &end);
    fits = std::isfinite(v) && std::fabs(v) <= std::numeric_limits<T>::max();
    value = static_cast<T>(v);
  } else if constexpr (std::is_signed_v<T>) {
    const long long v = std::strtoll(text.c_str(), &end, 10);
    fits = v >= static_cast<long long>(std::numeric_limits<T>::min()) &&
           v <= static_cast<long long>(std::numeric_limits<T>::max());
    value = static_cast<T>(v);
  } else {
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    fits = text.find('-') == std::string::npos && v <= std::numeric_limits<T>::max();
    value = static_cast<T>(v);
  }
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !fits) {
    throw std::invalid_argument("'" + text + "' is not " +
                                (std::is_floating_point_v<T> ? "a number" : "an integer"));
  }
  if (value < lo || value > hi) {
    throw std::invalid_argument("'" + text + "' is out of range [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  }
  return value;
}

}  // namespace mncl::bench

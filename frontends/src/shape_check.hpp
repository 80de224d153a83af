// Helpers shared by the frontends' layers (not installed).
#ifndef MNCL_FRONTENDS_SRC_SHAPE_CHECK_HPP
#define MNCL_FRONTENDS_SRC_SHAPE_CHECK_HPP

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace mncl {
namespace internal {

// The element count `shape` describes, or nothing for a negative dimension or an overflow (so
// that checking a shape never throws: the caller must still join the reduction).
// The product of the non-zero dimensions must fit in int64 too, so that the loops' index
// arithmetic cannot overflow even for an empty tensor.
inline std::optional<std::size_t> checked_element_count(const std::vector<int64_t> &shape) {
  int64_t nonzero_product = 1;
  bool any_zero = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      any_zero = true;
    } else if (nonzero_product > std::numeric_limits<int64_t>::max() / d) {
      return std::nullopt;
    } else {
      nonzero_product *= d;
    }
  }
  return any_zero ? 0 : static_cast<std::size_t>(nonzero_product);
}

}  // namespace internal
}  // namespace mncl

#endif  // MNCL_FRONTENDS_SRC_SHAPE_CHECK_HPP

// C++ element types -> mncl_dtype_t, and the two 16-bit float formats used to send float32
// gradients at half the bytes (ChainerMN's allreduce_grad_dtype).
#ifndef MNCL_FRONTENDS_DTYPE_HPP
#define MNCL_FRONTENDS_DTYPE_HPP

#include <mncl/mncl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mncl {

// IEEE 754 binary16, stored as its bits.
struct Float16 {
  uint16_t bits = 0;
};
// bfloat16: the upper 16 bits of a binary32.
struct BFloat16 {
  uint16_t bits = 0;
};

namespace detail {
template <class T>
inline constexpr bool kAlwaysFalse = false;
inline uint32_t float_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  return x;
}
inline float bits_float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
}  // namespace detail

// float -> binary16, rounding to nearest even; overflow gives infinity, NaN stays NaN.
inline Float16 to_float16(float value) {
  const uint32_t x = detail::float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // infinity or NaN (keep NaN quiet and non-zero)
    const uint16_t nan_bits = magnitude > 0x7f800000u ? 0x0200u : 0u;
    return {static_cast<uint16_t>(sign | 0x7c00u | nan_bits)};
  }
  if (magnitude >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520
  if (magnitude < 0x38800000u) {  // below 2^-14: a binary16 subnormal, or zero
    const int exponent = static_cast<int>(magnitude >> 23);
    if (exponent < 102) return {sign};  // below 2^-25: rounds to zero
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const int shift = 126 - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return {static_cast<uint16_t>(sign | result)};
  }
  // Normal: rebias the exponent; the rounding carry may correctly bump the exponent.
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return {static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}

inline float to_float(Float16 half) {
  const uint32_t sign = static_cast<uint32_t>(half.bits & 0x8000u) << 16;
  const uint32_t exponent = (half.bits >> 10) & 0x1fu;
  const uint32_t mantissa = half.bits & 0x3ffu;
  if (exponent == 0x1f) return detail::bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return detail::bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// float -> bfloat16, rounding to nearest even; NaN stays NaN.
inline BFloat16 to_bfloat16(float value) {
  const uint32_t x = detail::float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((x >> 16) | 0x0040u)};
  return {static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

inline float to_float(BFloat16 value) {
  return detail::bits_float(static_cast<uint32_t>(value.bits) << 16);
}

// The MNCL dtype of a C++ element type; a compile error for types MNCL cannot reduce.
template <class T>
constexpr mncl_dtype_t dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return MNCL_FLOAT32;
  } else if constexpr (std::is_same_v<U, double>) {
    return MNCL_FLOAT64;
  } else if constexpr (std::is_same_v<U, Float16>) {
    return MNCL_FLOAT16;
  } else if constexpr (std::is_same_v<U, BFloat16>) {
    return MNCL_BFLOAT16;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool>) {
    constexpr bool is_signed = std::is_signed_v<U>;
    if constexpr (sizeof(U) == 1) return is_signed ? MNCL_INT8 : MNCL_UINT8;
    if constexpr (sizeof(U) == 4) return is_signed ? MNCL_INT32 : MNCL_UINT32;
    if constexpr (sizeof(U) == 8) return is_signed ? MNCL_INT64 : MNCL_UINT64;
    static_assert(sizeof(U) == 1 || sizeof(U) == 4 || sizeof(U) == 8,
                  "MNCL has no 16-bit integer dtype");
    return MNCL_INT8;
  } else {
    static_assert(detail::kAlwaysFalse<T>,
                  "no MNCL dtype for this type: use an arithmetic type, Float16 or BFloat16");
    return MNCL_UINT8;
  }
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_DTYPE_HPP

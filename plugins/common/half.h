// Plugin kit: IEEE 754 binary16 ("float16") and bfloat16 <-> float32 conversions.
//
// float32 -> 16 bits rounds to nearest, ties to even; overflow gives infinity; NaN stays NaN
// (quieted, sign and high payload bits kept); subnormals are produced and read exactly.
// The conversions use integer arithmetic only, so they give the same bits whatever the FPU's
// rounding mode or flush-to-zero / denormals-are-zero settings (some ML frameworks set FTZ).
// float16 -> float32 uses one float multiply, on normal numbers only, which FTZ/DAZ leave alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mncl::kit {

// 2-byte storage types. Plain structs (not arithmetic types) so nobody adds them by accident.
struct float16 {
  uint16_t bits;
};
struct bfloat16 {
  uint16_t bits;
};
static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2, "16-bit floats must be 2 bytes");

namespace detail {
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

inline float float16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;           // exponent and mantissa
  uint32_t bits = (em << 13) + 0x38000000u;  // normal: rebias the exponent 15 -> 127
  if (em >= 0x7c00u) bits += 0x38000000u;    // inf / NaN: exponent 31 -> 255, payload kept
  if (em < 0x0400u) {                        // zero / subnormal: em * 2^-24, exact in fp32
    bits = detail::bits_of(static_cast<float>(em) * 0x1p-24f);
  }
  return detail::float_of(bits | sign);
}

// Written as selects rather than early returns so loops over it can be vectorized.
inline uint16_t float_to_float16_bits(float f) {
  const uint32_t x = detail::bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  // Normal result: rebias, then round to nearest even on the 13 dropped bits (a carry into the
  // exponent is the correct rounding up to the next binade).
  const uint32_t r = ax - 0x38000000u;
  const uint32_t normal = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
  // Subnormal result (2^-25 <= |f| < 2^-14, exponent field 102..112): shift the significand,
  // implicit bit included, right by 126 - exponent and round to nearest even.
  const uint32_t e = ax >> 23;
  const uint32_t shift = (e >= 102u && e <= 112u) ? 126u - e : 24u;
  const uint32_t m = (ax & 0x007fffffu) | 0x00800000u;
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const uint32_t sub = q + ((rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u);

  uint32_t h = ax >= 0x38800000u ? normal : (e >= 102u ? sub : 0u);  // below 2^-25: zero
  h = ax >= 0x477ff000u ? 0x7c00u : h;  // >= 65520 (halfway above 65504, ties up): infinity
  h = ax > 0x7f800000u ? (0x7e00u | ((ax >> 13) & 0x03ffu)) : h;  // NaN: quiet, payload kept
  return static_cast<uint16_t>(sign | h);
}

inline float bfloat16_bits_to_float(uint16_t b) {
  return detail::float_of(uint32_t(b) << 16);
}

inline uint16_t float_to_bfloat16_bits(float f) {
  const uint32_t x = detail::bits_of(f);
  // Truncating a NaN whose payload sits in the low half would make it infinity: quiet it.
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // nearest even
}

inline float to_float(float16 h) {
  return float16_bits_to_float(h.bits);
}
inline float to_float(bfloat16 b) {
  return bfloat16_bits_to_float(b.bits);
}

// from_float<float16>(x), from_float<bfloat16>(x).
template <typename H>
H from_float(float f);
template <>
inline float16 from_float<float16>(float f) {
  return {float_to_float16_bits(f)};
}
template <>
inline bfloat16 from_float<bfloat16>(float f) {
  return {float_to_bfloat16_bits(f)};
}

// Whole arrays: dst[i] = float(src[i]) and dst[i] = round(src[i]).
template <typename H>
void widen(float *dst, const H *src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}
template <typename H>
void narrow(H *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = from_float<H>(src[i]);
}

}  // namespace mncl::kit

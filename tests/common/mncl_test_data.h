// Deterministic data for the SPMD collective tests (conformance_test, coalesced_test): one
// element codec and one generator of reduction inputs with their expected results, so that
// every test checks a backend against the same definition of "right".
//
// Data are small integers chosen so that every partial result is exact in every dtype (fp16 and
// bf16 included) whatever the order of accumulation: a backend must match bit for bit.
#ifndef MNCL_TESTS_COMMON_MNCL_TEST_DATA_H
#define MNCL_TESTS_COMMON_MNCL_TEST_DATA_H

#include <mncl/mncl.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/reduce.h"  // the plugin kit's reference fold over ranks

namespace mncl_testing {

// ---------------------------------------------------------------------------------------------
// Data types (own tables rather than mncl_dtype_size: the tests check the library against them)
// ---------------------------------------------------------------------------------------------

inline bool is_float(mncl_dtype_t dt) {
  return dt >= MNCL_FLOAT16;
}
inline bool is_signed(mncl_dtype_t dt) {
  return is_float(dt) || dt == MNCL_INT8 || dt == MNCL_INT32 || dt == MNCL_INT64;
}
inline size_t elem_size(mncl_dtype_t dt) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  return sizes[dt];
}

// binary32 -> binary16, round to nearest even (our values are small integers: exact).
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t fexp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (fexp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  const int exp = static_cast<int>(fexp) - 127 + 15;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {  // subnormal half (or zero)
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rounds up the exponent
  return static_cast<uint16_t>(h);
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Stores logical value v as one element. Integers wrap modulo 2^bits, as MNCL's do.
inline void encode(mncl_dtype_t dt, int64_t v, void *p) {
  switch (dt) {
    case MNCL_INT8:
      *static_cast<int8_t *>(p) = static_cast<int8_t>(v);
      break;
    case MNCL_UINT8:
      *static_cast<uint8_t *>(p) = static_cast<uint8_t>(v);
      break;
    case MNCL_INT32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case MNCL_UINT32: {
      uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case MNCL_INT64:
      std::memcpy(p, &v, 8);
      break;
    case MNCL_UINT64: {
      uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case MNCL_FLOAT16: {
      uint16_t x = float_to_half(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case MNCL_BFLOAT16: {
      uint16_t x = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case MNCL_FLOAT32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case MNCL_FLOAT64: {
      double x = static_cast<double>(v);
      std::memcpy(p, &x, 8);
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Deterministic data, per (rank, index, seed)
// ---------------------------------------------------------------------------------------------

inline uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t hash3(int rank, size_t i, int seed) {
  return mix(mix(mix(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(rank)) ^ i);
}

// Input of `rank` (of `size` ranks) at element i of a reduction, chosen per op so that every
// partial result is exact in every dtype (fp16: integers up to 2048, bf16: up to 256):
//  SUM:  -4..4 (0..8 unsigned); |sum| <= 4*size.
//  PROD: mostly 1, sometimes 2 (or -1 if signed); the product is +-2^k with small k.
//  MIN/MAX: -125..125; for unsigned dtypes the negative ones wrap to values with the top bit
//           set, which catches a backend comparing unsigned data as signed.
//  AVG:  integers: like SUM, so truncation toward zero of negative sums is exercised.
//        floats: size * (-2..2), so the sum is a multiple of size and the average exact.
inline int64_t reduce_input(mncl_dtype_t dt, mncl_op_t op, int rank, int size, size_t i, int seed) {
  const uint64_t h = hash3(rank, i, seed);
  switch (op) {
    case MNCL_PROD: {
      const uint64_t k = h % 8;
      if (k == 0) return 2;
      if (k == 1 && is_signed(dt)) return -1;
      return 1;
    }
    case MNCL_MIN:
    case MNCL_MAX: {
      const int64_t v = static_cast<int64_t>(h % 251) - 125;
      if (v >= 0 || is_signed(dt) || dt == MNCL_UINT64) return v;  // uint64: compared as such
      return v + (int64_t{1} << (8 * elem_size(dt)));              // wrap into the unsigned range
    }
    case MNCL_AVG:
      if (is_float(dt)) return static_cast<int64_t>(size) * (static_cast<int64_t>(h % 5) - 2);
      [[fallthrough]];
    case MNCL_SUM:
    default:
      return is_signed(dt) ? static_cast<int64_t>(h % 9) - 4 : static_cast<int64_t>(h % 9);
  }
}

inline bool less_than(mncl_dtype_t dt, int64_t a, int64_t b) {
  if (dt == MNCL_UINT64) return static_cast<uint64_t>(a) < static_cast<uint64_t>(b);
  return a < b;
}

// op over ranks 0..size-1 of reduce_input at element i, as the logical (unwrapped) value.
inline int64_t reduce_output(mncl_dtype_t dt, mncl_op_t op, int size, size_t i, int seed) {
  int64_t acc = mncl::kit::fold_ranks<int64_t>(
      op, size, [&](int r) { return reduce_input(dt, op, r, size, i, seed); },
      [&](int64_t a, int64_t b) { return less_than(dt, a, b); });
  // C++ division truncates toward zero, as MNCL's integer AVG; exact for our float data.
  if (op == MNCL_AVG) acc /= size;
  return acc;
}

}  // namespace mncl_testing

#endif  // MNCL_TESTS_COMMON_MNCL_TEST_DATA_H

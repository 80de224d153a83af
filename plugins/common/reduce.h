// Plugin kit: element-wise reductions with the semantics of mncl.h, for every dtype and op.
//
//   reduce_into(dst, src, n, dtype, op)  dst[i] = dst[i] op src[i]   (AVG accumulates a SUM)
//   finish_avg(buf, n, dtype, nranks)    buf[i] /= nranks            (after the last reduce_into)
//   Accumulator                          folds many inputs, fp16/bf16 in float32, rounds once
//
// Semantics:
//  - Integer SUM and PROD wrap modulo 2^bits (computed in the unsigned type: no signed overflow).
//  - Integer AVG is the wrapped SUM divided by nranks, truncating toward zero.
//  - Float MIN/MAX propagate NaN (a NaN on any rank gives NaN), like torch.min/max.
//  - reduce_into on fp16/bf16 converts each element to float32, combines, and rounds back: one
//    rounding per call. Accumulator keeps a float32 sum across calls and rounds once at the end,
//    which is both more accurate and what the naive reference backend promises.
// Each op is its own tight loop over plain arrays, so the compiler can vectorize it (GCC needs
// -O3 or -fvect-cost-model=dynamic for loops of unknown length). dst and src may be the same
// array but must not partially overlap.
#pragma once

#include <mncl/mncl.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "common/half.h"

namespace mncl::kit {

// The reference fold of one element over ranks 0..n-1, in rank order, for oracles (the
// conformance tests' expected values, the benchmark's checks): value(r) is rank r's element
// and less(a, b) orders two of them. AVG returns the sum: the caller divides as its dtype does.
template <typename T, typename Value, typename Less>
T fold_ranks(int32_t op, int n, Value value, Less less) {
  T acc = value(0);
  for (int r = 1; r < n; ++r) {
    const T v = value(r);
    switch (op) {
      case MNCL_SUM:
      case MNCL_AVG:
        acc += v;
        break;
      case MNCL_PROD:
        acc *= v;
        break;
      case MNCL_MIN:
        acc = less(v, acc) ? v : acc;
        break;
      case MNCL_MAX:
        acc = less(acc, v) ? v : acc;
        break;
      default:
        break;
    }
  }
  return acc;
}

namespace detail {

// Integer arithmetic modulo 2^bits. The common type with `unsigned` stops uint8_t from being
// promoted to (signed) int, where 255 * 255 * 255 would overflow.
template <typename T>
inline T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  using W = std::common_type_t<U, unsigned>;
  return static_cast<T>(static_cast<U>(W(U(a)) + W(U(b))));
}
template <typename T>
inline T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  using W = std::common_type_t<U, unsigned>;
  return static_cast<T>(static_cast<U>(W(U(a)) * W(U(b))));
}

// One loop per operator; `f` is inlined, leaving a loop the vectorizer understands.
template <typename T, typename F>
inline void zip_into(T *dst, const T *src, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
}

// dst op= src for an arithmetic T (integers and float/double).
template <typename T>
inline bool reduce_arith(T *dst, const T *src, size_t n, int32_t op) {
  switch (op) {
    case MNCL_SUM:
    case MNCL_AVG:
      if constexpr (std::is_integral_v<T>) {
        zip_into(dst, src, n, [](T a, T b) { return wrap_add(a, b); });
      } else {
        zip_into(dst, src, n, [](T a, T b) { return a + b; });
      }
      return true;
    case MNCL_PROD:
      if constexpr (std::is_integral_v<T>) {
        zip_into(dst, src, n, [](T a, T b) { return wrap_mul(a, b); });
      } else {
        zip_into(dst, src, n, [](T a, T b) { return a * b; });
      }
      return true;
    // `b != b` is true only for NaN; a NaN already in a wins since both tests are then false.
    case MNCL_MIN:
      zip_into(dst, src, n, [](T a, T b) { return (b < a || b != b) ? b : a; });
      return true;
    case MNCL_MAX:
      zip_into(dst, src, n, [](T a, T b) { return (b > a || b != b) ? b : a; });
      return true;
    default:
      return false;
  }
}

// acc[i] = acc[i] op float(src[i]) for fp16/bf16 inputs accumulated in float32.
template <typename H>
inline bool reduce_wide(float *acc, const H *src, size_t n, int32_t op) {
  switch (op) {
    case MNCL_SUM:
    case MNCL_AVG:
      for (size_t i = 0; i < n; ++i) acc[i] += to_float(src[i]);
      return true;
    case MNCL_PROD:
      for (size_t i = 0; i < n; ++i) acc[i] *= to_float(src[i]);
      return true;
    case MNCL_MIN:
      for (size_t i = 0; i < n; ++i) {
        const float b = to_float(src[i]);
        acc[i] = (b < acc[i] || b != b) ? b : acc[i];
      }
      return true;
    case MNCL_MAX:
      for (size_t i = 0; i < n; ++i) {
        const float b = to_float(src[i]);
        acc[i] = (b > acc[i] || b != b) ? b : acc[i];
      }
      return true;
    default:
      return false;
  }
}

// Converts in blocks so the float32 scratch stays on the stack and in L1.
template <typename H>
inline bool reduce_half(H *dst, const H *src, size_t n, int32_t op) {
  constexpr size_t kBlock = 1024;
  float wide[kBlock];
  for (size_t done = 0; done < n; done += kBlock) {
    const size_t m = n - done < kBlock ? n - done : kBlock;
    widen(wide, dst + done, m);
    if (!reduce_wide(wide, src + done, m, op)) return false;
    narrow(dst + done, wide, m);
  }
  return true;
}

template <typename T>
inline void divide(T *buf, size_t n, int32_t nranks) {
  if constexpr (std::is_integral_v<T>) {
    // C++ integer division truncates toward zero, as mncl.h specifies for AVG. The divisor is
    // kept at least 32 bits wide: in T it would wrap (int8 and 128 ranks: -128; uint8 and 256
    // ranks: 0); no wider than needed, as 64-bit division is slower on many x86 cores.
    using Wide32 = std::conditional_t<std::is_signed_v<T>, int32_t, uint32_t>;
    using Wide64 = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
    using Wide = std::conditional_t<(sizeof(T) <= 4), Wide32, Wide64>;
    const Wide d = static_cast<Wide>(nranks);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<Wide>(buf[i]) / d);
  } else {
    // A true division (not a multiply by 1/n), to round exactly like "SUM / size".
    const T d = static_cast<T>(nranks);
    for (size_t i = 0; i < n; ++i) buf[i] = buf[i] / d;
  }
}

}  // namespace detail

// dst[i] = dst[i] op src[i] for `count` elements of `dtype`. For MNCL_AVG this is a SUM: call
// finish_avg once after the last input. Returns false for an unknown dtype or op.
inline bool reduce_into(void *dst, const void *src, size_t count, int32_t dtype, int32_t op) {
  bool ok = false;
  const bool known = dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half_v<T>) {
      ok = detail::reduce_half(static_cast<T *>(dst), static_cast<const T *>(src), count, op);
    } else {
      ok = detail::reduce_arith(static_cast<T *>(dst), static_cast<const T *>(src), count, op);
    }
  });
  return known && ok;
}

// buf[i] = buf[i] / nranks (integers truncate toward zero; fp16/bf16 divide in float32 and round
// once). nranks must be >= 1. Returns false for an unknown dtype.
inline bool finish_avg(void *buf, size_t count, int32_t dtype, int32_t nranks) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half_v<T>) {
      T *h = static_cast<T *>(buf);
      const float d = static_cast<float>(nranks);
      for (size_t i = 0; i < count; ++i) h[i] = from_float<T>(to_float(h[i]) / d);
    } else {
      detail::divide(static_cast<T *>(buf), count, nranks);
    }
  });
}

// Folds a sequence of inputs into one result: the first input is copied, each next one is
// combined with `op`, and finish() writes the result (AVG divided by nranks). fp16/bf16 are kept
// in float32 throughout and rounded once in finish(), so N inputs give
// round(((x0 op x1) op x2) ... op xN-1) with every intermediate exact-ish in float32.
// Feed the inputs in the same order everywhere (rank order) to get identical bits everywhere.
class Accumulator {
 public:
  // Allocates the accumulator (count * 4 bytes for fp16/bf16, count * dtype_size otherwise);
  // throws std::bad_alloc when that fails.
  Accumulator(int32_t dtype, int32_t op, size_t count)
      : dtype_(dtype),
        op_(op),
        count_(count),
        half_(dtype == MNCL_FLOAT16 || dtype == MNCL_BFLOAT16) {
    if (half_) {
      wide_.resize(count);
    } else {
      narrow_.resize(count * dtype_size(dtype));
    }
  }

  // Adds the next input: `count` elements of `dtype`. Returns false for an unknown dtype / op.
  bool add(const void *src) {
    const bool first = inputs_++ == 0;
    if (half_) {
      if (dtype_ == MNCL_FLOAT16) return add_wide(static_cast<const float16 *>(src), first);
      return add_wide(static_cast<const bfloat16 *>(src), first);
    }
    if (first) {
      if (!narrow_.empty()) std::memcpy(narrow_.data(), src, narrow_.size());
      return op_ >= 0 && op_ < MNCL_NUM_OPS;
    }
    return reduce_into(narrow_.data(), src, count_, dtype_, op_);
  }

  // Writes the result (count elements of dtype) to dst, which may be one of the inputs.
  // AVG is divided by nranks. Call after at least one add().
  bool finish(void *dst, int32_t nranks) {
    if (half_) {
      if (op_ == MNCL_AVG) detail::divide(wide_.data(), count_, nranks);
      if (dtype_ == MNCL_FLOAT16) {
        narrow(static_cast<float16 *>(dst), wide_.data(), count_);
      } else {
        narrow(static_cast<bfloat16 *>(dst), wide_.data(), count_);
      }
      return true;
    }
    if (op_ == MNCL_AVG && !finish_avg(narrow_.data(), count_, dtype_, nranks)) return false;
    if (!narrow_.empty()) std::memcpy(dst, narrow_.data(), narrow_.size());
    return true;
  }

  size_t inputs() const { return inputs_; }

 private:
  template <typename H>
  bool add_wide(const H *src, bool first) {
    if (first) {
      widen(wide_.data(), src, count_);
      return op_ >= 0 && op_ < MNCL_NUM_OPS;
    }
    return detail::reduce_wide(wide_.data(), src, count_, op_);
  }

  int32_t dtype_;
  int32_t op_;
  size_t count_;
  bool half_;
  size_t inputs_ = 0;
  std::vector<float> wide_;            // fp16 / bf16: the float32 running result
  std::vector<unsigned char> narrow_;  // other dtypes: the running result in the dtype itself
};

}  // namespace mncl::kit

// The two inner loops of the shm backend: folding n inputs in rank order, and copying out with
// non-temporal stores.
//
// fold() computes dst = ((src[0] op src[1]) op src[2]) ... op src[n-1] element-wise, AVG then
// divided by n; fp16/bf16 go through float32 and are rounded once. That is exactly the order
// and arithmetic of kit::Accumulator fed in rank order, which the naive backend uses, so the
// results are bit-identical to naive for every dtype and op, floats included, whichever
// algorithm (single-phase or reduce-scatter + allgather) produced them.
//
// It works in blocks of ~8 KiB of dst so the running result stays in L1 while each input
// streams through once; the per-op loops are the kit's (vectorized with the kit target's
// -fvect-cost-model=dynamic). The fp16/bf16 path uses kit::detail's widening loops: the kit has
// no public "fold many inputs in float32 into a caller buffer" entry point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/half.h"
#include "common/reduce.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace mncl::shm {

namespace kit = mncl::kit;

namespace detail {

template <typename T>
void fold_typed(T *dst, const T *const *src, int n, size_t count, int32_t op) {
  constexpr size_t kBlock = 8192 / sizeof(T);
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t m = count - off < kBlock ? count - off : kBlock;
    std::memcpy(dst + off, src[0] + off, m * sizeof(T));
    for (int p = 1; p < n; ++p) kit::detail::reduce_arith(dst + off, src[p] + off, m, op);
    if (op == MNCL_AVG) kit::detail::divide(dst + off, m, n);
  }
}

template <typename H>
void fold_half(H *dst, const H *const *src, int n, size_t count, int32_t op) {
  constexpr size_t kBlock = 1024;
  float wide[kBlock];
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t m = count - off < kBlock ? count - off : kBlock;
    kit::widen(wide, src[0] + off, m);
    for (int p = 1; p < n; ++p) kit::detail::reduce_wide(wide, src[p] + off, m, op);
    if (op == MNCL_AVG) kit::detail::divide(wide, m, n);
    kit::narrow(dst + off, wide, m);
  }
}

}  // namespace detail

// src[p] for p in [0, n): count elements each; dst must not overlap any of them.
inline void fold(void *dst, const void *const *src, int n, size_t count, int32_t dtype,
                 int32_t op) {
  kit::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kit::is_half_v<T>) {
      detail::fold_half(static_cast<T *>(dst), reinterpret_cast<const T *const *>(src), n, count,
                        op);
    } else {
      detail::fold_typed(static_cast<T *>(dst), reinterpret_cast<const T *const *>(src), n, count,
                         op);
    }
  });
}

// memcpy whose stores bypass the cache: for output that will not be read again soon, it saves
// the read-for-ownership of every destination line (a third of a copy's DRAM traffic).
inline void stream_copy(void *dst, const void *src, size_t len) {
#if defined(__SSE2__)
  auto *d = static_cast<unsigned char *>(dst);
  const auto *s = static_cast<const unsigned char *>(src);
  size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
  if (head > len) head = len;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  len -= head;
  const size_t body = len / 64 * 64;
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + i + 48), e);
  }
  _mm_sfence();  // order the streaming stores before whatever signals completion
  std::memcpy(d + body, s + body, len - body);
#else
  std::memcpy(dst, src, len);
#endif
}

}  // namespace mncl::shm

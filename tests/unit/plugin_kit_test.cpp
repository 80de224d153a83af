// The plugin kit (plugins/common): fp16/bf16 conversions against known bit patterns, and the
// reductions of every dtype x op against mncl.h's semantics (wrap, truncating AVG, NaN).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/half.h"
#include "common/host.h"
#include "common/reduce.h"

namespace kit = mncl::kit;

namespace {

float f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t bits32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint16_t h(float f) {
  return kit::float_to_float16_bits(f);
}
uint16_t bf(float f) {
  return kit::float_to_bfloat16_bits(f);
}
bool is_half_nan(uint16_t x) {
  return (x & 0x7c00u) == 0x7c00u && (x & 0x03ffu) != 0;
}

// ---------------------------------------------------------------------------------------------
// float16
// ---------------------------------------------------------------------------------------------

TEST(Float16, KnownValuesFromFloat) {
  EXPECT_EQ(h(0.0f), 0x0000);
  EXPECT_EQ(h(-0.0f), 0x8000);
  EXPECT_EQ(h(1.0f), 0x3c00);
  EXPECT_EQ(h(-2.0f), 0xc000);
  EXPECT_EQ(h(0.5f), 0x3800);
  EXPECT_EQ(h(0.333333343f), 0x3555);
  EXPECT_EQ(h(65504.0f), 0x7bff);         // largest finite
  EXPECT_EQ(h(0x1p-14f), 0x0400);         // smallest normal
  EXPECT_EQ(h(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(h(1023 * 0x1p-24f), 0x03ff);  // largest subnormal
  EXPECT_EQ(h(-0x1p-24f), 0x8001);
  EXPECT_EQ(h(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(h(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(Float16, RoundsToNearestEven) {
  EXPECT_EQ(h(1.0f + 0x1p-11f), 0x3c00);             // tie, even below
  EXPECT_EQ(h(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie, even above
  EXPECT_EQ(h(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above the tie
  EXPECT_EQ(h(2049.0f), 0x6800);                     // 2048 | 2050: tie to 2048
  EXPECT_EQ(h(2051.0f), 0x6802);                     // 2050 | 2052: tie to 2052
  EXPECT_EQ(h(65519.0f), 0x7bff);                    // below the 65520 tie
  EXPECT_EQ(h(65520.0f), 0x7c00);                    // tie with "65536" rounds to even: inf
  EXPECT_EQ(h(1e6f), 0x7c00);                        // overflow
  EXPECT_EQ(h(-1e6f), 0xfc00);
  EXPECT_EQ(h(0x1p-25f), 0x0000);  // tie between 0 and 2^-24: even = 0
  EXPECT_EQ(h(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(h(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2 (subnormal units)
  EXPECT_EQ(h(5 * 0x1p-25f), 0x0002);  // tie between 2 and 3
  EXPECT_EQ(h(1e-10f), 0x0000);        // underflow keeps the sign
  EXPECT_EQ(h(-1e-10f), 0x8000);
  EXPECT_EQ(h(f32(0x00000001)), 0x0000);  // float subnormals
  EXPECT_EQ(h(2047 * 0x1p-25f), 0x0400);  // largest subnormal rounds up to normal
}

TEST(Float16, NaN) {
  EXPECT_TRUE(is_half_nan(h(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_half_nan(h(f32(0x7f800001))));  // payload in the dropped bits: still NaN
  EXPECT_TRUE(is_half_nan(h(f32(0xffc00000))));
  EXPECT_EQ(h(f32(0xffc00000)) & 0x8000, 0x8000);  // sign kept
  EXPECT_TRUE(std::isnan(kit::float16_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(kit::float16_bits_to_float(0x7c01)));
  EXPECT_TRUE(std::isnan(kit::float16_bits_to_float(0xfe00)));
}

TEST(Float16, ToFloatKnownValues) {
  EXPECT_EQ(kit::float16_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(kit::float16_bits_to_float(0xc000), -2.0f);
  EXPECT_EQ(kit::float16_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(kit::float16_bits_to_float(0x0400), 0x1p-14f);
  EXPECT_EQ(kit::float16_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(kit::float16_bits_to_float(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(kit::float16_bits_to_float(0x8001), -0x1p-24f);
  EXPECT_EQ(bits32(kit::float16_bits_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(kit::float16_bits_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(kit::float16_bits_to_float(0xfc00), -std::numeric_limits<float>::infinity());
}

// Every non-NaN half survives half -> float -> half.
TEST(Float16, RoundTripsEveryValue) {
  for (uint32_t x = 0; x <= 0xffffu; ++x) {
    const uint16_t v = static_cast<uint16_t>(x);
    const uint16_t back = h(kit::float16_bits_to_float(v));
    if (is_half_nan(v)) {
      EXPECT_TRUE(is_half_nan(back)) << std::hex << x;
    } else {
      ASSERT_EQ(back, v) << std::hex << x;
    }
  }
}

// Around every midpoint between adjacent positive halves: the tie goes to the even one, one
// float ulp either side goes to the nearer one. Covers subnormals, normals and overflow.
TEST(Float16, EveryMidpointRoundsCorrectly) {
  for (uint32_t x = 0; x < 0x7c00u; ++x) {
    const double a = kit::float16_bits_to_float(static_cast<uint16_t>(x));
    const double b =
        x == 0x7bffu ? 65536.0 : kit::float16_bits_to_float(static_cast<uint16_t>(x + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact: needs 12 significant bits
    ASSERT_EQ(h(mid), (x & 1u) ? x + 1 : x) << std::hex << x;
    ASSERT_EQ(h(std::nextafter(mid, 0.0f)), x) << std::hex << x;
    ASSERT_EQ(h(std::nextafter(mid, 1e9f)), x + 1) << std::hex << x;
    ASSERT_EQ(h(-mid), 0x8000u | ((x & 1u) ? x + 1 : x)) << std::hex << x;
  }
}

// ---------------------------------------------------------------------------------------------
// bfloat16
// ---------------------------------------------------------------------------------------------

TEST(BFloat16, KnownValues) {
  EXPECT_EQ(bf(1.0f), 0x3f80);
  EXPECT_EQ(bf(-2.0f), 0xc000);
  EXPECT_EQ(bf(0.0f), 0x0000);
  EXPECT_EQ(bf(-0.0f), 0x8000);
  EXPECT_EQ(bf(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(kit::bfloat16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(kit::bfloat16_bits_to_float(0x0001), f32(0x00010000));  // subnormal
  EXPECT_EQ(kit::bfloat16_bits_to_float(0xff80), -std::numeric_limits<float>::infinity());
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(bf(1.0f + 0x1p-8f), 0x3f80);      // tie, even below
  EXPECT_EQ(bf(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie, even above
  EXPECT_EQ(bf(f32(0x3f808001)), 0x3f81);     // just above the tie
  EXPECT_EQ(bf(f32(0x3f807fff)), 0x3f80);     // just below
  EXPECT_EQ(bf(f32(0x7f7fffff)), 0x7f80);     // FLT_MAX rounds up to inf
  EXPECT_EQ(bf(f32(0x7f7f7fff)), 0x7f7f);     // largest that stays finite
  EXPECT_EQ(bf(f32(0x00008000)), 0x0000);     // subnormal tie to even (0)
  EXPECT_EQ(bf(f32(0x00018000)), 0x0002);     // subnormal tie to even (2)
  EXPECT_EQ(bf(f32(0x00008001)), 0x0001);
}

TEST(BFloat16, NaN) {
  const uint16_t n = bf(f32(0x7f800001));  // payload only in the dropped half
  EXPECT_EQ(n & 0x7f80, 0x7f80);
  EXPECT_NE(n & 0x007f, 0);
  EXPECT_TRUE(std::isnan(kit::bfloat16_bits_to_float(bf(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf(f32(0xffc00000)), 0xffc0);
  EXPECT_TRUE(std::isnan(kit::bfloat16_bits_to_float(0x7f81)));
}

// ---------------------------------------------------------------------------------------------
// dtype traits
// ---------------------------------------------------------------------------------------------

TEST(Dtype, SizesNamesDispatch) {
  const size_t sizes[MNCL_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  for (int d = 0; d < MNCL_NUM_DTYPES; ++d) {
    EXPECT_EQ(kit::dtype_size(d), sizes[d]) << d;
    size_t seen = 0;
    EXPECT_TRUE(
        kit::dispatch_dtype(d, [&](auto tag) { seen = sizeof(typename decltype(tag)::type); }));
    EXPECT_EQ(seen, sizes[d]) << d;
    EXPECT_STRNE(kit::dtype_name(d), "unknown");
  }
  EXPECT_EQ(kit::dtype_size(MNCL_NUM_DTYPES), 0u);
  EXPECT_FALSE(kit::dispatch_dtype(-1, [](auto) {}));
  EXPECT_STREQ(kit::dtype_name(MNCL_BFLOAT16), "bfloat16");
  EXPECT_STREQ(kit::op_name(MNCL_AVG), "avg");
  EXPECT_STREQ(kit::op_name(99), "unknown");
  EXPECT_EQ(kit::kAllDtypesMask, 0x3ffu);
  EXPECT_EQ(kit::kAllOpsMask, 0x1fu);
}

// ---------------------------------------------------------------------------------------------
// Reductions: every dtype x op against a double-precision reference on small exact values.
// ---------------------------------------------------------------------------------------------

// Element i of input r: small values, negative ones for signed and float types.
double input_value(int dtype, int r, size_t i) {
  const bool is_signed = dtype == MNCL_INT8 || dtype == MNCL_INT32 || dtype == MNCL_INT64 ||
                         kit::dtype_is_float(dtype);
  const int v = static_cast<int>((i * 7 + static_cast<size_t>(r) * 3) % 9);  // 0..8
  return is_signed ? v - 4 : v;                                              // -4..4 or 0..8
}

template <typename T>
T from_double(double v) {
  if constexpr (kit::is_half_v<T>) {
    return kit::from_float<T>(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <typename T>
double to_double(T v) {
  if constexpr (kit::is_half_v<T>) {
    return kit::to_float(v);
  } else {
    return static_cast<double>(v);
  }
}

double reference(int dtype, int op, int nranks, size_t i) {
  double acc = input_value(dtype, 0, i);
  for (int r = 1; r < nranks; ++r) {
    const double x = input_value(dtype, r, i);
    switch (op) {
      case MNCL_SUM:
      case MNCL_AVG:
        acc += x;
        break;
      case MNCL_PROD:
        acc *= x;
        break;
      case MNCL_MIN:
        acc = std::min(acc, x);
        break;
      case MNCL_MAX:
        acc = std::max(acc, x);
        break;
    }
  }
  if (op == MNCL_AVG) acc = kit::dtype_is_float(dtype) ? acc / nranks : std::trunc(acc / nranks);
  return acc;
}

class ReduceAll : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(ReduceAll, ReduceIntoAndAccumulatorMatchReference) {
  const auto [dtype, op, nranks] = GetParam();
  const size_t n = 37;  // not a multiple of any vector width
  kit::dispatch_dtype(dtype, [&, dtype = dtype, op = op, nranks = nranks](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<std::vector<T>> in(nranks, std::vector<T>(n));
    for (int r = 0; r < nranks; ++r) {
      for (size_t i = 0; i < n; ++i) in[r][i] = from_double<T>(input_value(dtype, r, i));
    }
    // Pairwise: dst op= src, then finish_avg.
    std::vector<T> dst = in[0];
    for (int r = 1; r < nranks; ++r) {
      ASSERT_TRUE(kit::reduce_into(dst.data(), in[r].data(), n, dtype, op));
    }
    if (op == MNCL_AVG) {
      ASSERT_TRUE(kit::finish_avg(dst.data(), n, dtype, nranks));
    }
    // Accumulator, writing over one of its own inputs.
    kit::Accumulator acc(dtype, op, n);
    for (int r = 0; r < nranks; ++r) ASSERT_TRUE(acc.add(in[r].data()));
    std::vector<T> out = in[0];
    ASSERT_TRUE(acc.finish(out.data(), nranks));
    for (size_t i = 0; i < n; ++i) {
      const T want = from_double<T>(reference(dtype, op, nranks, i));
      ASSERT_EQ(to_double(dst[i]), to_double(want))
          << kit::dtype_name(dtype) << " " << kit::op_name(op) << " n=" << nranks << " i=" << i;
      ASSERT_EQ(to_double(out[i]), to_double(want))
          << kit::dtype_name(dtype) << " " << kit::op_name(op) << " n=" << nranks << " i=" << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(EveryDtypeOp, ReduceAll,
                         ::testing::Combine(::testing::Range(0, MNCL_NUM_DTYPES),
                                            ::testing::Range(0, MNCL_NUM_OPS),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const auto &info) {
                           return std::string(kit::dtype_name(std::get<0>(info.param))) + "_" +
                                  kit::op_name(std::get<1>(info.param)) + "_" +
                                  std::to_string(std::get<2>(info.param));
                         });

template <typename T>
T reduce2(T a, T b, int dtype, int op) {
  EXPECT_TRUE(kit::reduce_into(&a, &b, 1, dtype, op));
  return a;
}

TEST(Reduce, IntegerSumWraps) {
  EXPECT_EQ(reduce2<int8_t>(100, 100, MNCL_INT8, MNCL_SUM), -56);
  EXPECT_EQ(reduce2<int8_t>(-128, -1, MNCL_INT8, MNCL_SUM), 127);
  EXPECT_EQ(reduce2<uint8_t>(200, 100, MNCL_UINT8, MNCL_SUM), 44);
  EXPECT_EQ(reduce2<int32_t>(INT32_MAX, 1, MNCL_INT32, MNCL_SUM), INT32_MIN);
  EXPECT_EQ(reduce2<uint32_t>(UINT32_MAX, 2, MNCL_UINT32, MNCL_SUM), 1u);
  EXPECT_EQ(reduce2<int64_t>(INT64_MAX, 1, MNCL_INT64, MNCL_SUM), INT64_MIN);
  EXPECT_EQ(reduce2<uint64_t>(UINT64_MAX, 1, MNCL_UINT64, MNCL_SUM), 0u);
}

TEST(Reduce, IntegerProdWraps) {
  EXPECT_EQ(reduce2<int8_t>(16, 16, MNCL_INT8, MNCL_PROD), 0);
  EXPECT_EQ(reduce2<int8_t>(-128, -1, MNCL_INT8, MNCL_PROD), -128);
  EXPECT_EQ(reduce2<int8_t>(12, 11, MNCL_INT8, MNCL_PROD), static_cast<int8_t>(132 - 256));
  EXPECT_EQ(reduce2<uint8_t>(255, 255, MNCL_UINT8, MNCL_PROD), 1);
  EXPECT_EQ(reduce2<int32_t>(65536, 65536, MNCL_INT32, MNCL_PROD), 0);
  EXPECT_EQ(reduce2<int32_t>(INT32_MIN, -1, MNCL_INT32, MNCL_PROD), INT32_MIN);
  EXPECT_EQ(reduce2<uint32_t>(UINT32_MAX, UINT32_MAX, MNCL_UINT32, MNCL_PROD), 1u);
  EXPECT_EQ(reduce2<int64_t>(int64_t{1} << 32, int64_t{1} << 32, MNCL_INT64, MNCL_PROD), 0);
  EXPECT_EQ(reduce2<int64_t>(INT64_MIN, -1, MNCL_INT64, MNCL_PROD), INT64_MIN);
  EXPECT_EQ(reduce2<uint64_t>(UINT64_MAX, UINT64_MAX, MNCL_UINT64, MNCL_PROD), 1u);
}

TEST(Reduce, MinMaxExtremes) {
  EXPECT_EQ(reduce2<int64_t>(INT64_MIN, INT64_MAX, MNCL_INT64, MNCL_MIN), INT64_MIN);
  EXPECT_EQ(reduce2<int64_t>(INT64_MIN, INT64_MAX, MNCL_INT64, MNCL_MAX), INT64_MAX);
  EXPECT_EQ(reduce2<uint64_t>(UINT64_MAX, 0, MNCL_UINT64, MNCL_MIN), 0u);
  EXPECT_EQ(reduce2<int8_t>(-128, 127, MNCL_INT8, MNCL_MAX), 127);
  EXPECT_EQ(reduce2<uint8_t>(255, 0, MNCL_UINT8, MNCL_MAX), 255);
}

// AVG = wrapped SUM / nranks, truncating toward zero.
TEST(Reduce, IntegerAvgTruncatesTowardZero) {
  std::vector<int32_t> a = {-7, 7, -1, 5};
  ASSERT_TRUE(kit::finish_avg(a.data(), a.size(), MNCL_INT32, 3));
  EXPECT_EQ(a, (std::vector<int32_t>{-2, 2, 0, 1}));
  std::vector<int64_t> b = {INT64_MIN, -5};
  ASSERT_TRUE(kit::finish_avg(b.data(), b.size(), MNCL_INT64, 2));
  EXPECT_EQ(b, (std::vector<int64_t>{INT64_MIN / 2, -2}));
  // More ranks than the dtype holds: the divisor must not wrap (int8: 200 -> -56; uint8: 256
  // -> 0, a division by zero), nor a uint64 sum pass through a signed type.
  std::vector<int8_t> c = {-128, 127, 100};
  ASSERT_TRUE(kit::finish_avg(c.data(), c.size(), MNCL_INT8, 200));
  EXPECT_EQ(c, (std::vector<int8_t>{0, 0, 0}));
  ASSERT_TRUE(kit::finish_avg(c.data(), 0, MNCL_INT8, 100));
  std::vector<int8_t> d = {-128, 127};
  ASSERT_TRUE(kit::finish_avg(d.data(), d.size(), MNCL_INT8, 64));
  EXPECT_EQ(d, (std::vector<int8_t>{-2, 1}));
  std::vector<uint8_t> e = {255, 200};
  ASSERT_TRUE(kit::finish_avg(e.data(), e.size(), MNCL_UINT8, 256));
  EXPECT_EQ(e, (std::vector<uint8_t>{0, 0}));
  ASSERT_TRUE(kit::finish_avg(e.data(), e.size(), MNCL_UINT8, 1));
  std::vector<uint64_t> f = {UINT64_MAX};
  ASSERT_TRUE(kit::finish_avg(f.data(), f.size(), MNCL_UINT64, 3));
  EXPECT_EQ(f, (std::vector<uint64_t>{UINT64_MAX / 3}));
  // uint8 {255, 255}: the SUM wraps to 254 first, then 254 / 2.
  kit::Accumulator u8(MNCL_UINT8, MNCL_AVG, 1);
  const uint8_t x = 255;
  u8.add(&x);
  u8.add(&x);
  uint8_t out = 0;
  u8.finish(&out, 2);
  EXPECT_EQ(out, 127);
  // int8 {100, 100}: SUM wraps to -56, / 2 = -28.
  kit::Accumulator i8(MNCL_INT8, MNCL_AVG, 1);
  const int8_t y = 100;
  i8.add(&y);
  i8.add(&y);
  int8_t out8 = 0;
  i8.finish(&out8, 2);
  EXPECT_EQ(out8, -28);
}

TEST(Reduce, FloatMinMaxPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int op : {MNCL_MIN, MNCL_MAX, MNCL_SUM, MNCL_PROD}) {
    EXPECT_TRUE(std::isnan(reduce2<float>(nan, 1.0f, MNCL_FLOAT32, op))) << op;
    EXPECT_TRUE(std::isnan(reduce2<float>(1.0f, nan, MNCL_FLOAT32, op))) << op;
    EXPECT_TRUE(std::isnan(reduce2<double>(1.0, nan, MNCL_FLOAT64, op))) << op;
    EXPECT_TRUE(is_half_nan(reduce2<kit::float16>({0x3c00}, {0x7e00}, MNCL_FLOAT16, op).bits));
    EXPECT_TRUE(is_half_nan(reduce2<kit::float16>({0x7e00}, {0x3c00}, MNCL_FLOAT16, op).bits));
  }
  EXPECT_EQ(reduce2<float>(-1.0f, 2.0f, MNCL_FLOAT32, MNCL_MIN), -1.0f);
  EXPECT_EQ(reduce2<float>(-1.0f, 2.0f, MNCL_FLOAT32, MNCL_MAX), 2.0f);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(reduce2<float>(-inf, 2.0f, MNCL_FLOAT32, MNCL_MIN), -inf);
}

// fp16: pairwise reduce_into rounds at every step; the Accumulator rounds once.
TEST(Reduce, HalfAccumulatorRoundsOnce) {
  const kit::float16 big = kit::from_float<kit::float16>(2048.0f);
  const kit::float16 one = kit::from_float<kit::float16>(1.0f);
  kit::float16 pairwise = big;
  kit::reduce_into(&pairwise, &one, 1, MNCL_FLOAT16, MNCL_SUM);  // 2049 -> 2048 (tie, even)
  kit::reduce_into(&pairwise, &one, 1, MNCL_FLOAT16, MNCL_SUM);
  EXPECT_EQ(kit::to_float(pairwise), 2048.0f);
  kit::Accumulator acc(MNCL_FLOAT16, MNCL_SUM, 1);
  acc.add(&big);
  acc.add(&one);
  acc.add(&one);
  kit::float16 once{};
  acc.finish(&once, 3);
  EXPECT_EQ(kit::to_float(once), 2050.0f);

  // bf16 AVG of {1, 2, 4}: 7/3 in float32, rounded once to bf16.
  kit::Accumulator avg(MNCL_BFLOAT16, MNCL_AVG, 1);
  for (float v : {1.0f, 2.0f, 4.0f}) {
    const kit::bfloat16 b = kit::from_float<kit::bfloat16>(v);
    avg.add(&b);
  }
  kit::bfloat16 r{};
  avg.finish(&r, 3);
  EXPECT_EQ(r.bits, bf(7.0f / 3.0f));
}

TEST(Reduce, LongArraysAndUnknownArguments) {
  const size_t n = 5000;  // crosses the fp16 block size
  std::vector<kit::float16> a(n, kit::from_float<kit::float16>(1.5f));
  std::vector<kit::float16> b(n, kit::from_float<kit::float16>(2.0f));
  ASSERT_TRUE(kit::reduce_into(a.data(), b.data(), n, MNCL_FLOAT16, MNCL_PROD));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(kit::to_float(a[i]), 3.0f) << i;
  std::vector<int32_t> c(n, 3);
  ASSERT_TRUE(kit::reduce_into(c.data(), c.data(), n, MNCL_INT32, MNCL_SUM));  // same array
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(c[i], 6) << i;
  EXPECT_FALSE(kit::reduce_into(c.data(), c.data(), n, MNCL_INT32, 17));
  EXPECT_FALSE(kit::reduce_into(c.data(), c.data(), n, 42, MNCL_SUM));
  EXPECT_FALSE(kit::finish_avg(c.data(), n, 42, 2));
  EXPECT_TRUE(kit::reduce_into(nullptr, nullptr, 0, MNCL_FLOAT16, MNCL_SUM));
}

// ---------------------------------------------------------------------------------------------
// Host helpers
// ---------------------------------------------------------------------------------------------

std::string g_error;
int g_logs = 0;
void test_set_error(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  g_error = kit::vformat(fmt, args);
  va_end(args);
}
void test_log(int32_t, const char *, int32_t, const char *, ...) {
  ++g_logs;
}

TEST(Host, ReportGuardLogCopy) {
  mncl_host_v1_t host{sizeof(mncl_host_v1_t), MNCL_VERSION, MNCL_LOG_WARN, test_log,
                      test_set_error,         nullptr};
  ASSERT_TRUE(kit::host_is_usable(&host));
  EXPECT_EQ(kit::report(&host, MNCL_ERR_TIMEOUT, "op #%d: %s", 3, "late"), MNCL_ERR_TIMEOUT);
  EXPECT_EQ(g_error, "op #3: late");
  EXPECT_EQ(kit::report(&host, MNCL_ERR_REMOTE, "%s", "100% literal"), MNCL_ERR_REMOTE);
  EXPECT_EQ(g_error, "100% literal");

  EXPECT_EQ(kit::guard(&host, "x", [] { return MNCL_OK; }), MNCL_OK);
  EXPECT_EQ(kit::guard(&host, "x",
                       []() -> mncl_status_t { throw kit::Error(MNCL_ERR_REMOTE, "peer gone"); }),
            MNCL_ERR_REMOTE);
  EXPECT_EQ(g_error, "peer gone");
  g_error = "kept";
  EXPECT_EQ(kit::guard(&host, "x", []() -> mncl_status_t { throw kit::Error(MNCL_ERR_ABORTED); }),
            MNCL_ERR_ABORTED);
  EXPECT_EQ(g_error, "kept");  // no message: the host's stays
  EXPECT_EQ(
      kit::guard(&host, "naive x", []() -> mncl_status_t { throw std::runtime_error("boom"); }),
      MNCL_ERR_INTERNAL);
  EXPECT_EQ(g_error, "naive x: internal error: boom");
  EXPECT_EQ(kit::guard(&host, "x", []() -> mncl_status_t { throw std::bad_alloc(); }),
            MNCL_ERR_SYSTEM);
  EXPECT_EQ(kit::guard(&host, "x", []() -> mncl_status_t { throw 42; }), MNCL_ERR_INTERNAL);

  int evaluated = 0;
  MNCL_KIT_LOG(&host, MNCL_LOG_TRACE, "%d", ++evaluated);  // above the level: not evaluated
  EXPECT_EQ(evaluated, 0);
  EXPECT_EQ(g_logs, 0);
  MNCL_KIT_LOG(&host, MNCL_LOG_ERROR, "%d", ++evaluated);
  EXPECT_EQ(g_logs, 1);
  MNCL_KIT_LOG(nullptr, MNCL_LOG_ERROR, "no host: no crash");

  char buf[6];
  kit::copy_cstr(buf, sizeof buf, "abcdefgh");
  EXPECT_STREQ(buf, "abcde");
  kit::copy_cstr(buf, sizeof buf, nullptr);
  EXPECT_STREQ(buf, "");
  kit::copy_cstr(buf, 0, "x");  // no write at all
  kit::copy_cstr(nullptr, 10, "x");
}

// Byte-count settings (MNCL_SHM_CHUNK, MNCL_FLAT_RING_MIN_BYTES): suffixes, and no value that
// wraps around or hides a sign is taken for another.
TEST(Host, ParseBytes) {
  size_t v = 7;
  EXPECT_TRUE(kit::parse_bytes("65536", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(kit::parse_bytes("0", &v));
  EXPECT_EQ(v, 0u);
  EXPECT_TRUE(kit::parse_bytes("64K", &v));
  EXPECT_EQ(v, size_t{64} << 10);
  EXPECT_TRUE(kit::parse_bytes("1m", &v));
  EXPECT_EQ(v, size_t{1} << 20);
  EXPECT_TRUE(kit::parse_bytes("2G", &v));
  EXPECT_EQ(v, size_t{2} << 30);
  v = 7;
  for (const char *bad : {"", "K", "-1", " -1", " 5", "+5", "5KB", "5 K", "1.5M",
                          "17179869184G",             // 2^64 bytes: would wrap to 0
                          "17179869185G",             // would wrap to 1 GiB
                          "18446744073709551616"}) {  // past unsigned long long
    EXPECT_FALSE(kit::parse_bytes(bad, &v)) << bad;
  }
  EXPECT_EQ(v, 7u);  // untouched by a refusal

  mncl_host_v1_t host{sizeof(mncl_host_v1_t), MNCL_VERSION, MNCL_LOG_WARN, test_log,
                      test_set_error,         nullptr};
  static const char *g_value;
  g_value = nullptr;
  host.get_env = [](const char *) -> const char * { return g_value; };
  size_t setting = 99;
  EXPECT_EQ(kit::read_size(&host, "MNCL_X", 1, 100, &setting), MNCL_OK);  // unset: left alone
  EXPECT_EQ(setting, 99u);
  g_value = "64";
  EXPECT_EQ(kit::read_size(&host, "MNCL_X", 1, 100, &setting), MNCL_OK);
  EXPECT_EQ(setting, 64u);
  g_value = "1K";
  EXPECT_EQ(kit::read_size(&host, "MNCL_X", 1, 100, &setting), MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(g_error, "MNCL_X='1K' is not a number between 1 and 100 (K, M, G: 2^10, 2^20, 2^30)");
  EXPECT_EQ(setting, 64u);
}

}  // namespace

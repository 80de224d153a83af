// Self-test of mncl-perf's -c check (data.cpp): feeds count_wrong() correct results, which must
// give 0 wrong elements, and results taken from the wrong rank, block or round, which must be
// caught; and the tolerance rule of reductions: exact where no order of operations rounds (MIN,
// MAX, PROD, small sums), equal infinities equal, a tolerance only where the order (or AVG's
// division) may round. Runs without a communicator (no backend, no launcher).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "collectives.h"
#include "common/half.h"
#include "data.h"

using namespace mncl::perf;

namespace {

int failures = 0;

void expect(bool ok, const char *what, long long wrong) {
  std::printf("%-70s count_wrong=%lld %s\n", what, wrong, ok ? "OK" : "FAILED");
  if (!ok) ++failures;
}

double reduce_sum(int n, size_t index, int round) {
  double s = 0;
  for (int q = 0; q < n; ++q) s += input_value(MNCL_FLOAT32, MNCL_SUM, q, index, round);
  return s;
}

struct Buffers {
  std::vector<float> send, recv;
  Buffers(const Layout &l)
      : send(std::max(l.send_elems, l.recv_elems) + 1),
        recv(std::max(l.send_elems, l.recv_elems) + 1) {}
};

Call call(CollKind k, const Layout &l, Buffers &b, int rank, int n) {
  return make_call(k, l, false, b.send.data(), b.recv.data(), 4, MNCL_FLOAT32, MNCL_SUM, 0, rank,
                   n);
}

// Fills block q (of l.count elements) of b.recv with rank src(q)'s input from element `first`
// on: what a gather-like collective delivers, right or wrong.
template <typename Source>
void fill_blocks(Buffers &b, const Layout &l, int n, int round, size_t first, Source src) {
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < l.count; ++i) {
      b.recv[q * l.count + i] =
          float(input_value(MNCL_FLOAT32, MNCL_SUM, src(q), first + i, round));
    }
  }
}

// A result buffer of any dtype: what a backend would have written into recvbuf.
struct Typed {
  mncl_dtype_t dtype;
  size_t elem;
  std::vector<unsigned char> send, recv;
  Typed(mncl_dtype_t d, const Layout &l)
      : dtype(d),
        elem(mncl_dtype_size(d)),
        send((std::max(l.send_elems, l.recv_elems) + 1) * 8),
        recv((std::max(l.send_elems, l.recv_elems) + 1) * 8) {}
  // Stores v rounded to the dtype (round to nearest even; overflow gives infinity).
  void set(size_t i, double v) { encode(recv.data() + i * elem, v); }
  double get(size_t i) const { return decode(recv.data() + i * elem); }
  // v as the dtype holds it.
  double round(double v) const {
    unsigned char tmp[8];
    encode(tmp, v);
    return decode(tmp);
  }
  void encode(unsigned char *p, double v) const {
    uint16_t h;
    float f;
    switch (dtype) {
      case MNCL_FLOAT16:
        h = mncl::kit::float_to_float16_bits(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        return;
      case MNCL_BFLOAT16:
        h = mncl::kit::float_to_bfloat16_bits(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        return;
      case MNCL_FLOAT32:
        f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        return;
      default:
        std::memcpy(p, &v, 8);
        return;
    }
  }
  double decode(const unsigned char *p) const {
    uint16_t h;
    float f;
    double d;
    switch (dtype) {
      case MNCL_FLOAT16:
        std::memcpy(&h, p, 2);
        return mncl::kit::float16_bits_to_float(h);
      case MNCL_BFLOAT16:
        std::memcpy(&h, p, 2);
        return mncl::kit::bfloat16_bits_to_float(h);
      case MNCL_FLOAT32:
        std::memcpy(&f, p, 4);
        return f;
      default:
        std::memcpy(&d, p, 8);
        return d;
    }
  }
  Call call(CollKind k, const Layout &l, mncl_op_t op, int rank, int n) {
    return make_call(k, l, false, send.data(), recv.data(), elem, dtype, op, 0, rank, n);
  }
};

// Element i of an allreduce of n ranks, folded in rank order with the dtype's rounding after
// every step (each_step), or exactly in double and rounded once (!each_step).
double fold(const Typed &t, mncl_op_t op, int n, size_t i, int round, bool each_step) {
  double acc = 0;
  for (int q = 0; q < n; ++q) {
    const double x = input_value(t.dtype, op, q, i, round);
    if (q == 0) {
      acc = x;
    } else if (op == MNCL_PROD) {
      acc *= x;
    } else if (op == MNCL_MIN) {
      acc = std::min(acc, x);
    } else if (op == MNCL_MAX) {
      acc = std::max(acc, x);
    } else {
      acc += x;
    }
    if (each_step) acc = t.round(acc);
  }
  return t.round(acc);
}

// The reductions' tolerance rule (data.cpp tolerance()).
void tolerance_cases() {
  const int round = 0;
  // float16 PROD at 32 ranks: products of 1s and 2s, 2^16 and beyond overflow to infinity (in any
  // order, as every factor is >= 1). The correct result has infinities, which must pass.
  {
    const int n = 32;
    const Layout l = layout_for(CollKind::kAllreduce, 512, 2, n);
    Typed t(MNCL_FLOAT16, l);
    const Call c = t.call(CollKind::kAllreduce, l, MNCL_PROD, 1, n);
    std::vector<double> want(l.count);
    for (size_t i = 0; i < l.count; ++i) want[i] = fold(t, MNCL_PROD, n, i, round, true);
    int infinities = 0;
    for (size_t i = 0; i < l.count; ++i) {
      t.set(i, want[i]);
      infinities += std::isinf(want[i]) ? 1 : 0;
    }
    expect(infinities > 0 && count_wrong(c, l, round) == 0,
           "allreduce float16 prod n=32 correct, with infinities", count_wrong(c, l, round));
    // An infinity where a finite product belongs is wrong.
    for (size_t i = 0; i < l.count; ++i) {
      if (!std::isinf(want[i])) {
        t.set(i, INFINITY);
        break;
      }
    }
    expect(count_wrong(c, l, round) == 1, "allreduce float16 prod n=32 one finite result as inf",
           count_wrong(c, l, round));
  }
  // float32 MIN, MAX and PROD are exact in any order: one ulp off is wrong.
  for (mncl_op_t op : {MNCL_MIN, MNCL_MAX, MNCL_PROD}) {
    const int n = 8;
    const Layout l = layout_for(CollKind::kAllreduce, 256, 4, n);
    Typed t(MNCL_FLOAT32, l);
    const Call c = t.call(CollKind::kAllreduce, l, op, 2, n);
    for (size_t i = 0; i < l.count; ++i) t.set(i, fold(t, op, n, i, round, true));
    const char *name = op == MNCL_MIN ? "min" : op == MNCL_MAX ? "max" : "prod";
    char what[96];
    std::snprintf(what, sizeof what, "allreduce float32 %s n=8 correct", name);
    expect(count_wrong(c, l, round) == 0, what, count_wrong(c, l, round));
    size_t k = 0;
    while (k < l.count && t.get(k) == 0) ++k;  // an element whose ulp is a float32 ulp
    t.set(k, std::nextafter(static_cast<float>(t.get(k)), INFINITY));
    std::snprintf(what, sizeof what, "allreduce float32 %s n=8 one element 1 ulp off", name);
    expect(count_wrong(c, l, round) == 1, what, count_wrong(c, l, round));
  }
  // float16 / bfloat16 SUM within 2^p: exact in any order, so exact it must be.
  {
    const int n = 16;
    const Layout l = layout_for(CollKind::kReduceScatter, 16 * 2 * 8, 2, n);
    Typed t(MNCL_BFLOAT16, l);
    const Call c = t.call(CollKind::kReduceScatter, l, MNCL_SUM, 3, n);
    for (size_t i = 0; i < l.count; ++i)
      t.set(i, fold(t, MNCL_SUM, n, 3 * l.count + i, round, true));
    expect(count_wrong(c, l, round) == 0, "reduce_scatter bfloat16 sum n=16 correct",
           count_wrong(c, l, round));
    t.set(0, t.get(0) + 1);
    expect(count_wrong(c, l, round) == 1, "reduce_scatter bfloat16 sum n=16 one element off by 1",
           count_wrong(c, l, round));
  }
  // bfloat16 SUM at 256 ranks, the positive inputs first: the partial sums pass 256, where
  // bfloat16 no longer holds every integer and the order of additions changes the rounding. That
  // order, rounded at every step, is a correct result.
  {
    const int n = 256;
    const Layout l = layout_for(CollKind::kAllreduce, 1024, 2, n);
    Typed t(MNCL_BFLOAT16, l);
    const Call c = t.call(CollKind::kAllreduce, l, MNCL_SUM, 0, n);
    int differ = 0;
    for (size_t i = 0; i < l.count; ++i) {
      std::vector<double> x;
      for (int q = 0; q < n; ++q) x.push_back(input_value(MNCL_BFLOAT16, MNCL_SUM, q, i, round));
      std::sort(x.begin(), x.end(), [](double a, double b) { return a > b; });
      double acc = 0;
      for (double v : x) acc = t.round(acc + v);
      differ += acc != fold(t, MNCL_SUM, n, i, round, false) ? 1 : 0;
      t.set(i, acc);
    }
    expect(differ > 0 && count_wrong(c, l, round) == 0,
           "allreduce bfloat16 sum n=256 positives first, rounded", count_wrong(c, l, round));
    t.set(0, INFINITY);
    expect(count_wrong(c, l, round) == 1, "allreduce bfloat16 sum n=256 one element inf",
           count_wrong(c, l, round));
    std::printf("  (%d of %zu elements rounded differently from the exact sum)\n", differ, l.count);
  }
  // float16 AVG at 3 ranks: summed, divided in float32 and narrowed, or each input divided first
  // and summed in float16: both correct; without one rank's input, wrong.
  {
    const int n = 3;
    const Layout l = layout_for(CollKind::kAllreduce, 512, 2, n);
    Typed t(MNCL_FLOAT16, l);
    const Call c = t.call(CollKind::kAllreduce, l, MNCL_AVG, 0, n);
    for (size_t i = 0; i < l.count; ++i)
      t.set(i, static_cast<float>(fold(t, MNCL_SUM, n, i, round, true)) / static_cast<float>(n));
    expect(count_wrong(c, l, round) == 0, "allreduce float16 avg n=3 divided in float32",
           count_wrong(c, l, round));
    for (size_t i = 0; i < l.count; ++i) {
      double acc = 0;
      for (int q = 0; q < n; ++q)
        acc = t.round(acc + t.round(input_value(MNCL_FLOAT16, MNCL_AVG, q, i, round) / n));
      t.set(i, acc);
    }
    expect(count_wrong(c, l, round) == 0, "allreduce float16 avg n=3 inputs divided first",
           count_wrong(c, l, round));
    int64_t caught = 0;
    for (size_t i = 0; i < l.count; ++i) {
      double acc = 0;
      for (int q = 0; q < n - 1; ++q) acc += input_value(MNCL_FLOAT16, MNCL_AVG, q, i, round);
      t.set(i, acc / n);
      caught += input_value(MNCL_FLOAT16, MNCL_AVG, n - 1, i, round) != 0 ? 1 : 0;
    }
    expect(count_wrong(c, l, round) == caught, "allreduce float16 avg n=3 without rank 2's input",
           count_wrong(c, l, round));
  }
}

}  // namespace

int main() {
  tolerance_cases();
  const int round = 0;
  // reduce_scatter, 4 ranks, 176 B (11 floats a block): rank r gets block 0's sum, or its own.
  {
    const int n = 4;
    const Layout l = layout_for(CollKind::kReduceScatter, 176, 4, n);
    for (int r = 1; r < n; ++r) {
      Buffers b(l);
      const Call c = call(CollKind::kReduceScatter, l, b, r, n);
      for (size_t i = 0; i < l.count; ++i) b.recv[i] = float(reduce_sum(n, r * l.count + i, round));
      expect(count_wrong(c, l, round) == 0, "reduce_scatter n=4 176 B correct",
             count_wrong(c, l, round));
      for (size_t i = 0; i < l.count; ++i) b.recv[i] = float(reduce_sum(n, i, round));
      expect(count_wrong(c, l, round) > 0, "reduce_scatter n=4 176 B block 0 instead of own",
             count_wrong(c, l, round));
    }
  }
  // alltoall, 4 ranks, 176 B: every rank receives the blocks meant for rank 0.
  {
    const int n = 4;
    const Layout l = layout_for(CollKind::kAlltoall, 176, 4, n);
    for (int r = 1; r < n; ++r) {
      Buffers b(l);
      const Call c = call(CollKind::kAlltoall, l, b, r, n);
      fill_blocks(b, l, n, round, r * l.count, [](int q) { return q; });
      expect(count_wrong(c, l, round) == 0, "alltoall n=4 176 B correct", count_wrong(c, l, round));
      fill_blocks(b, l, n, round, 0, [](int q) { return q; });
      expect(count_wrong(c, l, round) > 0, "alltoall n=4 176 B rank 0's blocks",
             count_wrong(c, l, round));
    }
  }
  // allgather, 16 ranks, 4 KiB: the blocks of ranks 0 and 11 swapped.
  {
    const int n = 16;
    const Layout l = layout_for(CollKind::kAllgather, 4096, 4, n);
    Buffers b(l);
    const Call c = call(CollKind::kAllgather, l, b, 5, n);
    const auto swapped = [](int q) { return q == 0 ? 11 : q == 11 ? 0 : q; };
    fill_blocks(b, l, n, round, 0, swapped);
    expect(count_wrong(c, l, round) > 0, "allgather n=16 blocks of ranks 0 and 11 swapped",
           count_wrong(c, l, round));
  }
  // allreduce, 12 ranks: rank 0's input counted twice, rank 11's never; and a stale round.
  {
    const int n = 12;
    const Layout l = layout_for(CollKind::kAllreduce, 4096, 4, n);
    Buffers b(l);
    const Call c = call(CollKind::kAllreduce, l, b, 3, n);
    for (size_t i = 0; i < l.count; ++i) b.recv[i] = float(reduce_sum(n, i, round));
    expect(count_wrong(c, l, round) == 0, "allreduce n=12 correct", count_wrong(c, l, round));
    for (size_t i = 0; i < l.count; ++i) {
      double s = 0;
      for (int q = 0; q < n; ++q)
        s += input_value(MNCL_FLOAT32, MNCL_SUM, q == 11 ? 0 : q, i, round);
      b.recv[i] = float(s);
    }
    expect(count_wrong(c, l, round) > 0, "allreduce n=12 rank 0 counted twice, rank 11 never",
           count_wrong(c, l, round));
    for (size_t i = 0; i < l.count; ++i) b.recv[i] = float(reduce_sum(n, i, round + 1));
    expect(count_wrong(c, l, round) > 0, "allreduce n=12 the next round's result",
           count_wrong(c, l, round));
  }
  if (failures) {
    std::printf("FAILED: %d case(s)\n", failures);
    return 1;
  }
  std::printf("all cases OK\n");
  return 0;
}

// Self-test of mncl-perf's -c check (data.cpp): feeds count_wrong() correct results, which must
// give 0 wrong elements, and results taken from the wrong rank, block or round, which must be
// caught. Runs without a communicator (no backend, no launcher).
#include <cstdio>
#include <vector>

#include "collectives.h"
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

}  // namespace

int main() {
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

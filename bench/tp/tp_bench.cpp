// mncl-tp-bench: what splitting an MLP block over the ranks (tensor parallelism,
// tensor_parallel.hpp) buys and costs per training step, in one run: forward + backward of
// the block {B, d} -> Dense(d, 4d) -> ReLU -> Dense(4d, d) on one process, against the same
// block as ColumnParallelDense + ReLU + RowParallelDense over every rank, against the block's
// two allreduces of {B, d} floats alone (the communication Megatron-style splitting needs),
// and against the four [failed, rows, features, shape] exchanges alone (what failing together
// costs).
//
//   mncl-run -n 2 -- mncl-tp-bench [--batch B] [--widths d,d,...] [--rounds R] [--iters N]
//
// The contenders alternate in blocks of iterations, each block timed by its slowest rank; the
// table gives the median per step of each and the median over the rounds of the paired
// ratios: one process / split (the speedup) and checks / split (the share of the agreement
// exchanges). Every width is checked first: the split block's output must equal the
// one-process block's (same seeds) up to float rounding.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mncl/frontends.hpp>
#include <string>
#include <vector>

#include "common/bench_stats.h"
#include "common/frontends_bench.h"

int main(int argc, char **argv) {
  mncl_bench::SweepOptions o;
  o.sizes = {64, 256, 512};
  if (!mncl_bench::parse_sweep(argc, argv, "--widths", o)) {
    std::fprintf(stderr,
                 "usage: mncl-tp-bench [--batch B] [--widths d,d,...] [--rounds R] [--iters N]\n");
    return 2;
  }
  mncl::Communicator comm;
  const bool root = comm.rank() == 0;
  if (root) {
    std::printf(
        "# mncl-tp-bench: %d rank(s), backend %s; block {%lld, d} -> 4d -> d; %d rounds of %d "
        "steps; times are per forward + backward\n",
        comm.size(), comm.backend().c_str(), static_cast<long long>(o.batch), o.rounds, o.iters);
    std::printf("# %6s %14s %12s %14s %12s %12s %14s\n", "d", "1 process (us)", "split (us)",
                "2 allreduce", "4 checks", "speedup", "checks/split");
  }
  int status = 0;
  for (int64_t d : o.sizes) {
    const int64_t hidden = 4 * d;
    if (hidden < comm.size()) {
      if (root)
        std::printf("# d=%lld: too narrow for %d ranks\n", static_cast<long long>(d), comm.size());
      continue;
    }
    mncl::Tensor x({o.batch, d}), grad({o.batch, d});
    for (std::size_t k = 0; k < x.data.size(); ++k) {
      x.data[k] = std::sin(0.37f * static_cast<float>(k));
      grad.data[k] = std::cos(0.11f * static_cast<float>(k)) / static_cast<float>(o.batch);
    }
    mncl::Sequential single, split;
    single.emplace<mncl::Dense>(d, hidden, 1)
        .emplace<mncl::ReLU>()
        .emplace<mncl::Dense>(hidden, d, 2);
    split.emplace<mncl::ColumnParallelDense>(d, hidden, comm, 1,
                                             mncl::ColumnParallelOptions{false, true});
    split.emplace<mncl::ReLU>().emplace<mncl::RowParallelDense>(hidden, d, comm, 2);

    // The check: same seeds, so the same outputs up to the order of the float sums.
    const mncl::Tensor y_single = single.forward(x), y_split = split.forward(x);
    double worst = 0, scale = 0;
    for (std::size_t k = 0; k < y_single.data.size(); ++k) {
      worst = std::max(worst, static_cast<double>(std::fabs(y_single.data[k] - y_split.data[k])));
      scale = std::max(scale, static_cast<double>(std::fabs(y_single.data[k])));
    }
    single.backward(grad);
    split.backward(grad);
    if (comm.allreduce_value(worst, mncl::ReduceOp::kMax) > 1e-5 * std::max(1.0, scale)) {
      if (root)
        std::printf("# d=%lld: outputs differ by %g: FAILED\n", static_cast<long long>(d), worst);
      status = 1;
      continue;
    }

    std::vector<float> sums(static_cast<std::size_t>(o.batch * d), 1.0f);
    const std::vector<int64_t> header = {0, o.batch, d, -1, 0};  // agree()'s record
    const std::vector<std::function<void()>> contenders = {
        [&] { single.backward(single.forward(x)); }, [&] { split.backward(split.forward(x)); },
        [&] {
          // kMax: the same cost as a sum, and the values never grow.
          comm.allreduce(mncl::Span<float>(sums), mncl::ReduceOp::kMax);
          comm.allreduce(mncl::Span<float>(sums), mncl::ReduceOp::kMax);
        },
        [&] {
          if (comm.size() == 1) return;  // a group of one exchanges nothing
          for (int pass = 0; pass < 4; ++pass) comm.allgather(header);  // 2 layers x 2 passes
        }};
    std::vector<double> speedup, check_share;
    const auto times = mncl_bench::alternate_rounds(comm, o.rounds, o.iters, contenders,
                                                    [&](const std::vector<double> &t) {
                                                      speedup.push_back(t[0] / t[1]);
                                                      check_share.push_back(t[3] / t[1]);
                                                    });
    if (root) {
      std::printf("  %6lld %14.1f %12.1f %14.1f %12.1f %12.2f %14.3f\n", static_cast<long long>(d),
                  1e6 * mncl_bench::median(times[0]), 1e6 * mncl_bench::median(times[1]),
                  1e6 * mncl_bench::median(times[2]), 1e6 * mncl_bench::median(times[3]),
                  mncl_bench::median(speedup), mncl_bench::median(check_share));
      std::fflush(stdout);
    }
  }
  comm.destroy();
  return status;
}

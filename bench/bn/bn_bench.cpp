// mncl-bn-bench: what batch normalization across ranks costs per training step, in one run:
// forward + backward of mncl::BatchNormalization (this rank's samples only) against
// mncl::MultiNodeBatchNormalization (the global batch's statistics: two allreduces of 2C+2
// doubles), and against those two allreduces alone (the communication any synchronized batch
// normalization pays).
//
//   mncl-run -n 4 -- mncl-bn-bench [--batch B] [--channels C,C,...] [--spatial S]
//                                  [--rounds R] [--iters N]
//
// Input {B, C, S} per rank (default 32 x C x 1). The three contenders alternate in blocks of
// iterations, each block timed by its slowest rank; the table gives the median per step of each
// and the median over the rounds of the paired ratios: multi-node / local (the price of global
// statistics) and (multi-node - local) / the allreduces (how close the layer's extra cost comes
// to its communication). Every size is checked once first: with the same samples on every rank,
// the global statistics equal the local ones, so the outputs must agree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mncl/frontends.hpp>
#include <string>
#include <vector>

#include "common/bench_stats.h"
#include "common/frontends_bench.h"

int main(int argc, char **argv) {
  mncl_bench::SweepOptions o;
  o.sizes = {64, 256, 1024, 4096};
  o.rounds = 9;
  o.iters = 20;
  int64_t spatial = 1;
  if (!mncl_bench::parse_sweep(argc, argv, "--channels", o, {{"--spatial", &spatial}})) {
    std::fprintf(stderr,
                 "usage: mncl-bn-bench [--batch B] [--channels C,C,...] [--spatial S] "
                 "[--rounds R] [--iters N]\n");
    return 2;
  }
  mncl::Communicator comm;
  const bool root = comm.rank() == 0;
  if (root) {
    std::printf(
        "# mncl-bn-bench: %d rank(s), backend %s; input {%lld, C, %lld} per rank; "
        "%d rounds of %d steps; times are per forward + backward\n",
        comm.size(), comm.backend().c_str(), static_cast<long long>(o.batch),
        static_cast<long long>(spatial), o.rounds, o.iters);
    std::printf("# %8s %12s %14s %14s %12s %16s\n", "C", "local (us)", "multi-node (us)",
                "2 allreduce", "mn / local", "extra / allred");
  }
  int status = 0;
  for (int64_t channels : o.sizes) {
    mncl::Tensor x({o.batch, channels, spatial}), grad({o.batch, channels, spatial});
    for (std::size_t k = 0; k < x.data.size(); ++k) {
      x.data[k] = std::sin(0.37f * static_cast<float>(k)) + 0.01f * static_cast<float>(k % 97);
      grad.data[k] = std::cos(0.11f * static_cast<float>(k));
    }
    mncl::BatchNormalization local(channels);
    mncl::MultiNodeBatchNormalization global(channels, comm);
    std::vector<double> sums(static_cast<std::size_t>(2 * channels + 2), 1.0);

    // The check: the same samples everywhere, so the same statistics and outputs.
    const mncl::Tensor y_local = local.forward(x), y_global = global.forward(x);
    double worst = 0;
    for (std::size_t k = 0; k < y_local.data.size(); ++k) {
      worst = std::max(worst, static_cast<double>(std::fabs(y_local.data[k] - y_global.data[k])));
    }
    local.backward(grad);
    global.backward(grad);
    if (comm.allreduce_value(worst, mncl::ReduceOp::kMax) > 1e-4) {
      if (root)
        std::printf("# C=%lld: outputs differ by %g: FAILED\n", static_cast<long long>(channels),
                    worst);
      status = 1;
      continue;
    }

    const std::vector<std::function<void()>> contenders = {
        [&] { local.backward(local.forward(x)); }, [&] { global.backward(global.forward(x)); },
        [&] {
          // kMax: the same cost as a sum, and the values never grow.
          comm.allreduce(mncl::Span<double>(sums), mncl::ReduceOp::kMax);
          comm.allreduce(mncl::Span<double>(sums), mncl::ReduceOp::kMax);
        }};
    std::vector<double> ratio, extra;
    const auto times = mncl_bench::alternate_rounds(comm, o.rounds, o.iters, contenders,
                                                    [&](const std::vector<double> &t) {
                                                      ratio.push_back(t[1] / t[0]);
                                                      extra.push_back((t[1] - t[0]) / t[2]);
                                                    });
    if (root) {
      std::printf("  %8lld %12.1f %14.1f %14.1f %12.2f %16.2f\n", static_cast<long long>(channels),
                  1e6 * mncl_bench::median(times[0]), 1e6 * mncl_bench::median(times[1]),
                  1e6 * mncl_bench::median(times[2]), mncl_bench::median(ratio),
                  mncl_bench::median(extra));
      std::fflush(stdout);
    }
  }
  comm.destroy();
  return status;
}

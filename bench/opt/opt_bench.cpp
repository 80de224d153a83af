// mncl-opt-bench: what the multi-node optimizer costs per training step beyond its
// communication, in one run: MultiNodeOptimizer::update (the agreement, packing into fusion
// buffers, the coalesced allreduce, the averages, a plain SGD step) against the bare coalesced
// allreduce of the same gradients plus the same SGD step done by hand (what a training loop
// written against the communicator alone pays), and against the agreement alone (one
// allgather of two int64 per rank).
//
//   mncl-run -n 4 -- mncl-opt-bench [--params P] [--sizes N,N,...] [--rounds R] [--iters K]
//                                   [--hierarchical 1]
//
// --hierarchical 1: both through a HierarchicalCommunicator over the world (within each host,
// then across), the bare loop calling its allreduce_coalesced (which agrees on every call).
//
// P parameters of N floats each, per size (default 4 of 256, 4096 and 262144 floats). The
// contenders alternate in blocks of iterations, each block timed by its slowest rank; the table
// gives the median per step of each and the median over the rounds of the paired ratio
// optimizer / bare. Every size is checked once first: the optimizer's averages must equal
// the mean of the ranks' gradients (small integers: exact in float32).
#include <cstdio>
#include <functional>
#include <mncl/frontends.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/bench_stats.h"
#include "common/frontends_bench.h"

namespace {

// p -= lr * g, over every parameter: the wrapped optimizer, and the bare loop's step.
void sgd_step(const mncl::ParamSpans &params, const mncl::GradSpans &grads, float lr) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    for (std::size_t j = 0; j < params[i].size(); ++j) params[i][j] -= lr * grads[i][j];
  }
}

struct TinySgd {
  static constexpr bool stateless_optimizer = true;
  float lr = 1e-6f;
  void update(const mncl::ParamSpans &params, const mncl::GradSpans &grads) const {
    sgd_step(params, grads, lr);
  }
};

}  // namespace

int main(int argc, char **argv) {
  mncl_bench::SweepOptions o;
  o.sizes = {256, 4096, 262144};
  o.rounds = 9;
  o.iters = 20;
  int64_t param_count = 4, hierarchical = 0;
  if (!mncl_bench::parse_sweep(argc, argv, "--sizes", o,
                               {{"--params", &param_count}, {"--hierarchical", &hierarchical}})) {
    std::fprintf(stderr,
                 "usage: mncl-opt-bench [--params P] [--sizes N,N,...] [--rounds R] "
                 "[--iters K] [--hierarchical 1]\n");
    return 2;
  }
  mncl::Communicator comm;
  std::optional<mncl::HierarchicalCommunicator> hier;
  if (hierarchical != 0) hier.emplace(comm);
  const bool root = comm.rank() == 0;
  if (root) {
    std::printf(
        "# mncl-opt-bench: %d rank(s), backend %s%s; %lld parameters of N floats; %d rounds of "
        "%d steps; times are per step\n",
        comm.size(), comm.backend().c_str(),
        hier ? (", hierarchical over " + std::to_string(hier->num_hosts()) + " host(s)").c_str()
             : "",
        static_cast<long long>(param_count), o.rounds, o.iters);
    std::printf("# %9s %14s %14s %14s %12s\n", "N", "bare (us)", "optimizer (us)", "agreement (us)",
                "opt / bare");
  }
  int status = 0;
  for (int64_t size : o.sizes) {
    const auto n = static_cast<std::size_t>(size);
    std::vector<std::vector<float>> values(static_cast<std::size_t>(param_count),
                                           std::vector<float>(n, 1.0f));
    std::vector<std::vector<float>> grads(values.size(), std::vector<float>(n));
    std::vector<std::vector<float>> sums = grads;  // the bare loop's in-place buffers
    mncl::ParamSpans params;
    mncl::GradSpans grad_spans, sum_spans;
    std::vector<mncl::Span<float>> sum_buffers;
    for (std::size_t i = 0; i < values.size(); ++i) {
      for (std::size_t j = 0; j < n; ++j) grads[i][j] = float(comm.rank() + int(i + j) % 5);
      params.emplace_back(values[i]);
      grad_spans.emplace_back(grads[i].data(), n);
      sum_buffers.emplace_back(sums[i]);
      sum_spans.emplace_back(sums[i].data(), n);
    }
    auto optimizer = hier ? mncl::MultiNodeOptimizer<TinySgd>(TinySgd{}, *hier)
                          : mncl::MultiNodeOptimizer<TinySgd>(TinySgd{}, comm);

    // The check: averages of rank + (i + j) % 5 are (size - 1) / 2 + (i + j) % 5.
    optimizer.update(params, grad_spans);
    int wrong = 0;
    const auto &averaged = optimizer.averaged_grads();
    for (std::size_t i = 0; i < averaged.size(); ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        wrong += averaged[i][j] != float((comm.size() - 1) / 2.0 + int(i + j) % 5);
      }
    }
    if (comm.allreduce_value(wrong, mncl::ReduceOp::kSum) != 0) {
      if (root) std::printf("# N=%lld: averages wrong: FAILED\n", static_cast<long long>(size));
      status = 1;
      continue;
    }

    const std::vector<std::function<void()>> contenders = {
        [&] {
          for (std::size_t i = 0; i < sums.size(); ++i) sums[i] = grads[i];
          if (hier) {
            hier->allreduce_coalesced(sum_buffers, mncl::ReduceOp::kAvg);
          } else {
            comm.allreduce_coalesced(sum_buffers, mncl::ReduceOp::kAvg);
          }
          sgd_step(params, sum_spans, 1e-6f);
        },
        [&] { optimizer.update(params, grad_spans); },
        [&] { mncl::agree_or_throw(comm, "mncl-opt-bench", nullptr, 1); }};
    std::vector<double> ratio;
    const auto times = mncl_bench::alternate_rounds(
        comm, o.rounds, o.iters, contenders,
        [&](const std::vector<double> &t) { ratio.push_back(t[1] / t[0]); });
    if (root) {
      std::printf("  %9lld %14.1f %14.1f %14.1f %12.2f\n", static_cast<long long>(size),
                  1e6 * mncl_bench::median(times[0]), 1e6 * mncl_bench::median(times[1]),
                  1e6 * mncl_bench::median(times[2]), mncl_bench::median(ratio));
      std::fflush(stdout);
    }
  }
  if (hier) hier->destroy();
  comm.destroy();
  return status;
}

// mncl-chain-bench: what MultiNodeChainList costs a pipeline beyond its point-to-point
// messages, in one run: a forward and a backward through one identity stage per rank (rank r
// takes rank r-1's activation and sends its own to rank r+1, and back for the gradients)
// against the same messages sent by hand with their sizes known (mncl::Communicator send/recv
// of N floats, no header, no copy).
//
//   mncl-run -n 3 -- mncl-chain-bench [--sizes N,N,...] [--rounds R] [--iters K]
//
// Tensors of {1, N} floats (default N = 16, 4096 and 1048576). What the chain adds: a 1120-byte
// header message (its shape, direction and pass number, for the failure handling), which
// carries a tensor of up to 1 KiB and goes before a larger one, and the copies of the Tensor
// interface (a link returns a new tensor). The contenders alternate in blocks of iterations, each
// block timed by its slowest rank; the table gives the median per pass of each and the median over
// the rounds of the paired ratio chain / by hand. Every size is checked once first: the last rank's
// output and rank 0's input gradient must be the input and the output gradient unchanged.
#include <cstdio>
#include <functional>
#include <memory>
#include <mncl/frontends.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/bench_stats.h"
#include "common/frontends_bench.h"

namespace {

// y = x, dL/dx = dL/dy: the stage computes nothing, so only the chain's own cost remains.
class Identity : public mncl::Link {
 public:
  mncl::Tensor forward(const mncl::Tensor &x) override { return x; }
  mncl::Tensor backward(const mncl::Tensor &grad_y) override { return grad_y; }
  std::string name() const override { return "Identity"; }
};

}  // namespace

int main(int argc, char **argv) {
  mncl_bench::SweepOptions o;
  o.sizes = {16, 4096, 1048576};
  o.rounds = 9;
  o.iters = 20;
  if (!mncl_bench::parse_sweep(argc, argv, "--sizes", o, {})) {
    std::fprintf(stderr, "usage: mncl-chain-bench [--sizes N,N,...] [--rounds R] [--iters K]\n");
    return 2;
  }
  mncl::Communicator comm;
  const int rank = comm.rank(), size = comm.size();
  const bool root = rank == 0, last = rank == size - 1;
  const std::optional<int> previous = rank > 0 ? std::optional<int>(rank - 1) : std::nullopt;
  const std::optional<int> next = last ? std::nullopt : std::optional<int>(rank + 1);
  if (root) {
    std::printf(
        "# mncl-chain-bench: %d rank(s), backend %s; one identity stage per rank; "
        "%d rounds of %d passes (forward + backward); times are per pass\n",
        size, comm.backend().c_str(), o.rounds, o.iters);
    std::printf("# %9s %14s %14s %12s\n", "N", "by hand (us)", "chain (us)", "chain / hand");
  }
  mncl::MultiNodeChainList chain(comm);
  chain.add_link(std::make_shared<Identity>(), previous, next);
  chain.set_backward_follows(true);
  int status = 0;
  for (int64_t n : o.sizes) {
    const mncl::Tensor x({1, n}, 1.5f), grad({1, n}, 0.25f);
    std::vector<float> activation(static_cast<std::size_t>(n), 1.5f),
        gradient(static_cast<std::size_t>(n), 0.25f);

    // The check: both directions carry their tensors through unchanged.
    const mncl::Tensor y = chain.forward(root ? x : mncl::Tensor());
    const mncl::Tensor g = chain.backward(last ? grad : mncl::Tensor());
    int wrong = (last && y.data != x.data) || (root && g.data != grad.data);
    if (comm.allreduce_value(wrong, mncl::ReduceOp::kSum) != 0) {
      if (root) std::printf("# N=%lld: tensors changed on the way: FAILED\n", (long long)n);
      status = 1;
      continue;
    }

    if (size == 1) {  // no messages: nothing to compare
      if (root) std::printf("  %9lld (one rank: nothing travels)\n", static_cast<long long>(n));
      continue;
    }
    const std::vector<std::function<void()>> contenders = {
        [&] {  // by hand: the same messages, sizes known
          if (previous) comm.recv(activation, *previous);
          if (next) comm.send(activation, *next);
          if (next) comm.recv(gradient, *next);
          if (previous) comm.send(gradient, *previous);
        },
        [&] {
          chain.forward(root ? x : mncl::Tensor());
          chain.backward(last ? grad : mncl::Tensor());
        }};
    std::vector<double> ratio;
    const auto times = mncl_bench::alternate_rounds(
        comm, o.rounds, o.iters, contenders,
        [&](const std::vector<double> &t) { ratio.push_back(t[1] / t[0]); });
    if (root) {
      std::printf("  %9lld %14.1f %14.1f %12.2f\n", static_cast<long long>(n),
                  1e6 * mncl_bench::median(times[0]), 1e6 * mncl_bench::median(times[1]),
                  mncl_bench::median(ratio));
      std::fflush(stdout);
    }
  }
  comm.destroy();
  return status;
}

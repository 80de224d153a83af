// mncl-hier-bench: the world's allreduce against mncl::HierarchicalCommunicator's two
// algorithms (hierarchical.hpp), in one run, on the very same buffers.
//
//   mncl-run -n 4 --ranks-per-host 2 -- mncl-hier-bench [--sizes B,B,...] [--max-bytes N]
//                                                      [--rounds R] [--iters N]
//
// float32 sum, out of place, 8 B .. 16 MiB by default. The contenders alternate in blocks of
// iterations (world, reduce-bcast, two-dimensional, then the next round starting one further
// along) so drift and noise hit them alike; each block is timed by its slowest rank. The table
// gives the median block per call of each and the median over the rounds of the paired ratio
// (each hierarchical block against the world block of its round): below 1, the hierarchy wins.
// Every size is verified once first (integer-valued data, so the sums are exact); a wrong
// result exits with status 1. Two-dimensional needs hosts of one size; elsewhere its columns
// say "-". The world's backend is MNCL_BACKEND's; the hosts' own backend "auto" (shm).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mncl/frontends.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench_stats.h"
#include "common/parse_size.h"

namespace {

struct Options {
  std::vector<std::size_t> sizes = {8,      64,       512,      4096,     32768,
                                    262144, 1u << 20, 2u << 20, 4u << 20, 16u << 20};
  std::size_t max_bytes = std::size_t{16} << 20;
  int rounds = 9;
  int iters = 0;  // 0: by size (about 8 MiB of allreduce per block, 2 .. 200 calls)
};

bool parse(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    try {
      if (arg == "--sizes" && has_value) {
        o.sizes.clear();
        std::stringstream list(argv[++i]);
        for (std::string item; std::getline(list, item, ',');) {
          o.sizes.push_back(mncl::bench::parse_size(item));
        }
      } else if (arg == "--max-bytes" && has_value) {
        o.max_bytes = mncl::bench::parse_size(argv[++i]);
      } else if (arg == "--rounds" && has_value) {
        o.rounds = mncl::bench::parse_number<int>(argv[++i], 1, 1 << 20);
      } else if (arg == "--iters" && has_value) {
        o.iters = mncl::bench::parse_number<int>(argv[++i], 1, 1 << 20);
      } else {
        return false;
      }
    } catch (const std::invalid_argument &e) {
      std::fprintf(stderr, "mncl-hier-bench: %s: %s\n", arg.c_str(), e.what());
      return false;
    }
  }
  o.sizes.erase(std::remove_if(o.sizes.begin(), o.sizes.end(),
                               [&](std::size_t b) { return b > o.max_bytes || b < 4; }),
                o.sizes.end());
  return true;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call of `iters` calls of f, as seen by the slowest rank.
double time_block(mncl::Communicator &world, int iters, const std::function<void()> &f) {
  world.barrier();
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) f();
  return world.allreduce_value((now_s() - t0) / iters, mncl::ReduceOp::kMax);
}

struct Contender {
  const char *name;
  std::function<void()> run;
  std::vector<double> seconds;  // one block per round
};

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: mncl-run -n N --ranks-per-host M -- %s [--sizes B,B,...] "
                 "[--max-bytes N] [--rounds R] [--iters N]\n",
                 argv[0]);
    return 2;
  }
  try {
    mncl::Communicator world;
    mncl::HierarchicalCommunicator reduce_bcast(world);
    // Two-dimensional only where every host has as many ranks (every rank decides alike).
    std::optional<mncl::HierarchicalCommunicator> two_dimensional;
    try {
      mncl::HierarchicalOptions options;
      options.algorithm = mncl::HierarchicalAlgorithm::kTwoDimensional;
      two_dimensional.emplace(world, options);
    } catch (const mncl::InvalidArgument &e) {
      if (world.rank() == 0) std::printf("two-dimensional skipped: %s\n", e.what());
    }
    const bool leader = world.rank() == 0;
    if (leader) {
      std::printf(
          "mncl-hier-bench: %d ranks on %d hosts (%d on this rank's), world backend %s, within "
          "hosts %s, between hosts %s; %d alternating rounds, time per call of the slowest rank; "
          "ratio: median of the rounds' hierarchical / world\n\n",
          world.size(), reduce_bcast.num_hosts(), reduce_bcast.intra_size(),
          world.backend().c_str(), reduce_bcast.intra().backend().c_str(),
          reduce_bcast.inter().backend().c_str(), o.rounds);
      std::printf("Allreduce, float32 sum, out of place, same buffers\n");
      std::printf("%10s %6s %12s %15s %7s %15s %7s\n", "bytes", "iters", "world us",
                  "reduce-bcast us", "ratio", "two-dim us", "ratio");
    }

    const std::size_t max_count =
        o.sizes.empty() ? 0 : *std::max_element(o.sizes.begin(), o.sizes.end()) / sizeof(float);
    std::vector<float> send(max_count), recv(max_count);
    for (std::size_t i = 0; i < max_count; ++i) {
      send[i] = static_cast<float>((i + static_cast<std::size_t>(world.rank())) % 7);
    }
    bool all_correct = true;
    for (const std::size_t bytes : o.sizes) {
      const std::size_t count = bytes / sizeof(float);
      const mncl::Span<const float> in(send.data(), count);
      const mncl::Span<float> out(recv.data(), count);
      std::vector<Contender> contenders;
      contenders.push_back({"world", [&] { world.allreduce(in, out); }, {}});
      contenders.push_back({"reduce-bcast", [&] { reduce_bcast.allreduce(in, out); }, {}});
      if (two_dimensional) {
        contenders.push_back({"two-dimensional", [&] { two_dimensional->allreduce(in, out); }, {}});
      }

      // Verify once (this also warms up every path): sums of (i + r) % 7 over the ranks.
      int wrong = 0;
      for (auto &c : contenders) {
        std::fill(out.begin(), out.end(), -1.0f);
        c.run();
        for (std::size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int r = 0; r < world.size(); ++r) want += double((i + std::size_t(r)) % 7);
          if (double(out[i]) != want) {
            if (!wrong) {
              std::fprintf(stderr, "rank %d: %s, %zu bytes: element %zu is %g, not %g\n",
                           world.rank(), c.name, bytes, i, double(out[i]), want);
            }
            wrong = 1;
            break;
          }
        }
      }
      if (world.allreduce_value(wrong, mncl::ReduceOp::kMax)) all_correct = false;

      const int iters =
          o.iters
              ? o.iters
              : static_cast<int>(std::clamp<std::size_t>((std::size_t{8} << 20) / bytes, 2, 200));
      for (int round = 0; round < o.rounds; ++round) {
        for (std::size_t k = 0; k < contenders.size(); ++k) {
          auto &c = contenders[(k + static_cast<std::size_t>(round)) % contenders.size()];
          c.seconds.push_back(time_block(world, iters, c.run));
        }
      }
      const auto paired_ratio = [&](const Contender &c) {
        std::vector<double> ratios;
        for (int r = 0; r < o.rounds; ++r)
          ratios.push_back(c.seconds[r] / contenders[0].seconds[r]);
        return mncl_bench::median(ratios);
      };
      if (leader) {
        std::printf("%10s %6d %12.2f %15.2f %7.3f", mncl_bench::human_bytes(bytes).c_str(), iters,
                    mncl_bench::median(contenders[0].seconds) * 1e6,
                    mncl_bench::median(contenders[1].seconds) * 1e6, paired_ratio(contenders[1]));
        if (contenders.size() > 2) {
          std::printf(" %15.2f %7.3f\n", mncl_bench::median(contenders[2].seconds) * 1e6,
                      paired_ratio(contenders[2]));
        } else {
          std::printf(" %15s %7s\n", "-", "-");
        }
        std::fflush(stdout);
      }
    }
    if (leader) {
      std::printf("results %s\n", all_correct ? "verified at every size" : "WRONG (see stderr)");
    }
    if (two_dimensional) two_dimensional->destroy();
    reduce_bcast.destroy();
    world.destroy();
    return all_correct ? 0 : 1;
  } catch (const mncl::Error &e) {
    std::fprintf(stderr, "mncl-hier-bench: %s\n", e.what());
    return 1;
  }
}

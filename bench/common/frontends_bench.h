// Helpers of the benchmarks built on the C++ frontends (bench/bn, bench/tp): option lists and
// contenders timed side by side in one run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mncl/frontends/communicator.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/parse_size.h"

namespace mncl_bench {

// What every such benchmark takes: a batch, the sizes it sweeps, and its timing plan.
struct SweepOptions {
  int64_t batch = 32;
  std::vector<int64_t> sizes;
  int rounds = 5;
  int iters = 10;
};

// "64,256,1024" -> {64, 256, 1024}; every item a positive integer (std::invalid_argument).
inline std::vector<int64_t> positive_list(const char *value) {
  std::vector<int64_t> items;
  std::stringstream list(value);
  for (std::string item; std::getline(list, item, ',');) {
    items.push_back(mncl::bench::parse_number<int64_t>(item, 1));
  }
  return items;
}

// One "--name value" pair of parse_sweep; false for a name it does not take.
inline bool parse_one(const std::string &arg, const char *value, const std::string &sizes_flag,
                      SweepOptions &o,
                      const std::vector<std::pair<std::string, int64_t *>> &extra) {
  const auto positive = [value] { return mncl::bench::parse_number<int64_t>(value, 1); };
  const auto field = std::find_if(extra.begin(), extra.end(),
                                  [&arg](const auto &flag) { return flag.first == arg; });
  if (arg == "--batch") {
    o.batch = positive();
  } else if (arg == sizes_flag) {
    o.sizes = positive_list(value);
  } else if (arg == "--rounds") {
    o.rounds = static_cast<int>(std::min<int64_t>(positive(), 1 << 20));
  } else if (arg == "--iters") {
    o.iters = static_cast<int>(std::min<int64_t>(positive(), 1 << 20));
  } else if (field != extra.end()) {
    *field->second = positive();
  } else {
    return false;
  }
  return true;
}

// "--name value" pairs: --batch B, --<sizes_flag> a,b,c, --rounds R, --iters N, and the
// positive integers of `extra` (flag -> field). False on anything else (a value that is no
// positive integer: said on stderr), or without sizes.
inline bool parse_sweep(int argc, char **argv, const std::string &sizes_flag, SweepOptions &o,
                        const std::vector<std::pair<std::string, int64_t *>> &extra = {}) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    const char *value = argv[++i];
    try {
      if (!parse_one(arg, value, sizes_flag, o, extra)) return false;
    } catch (const std::invalid_argument &e) {
      std::fprintf(stderr, "%s: %s: %s\n", argv[0], arg.c_str(), e.what());
      return false;
    }
  }
  return !o.sizes.empty();
}

// Seconds per call of `step` over `iters` calls, as the slowest rank saw them.
inline double timed_block(mncl::Communicator &comm, int iters, const std::function<void()> &step) {
  comm.barrier();
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) step();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return comm.allreduce_value(seconds, mncl::ReduceOp::kMax) / iters;
}

// `rounds` rounds of one timed block per contender, in an order that rotates each round (so
// no contender always runs first, on a cold cache, or last); on_round gets each round's
// seconds per call, in contender order. Returns every contender's per-round times.
inline std::vector<std::vector<double>> alternate_rounds(
    mncl::Communicator &comm, int rounds, int iters,
    const std::vector<std::function<void()>> &contenders,
    const std::function<void(const std::vector<double> &)> &on_round) {
  std::vector<std::vector<double>> times(contenders.size());
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> t(contenders.size());
    for (std::size_t i = 0; i < contenders.size(); ++i) {
      const std::size_t which = (i + static_cast<std::size_t>(round)) % contenders.size();
      t[which] = timed_block(comm, iters, contenders[which]);
      times[which].push_back(t[which]);
    }
    on_round(t);
  }
  return times;
}

}  // namespace mncl_bench

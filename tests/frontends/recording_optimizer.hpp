// A stand-in optimizer for the MultiNodeOptimizer tests: it records the gradients it is asked
// to apply (what the exchange produced) and applies p -= g.
#ifndef MNCL_TESTS_FRONTENDS_RECORDING_OPTIMIZER_HPP
#define MNCL_TESTS_FRONTENDS_RECORDING_OPTIMIZER_HPP

#include <cstddef>
#include <utility>
#include <vector>

#include "mncl/frontends/optimizer.hpp"

namespace mncl_testing {

struct RecordingOptimizer {
  // What it records is for the tests to read, not state to checkpoint: a MultiNodeOptimizer
  // around it may be saved and loaded (see mncl::is_stateless_optimizer).
  static constexpr bool stateless_optimizer = true;
  std::vector<std::vector<std::vector<float>>> seen;  // per update, per parameter
  void update(const mncl::ParamSpans &params, const mncl::GradSpans &grads) {
    std::vector<std::vector<float>> copy;
    for (std::size_t i = 0; i < params.size(); ++i) {
      copy.emplace_back(grads[i].begin(), grads[i].end());
      for (std::size_t j = 0; j < params[i].size(); ++j) params[i][j] -= grads[i][j];
    }
    seen.push_back(std::move(copy));
  }
};

}  // namespace mncl_testing

#endif  // MNCL_TESTS_FRONTENDS_RECORDING_OPTIMIZER_HPP

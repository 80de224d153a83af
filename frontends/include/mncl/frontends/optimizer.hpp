// Plain single-process optimizers with the shape the multi-node optimizer wraps:
//
//   void update(const std::vector<Span<float>> &params,
//               const std::vector<Span<const float>> &grads);
//
// params[i] and grads[i] have equal sizes; state (momentum, moments) is created on the first
// update and must keep those sizes afterwards. Both are serializable for checkpoints.
#ifndef MNCL_FRONTENDS_OPTIMIZER_HPP
#define MNCL_FRONTENDS_OPTIMIZER_HPP

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "mncl/frontends/error.hpp"
#include "mncl/frontends/serialize.hpp"
#include "mncl/frontends/span.hpp"

namespace mncl {

using ParamSpans = std::vector<Span<float>>;
using GradSpans = std::vector<Span<const float>>;

// Whether an optimizer has no state to checkpoint (SGD without momentum, say). A
// MultiNodeOptimizer's snapshot holds its wrapped optimizer's state, so saving or loading one
// around an optimizer without save/load members (serialize.hpp) does not compile: its momentum
// or moments would be missing from the snapshot and silently restart from zero on resume.
// An optimizer that truly has nothing to save says so, by a member
//   static constexpr bool stateless_optimizer = true;
// or, for a type that cannot be changed, by specializing this trait:
//   template <> struct mncl::is_stateless_optimizer<TheirSgd> : std::true_type {};
template <class Optimizer, class = void>
struct is_stateless_optimizer : std::false_type {};
template <class Optimizer>
struct is_stateless_optimizer<Optimizer, std::enable_if_t<Optimizer::stateless_optimizer>>
    : std::true_type {};

namespace detail {
// Sizes must match the parameters and, once state exists, the state.
inline void check_update_shapes(const char *who, const ParamSpans &params, const GradSpans &grads,
                                const std::vector<std::vector<float>> &state) {
  if (params.size() != grads.size()) {
    throw InvalidArgument(std::string(who) + ": " + std::to_string(params.size()) +
                          " parameters but " + std::to_string(grads.size()) + " gradients");
  }
  // Before the loop reads state[i].
  if (!state.empty() && state.size() != params.size()) {
    throw InvalidArgument(std::string(who) + ": " + std::to_string(params.size()) +
                          " parameters but optimizer state for " + std::to_string(state.size()) +
                          " (the parameter list changed since the first update or the load)");
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].size() != grads[i].size() ||
        (!state.empty() && state[i].size() != params[i].size())) {
      throw InvalidArgument(std::string(who) + ": parameter " + std::to_string(i) + " has " +
                            std::to_string(params[i].size()) + " elements but its gradient " +
                            std::to_string(grads[i].size()) +
                            (state.empty() ? "" : " (or its optimizer state another size)"));
    }
  }
}

inline std::vector<std::vector<float>> zeros_like(const ParamSpans &params) {
  std::vector<std::vector<float>> state;
  state.reserve(params.size());
  for (const auto &p : params) state.emplace_back(p.size(), 0.0f);
  return state;
}
}  // namespace detail

// Stochastic gradient descent with optional (heavy-ball) momentum and L2 weight decay:
//   g = grad + weight_decay * p;  v = momentum * v - lr * g;  p += v
class Sgd {
 public:
  struct Options {
    float lr = 0.01f;
    float momentum = 0.0f;
    float weight_decay = 0.0f;
  };
  Sgd() = default;
  explicit Sgd(Options options) : options_(options) {}

  void update(const ParamSpans &params, const GradSpans &grads) {
    detail::check_update_shapes("Sgd::update", params, grads, velocity_);
    if (velocity_.empty() && options_.momentum != 0.0f) velocity_ = detail::zeros_like(params);
    for (std::size_t i = 0; i < params.size(); ++i) {
      float *p = params[i].data();
      const float *g = grads[i].data();
      const std::size_t n = params[i].size();
      if (options_.momentum == 0.0f) {
        for (std::size_t j = 0; j < n; ++j) {
          p[j] -= options_.lr * (g[j] + options_.weight_decay * p[j]);
        }
      } else {
        float *v = velocity_[i].data();
        for (std::size_t j = 0; j < n; ++j) {
          v[j] = options_.momentum * v[j] - options_.lr * (g[j] + options_.weight_decay * p[j]);
          p[j] += v[j];
        }
      }
    }
  }

  Options &options() { return options_; }
  void save(OutArchive &ar) const { ar << velocity_; }
  void load(InArchive &ar) { ar >> velocity_; }

 private:
  Options options_;
  std::vector<std::vector<float>> velocity_;
};

// Adam (Kingma & Ba) with bias correction and optional L2 weight decay.
class Adam {
 public:
  struct Options {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;
  };
  Adam() = default;
  explicit Adam(Options options) : options_(options) {}

  void update(const ParamSpans &params, const GradSpans &grads) {
    detail::check_update_shapes("Adam::update", params, grads, first_moment_);
    if (first_moment_.empty()) {
      first_moment_ = detail::zeros_like(params);
      second_moment_ = detail::zeros_like(params);
    }
    ++steps_;
    const double t = static_cast<double>(steps_);
    // Bias corrections folded into one step size, as in the paper's efficient form.
    const float step_size =
        static_cast<float>(options_.lr * std::sqrt(1.0 - std::pow(options_.beta2, t)) /
                           (1.0 - std::pow(options_.beta1, t)));
    const float eps_hat =
        static_cast<float>(options_.eps * std::sqrt(1.0 - std::pow(options_.beta2, t)));
    const float b1 = options_.beta1, b2 = options_.beta2;
    for (std::size_t i = 0; i < params.size(); ++i) {
      float *p = params[i].data();
      const float *g = grads[i].data();
      float *m = first_moment_[i].data();
      float *v = second_moment_[i].data();
      for (std::size_t j = 0, n = params[i].size(); j < n; ++j) {
        const float grad = g[j] + options_.weight_decay * p[j];
        m[j] = b1 * m[j] + (1.0f - b1) * grad;
        v[j] = b2 * v[j] + (1.0f - b2) * grad * grad;
        p[j] -= step_size * m[j] / (std::sqrt(v[j]) + eps_hat);
      }
    }
  }

  Options &options() { return options_; }
  uint64_t steps() const { return steps_; }
  void save(OutArchive &ar) const { ar << steps_ << first_moment_ << second_moment_; }
  void load(InArchive &ar) { ar >> steps_ >> first_moment_ >> second_moment_; }

 private:
  Options options_;
  uint64_t steps_ = 0;
  std::vector<std::vector<float>> first_moment_, second_moment_;
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_OPTIMIZER_HPP

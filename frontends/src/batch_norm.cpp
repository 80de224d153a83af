#include "mncl/frontends/batch_norm.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>

#include "mncl/frontends/agreement.hpp"
#include "mncl/frontends/error.hpp"
#include "shape_check.hpp"

namespace mncl {

namespace {

// Layout of the reduced sums: [count, bad ranks, first C values, second C values].
constexpr std::size_t kCount = 0, kBad = 1, kFirst = 2;

// Samples per channel in one batch item: the product of the dimensions after the channel.
int64_t spatial_size(const std::vector<int64_t> &shape) {
  int64_t s = 1;
  for (std::size_t d = 2; d < shape.size(); ++d) s *= shape[d];
  return s;
}

// Calls run(flat, first_channel, first_element, length) for every run of contiguous elements
// of a {batch, channels, spatial} tensor. Element s of a run has channel first_channel + s when
// flat (spatial 1: one run per sample, across its channels), else first_channel (one run per
// sample and channel). `flat` is std::true_type or std::false_type, so the loops written with
// channel_of() compile to a vectorizable channel-wise loop for {batch, C} input.
template <class Run>
void for_each_run(int64_t batch, int64_t channels, int64_t spatial, Run run) {
  if (spatial == 1) {
    for (int64_t n = 0; n < batch; ++n) {
      run(std::true_type{}, std::size_t{0}, static_cast<std::size_t>(n * channels), channels);
    }
    return;
  }
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      run(std::false_type{}, static_cast<std::size_t>(c),
          static_cast<std::size_t>((n * channels + c) * spatial), spatial);
    }
  }
}

template <class Flat>
inline std::size_t channel_of(Flat, std::size_t first_channel, int64_t s) {
  return Flat::value ? first_channel + static_cast<std::size_t>(s) : first_channel;
}

// first[c] += v, second[c] += v * w (w = v when weights is null), over every element of
// channel c of {batch, channels, spatial} values, in float64.
void accumulate(const float *values, const float *weights, int64_t batch, int64_t channels,
                int64_t spatial, double *__restrict first, double *__restrict second) {
  for_each_run(batch, channels, spatial,
               [&](auto flat, std::size_t c0, std::size_t k, int64_t length) {
                 const float *v = values + k;
                 const float *w = weights != nullptr ? weights + k : v;
                 if constexpr (decltype(flat)::value) {
                   for (int64_t s = 0; s < length; ++s) {  // one channel per element
                     const std::size_t c = c0 + static_cast<std::size_t>(s);
                     first[c] += v[s];
                     second[c] += static_cast<double>(v[s]) * w[s];
                   }
                 } else {  // one channel for the run: sum in registers, then add
                   double sum = 0, weighted = 0;
                   for (int64_t s = 0; s < length; ++s) {
                     sum += v[s];
                     weighted += static_cast<double>(v[s]) * w[s];
                   }
                   first[c0] += sum;
                   second[c0] += weighted;
                 }
               });
}

}  // namespace

BatchNormalization::BatchNormalization(int64_t channels, BatchNormalizationOptions options)
    : channels_(channels), options_(options) {
  if (channels_ <= 0) throw InvalidArgument("BatchNormalization: channels must be positive");
  if (!(options_.decay >= 0.0f && options_.decay <= 1.0f)) {
    throw InvalidArgument("BatchNormalization: decay " + std::to_string(options_.decay) +
                          " is outside [0, 1]");
  }
  if (!(options_.eps > 0.0f)) {
    throw InvalidArgument("BatchNormalization: eps must be positive, got " +
                          std::to_string(options_.eps));
  }
  const auto c = static_cast<std::size_t>(channels_);
  gamma_.name = "gamma";
  gamma_.value.assign(c, 1.0f);
  gamma_.grad.assign(c, 0.0f);
  beta_.name = "beta";
  beta_.value.assign(c, 0.0f);
  beta_.grad.assign(c, 0.0f);
  running_mean_.assign(c, 0.0f);
  running_var_.assign(c, 1.0f);
}

std::string BatchNormalization::name() const {
  return "BatchNormalization(" + std::to_string(channels_) + ")";
}

void BatchNormalization::forget_last_forward() noexcept {
  input_shape_.clear();
  forward_was_training_ = false;
  x_hat_.clear();
  batch_mean_.clear();
  batch_var_.clear();
  inv_std_.clear();
  samples_ = 0;
}

namespace {
// The replacements made so far, by the layer they replace (kept alive, so that no other link
// takes its address meanwhile): a shared layer stays shared.
using Replacements =
    std::unordered_map<const Link *, std::pair<std::shared_ptr<Link>, std::shared_ptr<Link>>>;

void convert_links(Sequential &model, Communicator &comm, Replacements &done) {
  for (std::size_t k = 0; k < model.links().size(); ++k) {
    Link *link = model.links()[k].get();
    if (auto *nested = dynamic_cast<Sequential *>(link)) {
      convert_links(*nested, comm, done);
    } else if (link != nullptr && typeid(*link) == typeid(BatchNormalization)) {
      auto &[old, replacement] = done[link];
      if (!replacement) {
        old = model.links()[k];
        replacement = std::make_shared<MultiNodeBatchNormalization>(
            static_cast<const BatchNormalization &>(*link), comm);
      }
      model.replace(k, replacement);
    }
  }
}
}  // namespace

std::size_t convert_to_multi_node_batch_normalization(Sequential &model, Communicator &comm) {
  Replacements done;
  convert_links(model, comm, done);
  return done.size();
}

std::string MultiNodeBatchNormalization::name() const {
  return "MultiNodeBatchNormalization(" + std::to_string(channels()) + ")";
}

std::vector<Parameter *> BatchNormalization::parameters() {
  std::vector<Parameter *> params;
  if (options_.use_gamma) params.push_back(&gamma_);
  if (options_.use_beta) params.push_back(&beta_);
  return params;
}

void BatchNormalization::reduce_sums(std::vector<double> & /*sums*/) {}

void MultiNodeBatchNormalization::reduce_sums(std::vector<double> &sums) {
  comm_->allreduce(Span<double>(sums));
}

// Empty when `t` fits; else what is wrong with it (the caller still joins the reduction).
std::string BatchNormalization::check_input(const Tensor &t, bool gradient) const {
  const std::string who = name() + (gradient ? "::backward" : "::forward");
  const std::optional<std::size_t> count = internal::checked_element_count(t.shape);
  if (!count || *count != t.data.size()) {
    return who + ": shape " + t.shape_string() + " does not describe its " +
           std::to_string(t.data.size()) + " elements";
  }
  if (gradient) {
    if (input_shape_.empty()) return who + ": no forward to go back through";
    if (t.shape != input_shape_) {
      return who + ": gradient " + t.shape_string() + " does not match the last input " +
             Tensor(input_shape_).shape_string();
    }
    return {};
  }
  if (t.shape.size() < 2 || t.shape[1] != channels_) {
    return who + ": expected a {batch, " + std::to_string(channels_) + ", ...} tensor, got " +
           t.shape_string();
  }
  return {};
}

void BatchNormalization::fail_together(double bad_ranks, const std::string &own_error,
                                       const char *what) const {
  if (!own_error.empty()) throw InvalidArgument(own_error);
  if (bad_ranks > 0) {
    throw RemoteError(name() + "::" + what + ": " + std::to_string(static_cast<long>(bad_ranks)) +
                      " other rank(s) passed input this layer cannot take (their own errors "
                      "say what)");
  }
}

Tensor BatchNormalization::forward(const Tensor &x) {
  const auto channel_count = static_cast<std::size_t>(channels_);
  // Until this forward succeeds there is nothing to go back through (not the last batch).
  input_shape_.clear();
  forward_was_training_ = training_;
  if (!training_) {
    // Running statistics, no communication.
    const std::string error = check_input(x, false);
    if (!error.empty()) throw InvalidArgument(error);
    input_shape_ = x.shape;
    inv_std_.resize(channel_count);
    const std::vector<double> mean(running_mean_.begin(), running_mean_.end());
    for (std::size_t c = 0; c < channel_count; ++c) {
      inv_std_[c] = 1.0 / std::sqrt(static_cast<double>(running_var_[c]) + options_.eps);
    }
    return normalize(x, mean);
  }

  const std::string error = check_input(x, false);
  std::vector<double> sums(kFirst + 2 * channel_count, 0.0);
  if (error.empty()) {
    const int64_t batch = x.shape[0], spatial = spatial_size(x.shape);
    sums[kCount] = static_cast<double>(batch * spatial);
    accumulate(x.data.data(), nullptr, batch, channels_, spatial, sums.data() + kFirst,
               sums.data() + kFirst + channel_count);
  } else {
    sums[kBad] = 1;
  }
  reduce_sums(sums);
  fail_together(sums[kBad], error, "forward");
  const double count = sums[kCount];
  if (count <= 0) {
    // Every rank sees the same total, so every rank throws this.
    throw InvalidArgument(name() + "::forward: the batch has no samples on any rank");
  }

  input_shape_ = x.shape;
  samples_ = count;
  const double decay =
      finetuning_ ? 1.0 - 1.0 / static_cast<double>(++finetuned_batches_) : options_.decay;
  batch_mean_.resize(channel_count);
  batch_var_.resize(channel_count);
  inv_std_.resize(channel_count);
  for (std::size_t c = 0; c < channel_count; ++c) {
    const double mean = sums[kFirst + c] / count;
    // E[x^2] - E[x]^2 in float64: exact enough unless |mean| / std exceeds ~1e5.
    const double var = std::max(sums[kFirst + channel_count + c] / count - mean * mean, 0.0);
    batch_mean_[c] = mean;
    batch_var_[c] = var;
    inv_std_[c] = 1.0 / std::sqrt(var + options_.eps);
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    running_mean_[c] = static_cast<float>(decay * running_mean_[c] + (1 - decay) * mean);
    running_var_[c] = static_cast<float>(decay * running_var_[c] + (1 - decay) * unbiased);
  }

  return normalize(x, batch_mean_);
}

Tensor BatchNormalization::backward(const Tensor &grad_y) {
  const auto channel_count = static_cast<std::size_t>(channels_);
  const std::string error = check_input(grad_y, true);
  // A backward follows its forward's mode: after an evaluation forward the statistics were
  // fixed, so there is nothing to share. Without a forward, the current mode decides whether
  // the other ranks are to be told.
  const bool shared = input_shape_.empty() ? training_ : forward_was_training_;
  if (!shared && !error.empty()) throw InvalidArgument(error);
  std::vector<double> sums(kFirst + 2 * channel_count, 0.0);
  const int64_t batch = error.empty() ? grad_y.shape[0] : 0;
  const int64_t spatial = error.empty() ? spatial_size(grad_y.shape) : 0;
  if (batch > 0) {
    accumulate(grad_y.data.data(), x_hat_.data(), batch, channels_, spatial, sums.data() + kFirst,
               sums.data() + kFirst + channel_count);
  }
  if (!error.empty()) sums[kBad] = 1;
  if (shared) {
    reduce_sums(sums);
    fail_together(sums[kBad], error, "backward");
  }

  // Parameter gradients: the global sums over the ranks (the mean of the ranks' own sums) in
  // training mode; this rank's sums in evaluation mode.
  const double per_rank = shared ? 1.0 / ranks() : 1.0;
  for (std::size_t c = 0; c < channel_count; ++c) {
    beta_.grad[c] = options_.use_beta ? static_cast<float>(sums[kFirst + c] * per_rank) : 0.0f;
    gamma_.grad[c] =
        options_.use_gamma ? static_cast<float>(sums[kFirst + channel_count + c] * per_rank) : 0.0f;
  }

  // dx = gamma / std * (dy - (sum dy + x_hat * sum dy x_hat) / M) over the whole batch; with
  // fixed statistics simply gamma / std * dy.
  std::vector<double> scale(channel_count), mean_dy(channel_count, 0.0),
      mean_dy_xhat(channel_count, 0.0);
  for (std::size_t c = 0; c < channel_count; ++c) {
    scale[c] = gamma_.value[c] * inv_std_[c];
    if (shared) {
      mean_dy[c] = sums[kFirst + c] / samples_;
      mean_dy_xhat[c] = sums[kFirst + channel_count + c] / samples_;
    }
  }
  Tensor grad_x(grad_y.shape);
  for_each_run(
      batch, channels_, spatial, [&](auto flat, std::size_t c0, std::size_t k, int64_t length) {
        const float *__restrict dy = grad_y.data.data() + k;
        const float *__restrict xh = x_hat_.data() + k;
        float *__restrict dx = grad_x.data.data() + k;
        for (int64_t s = 0; s < length; ++s) {
          const std::size_t c = channel_of(flat, c0, s);
          dx[s] = static_cast<float>(scale[c] * (dy[s] - mean_dy[c] - xh[s] * mean_dy_xhat[c]));
        }
      });
  return grad_x;
}

// y = gamma * x_hat + beta with x_hat = (x - mean) * inv_std_, per channel; keeps x_hat.
Tensor BatchNormalization::normalize(const Tensor &x, const std::vector<double> &mean) {
  x_hat_.resize(x.data.size());
  Tensor y(x.shape);
  for_each_run(x.shape[0], channels_, spatial_size(x.shape),
               [&](auto flat, std::size_t c0, std::size_t k, int64_t length) {
                 const float *__restrict in = x.data.data() + k;
                 float *__restrict xh = x_hat_.data() + k;
                 float *__restrict out = y.data.data() + k;
                 for (int64_t s = 0; s < length; ++s) {
                   const std::size_t c = channel_of(flat, c0, s);
                   xh[s] = static_cast<float>((in[s] - mean[c]) * inv_std_[c]);
                   out[s] = gamma_.value[c] * xh[s] + beta_.value[c];
                 }
               });
  return y;
}

void allreduce_persistent(Communicator &comm, Link &model) {
  std::vector<Span<float>> values;
  LayoutDigest layout;
  for (std::vector<float> *p : model.persistents()) {
    values.emplace_back(*p);
    layout.add(p->size());
  }
  // The layouts first: a rank whose model has no persistent values (or others) skipped the
  // allreduce, or met the others' with other sizes, and they waited until the timeout.
  agree_or_throw(comm, "allreduce_persistent", nullptr, layout.add(values.size()).value());
  if (!values.empty()) comm.allreduce_coalesced(values, ReduceOp::kAvg);
}

}  // namespace mncl

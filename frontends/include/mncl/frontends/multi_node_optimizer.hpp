// The multi-node optimizer (ChainerMN's create_multi_node_optimizer): wraps any optimizer with
// an update(params, grads) member (see optimizer.hpp) and makes data-parallel training look
// like single-process training.
//
//   mncl::MultiNodeOptimizer<mncl::Adam> opt(mncl::Adam({1e-3f}), comm);
//   for (...) { forward_backward(); opt.update(params, grads); }
//
//  - The first update() broadcasts the parameters from the root rank and does not step, so
//    every rank starts from the same model whatever it initialised.
//  - Every later update() averages the gradients over the ranks, then steps the wrapped
//    optimizer with the averages. Gradients are packed into fusion buffers of at most
//    fusion_buffer_bytes and exchanged by one coalesced allreduce (like Horovod/DDP buckets).
//  - grad_dtype kFloat16/kBFloat16 sends the float32 gradients at half the bytes (scaled by
//    1/size before the conversion so the sum cannot overflow); the averages are float32 again.
//  - double_buffering overlaps the exchange of step t's gradients with the caller's compute of
//    step t+1 (non-blocking allreduce): update() then steps with the averages of the *previous*
//    update's gradients, a lag of exactly one step. The first update after the broadcast only
//    starts an exchange.
//  - zero_fill: a parameter may have no gradient on some ranks (pass an empty grad span); it
//    then contributes zeros, and every rank still steps it with the average. With zero_fill off
//    a missing gradient is an error (the ranks' buffers would no longer line up).
#ifndef MNCL_FRONTENDS_MULTI_NODE_OPTIMIZER_HPP
#define MNCL_FRONTENDS_MULTI_NODE_OPTIMIZER_HPP

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/dtype.hpp"
#include "mncl/frontends/optimizer.hpp"

namespace mncl {

// The element type gradients travel in.
enum class GradDtype { kFloat32, kFloat16, kBFloat16 };

struct MultiNodeOptimizerOptions {
  // Bytes (in grad_dtype) per fusion buffer; 0 packs each parameter into its own buffer.
  std::size_t fusion_buffer_bytes = std::size_t{4} << 20;
  GradDtype grad_dtype = GradDtype::kFloat32;
  bool double_buffering = false;
  bool zero_fill = true;
  int root = 0;  // whose parameters the first update broadcasts
};

template <class Optimizer>
class MultiNodeOptimizer {
 public:
  using Options = MultiNodeOptimizerOptions;

  // `comm` must outlive the optimizer.
  MultiNodeOptimizer(Optimizer optimizer, Communicator &comm, Options options = {})
      : optimizer_(std::move(optimizer)), comm_(&comm), options_(options) {}
  MultiNodeOptimizer(const MultiNodeOptimizer &) = delete;
  MultiNodeOptimizer &operator=(const MultiNodeOptimizer &) = delete;

  // Collective. params and grads pair up by index; an empty grad span means "no gradient on this
  // rank" (see zero_fill). The parameter list must keep its shape across updates.
  void update(const ParamSpans &params, const GradSpans &grads) {
    check_arguments(params, grads);
    if (updates_ == 0) {
      broadcast_params(params);
      ++updates_;
      return;
    }
    prepare_layout(params);
    if (options_.double_buffering) {
      finish_exchange();  // the previous update's gradients, averaged
      start_exchange(grads);
      if (have_averaged_) optimizer_.update(params, averaged_spans_);
    } else {
      start_exchange(grads);
      finish_exchange();
      optimizer_.update(params, averaged_spans_);
    }
    ++updates_;
  }

  // Double buffering: completes the exchange in flight (before a checkpoint, or to read the
  // averages). The next update() still steps with them, so the one-step lag is unchanged.
  void synchronize() { finish_exchange(); }

  // The averaged gradients the last step used (or the next double-buffered step will use).
  const GradSpans &averaged_grads() const noexcept { return averaged_spans_; }
  Optimizer &actual_optimizer() noexcept { return optimizer_; }
  // Calls to update() so far, the broadcast included.
  uint64_t updates() const noexcept { return updates_; }

  void save(OutArchive &ar) const {
    if (in_flight_) {
      throw InvalidArgument(
          "MultiNodeOptimizer::save: a gradient exchange is in flight; call synchronize() first");
    }
    ar << updates_ << have_averaged_ << averaged_;
    if constexpr (is_serializable<Optimizer>()) ar << optimizer_;
  }
  void load(InArchive &ar) {
    finish_exchange();
    ar >> updates_ >> have_averaged_ >> averaged_;
    if constexpr (is_serializable<Optimizer>()) ar >> optimizer_;
    layout_ready_ = false;  // rebuilt (and checked against averaged_) on the next update
  }

 private:
  void check_arguments(const ParamSpans &params, const GradSpans &grads) const {
    if (params.size() != grads.size()) {
      throw InvalidArgument("MultiNodeOptimizer::update: " + std::to_string(params.size()) +
                            " parameters but " + std::to_string(grads.size()) + " gradients");
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (grads[i].size() == params[i].size()) continue;
      if (grads[i].empty() && options_.zero_fill) continue;
      throw InvalidArgument("MultiNodeOptimizer::update: parameter " + std::to_string(i) + " has " +
                            std::to_string(params[i].size()) + " elements but its gradient " +
                            std::to_string(grads[i].size()) +
                            (grads[i].empty() ? " (no gradient: enable zero_fill)" : ""));
    }
  }

  void broadcast_params(const ParamSpans &params) {
    std::vector<float> flat;
    for (const auto &p : params) flat.insert(flat.end(), p.begin(), p.end());
    const std::size_t chunk = std::max<std::size_t>(1, comm_->max_message_bytes() / sizeof(float));
    for (std::size_t offset = 0; offset < flat.size(); offset += chunk) {
      comm_->bcast(Span<float>(flat.data() + offset, std::min(chunk, flat.size() - offset)),
                   options_.root);
    }
    std::size_t offset = 0;
    for (const auto &p : params) {
      std::copy_n(flat.data() + offset, p.size(), p.data());
      offset += p.size();
    }
  }

  // Offsets of each parameter in the flat buffers, the fusion buckets, and the buffers.
  void prepare_layout(const ParamSpans &params) {
    if (layout_ready_) {
      bool same = sizes_.size() == params.size();
      for (std::size_t i = 0; same && i < params.size(); ++i) same = sizes_[i] == params[i].size();
      if (!same) {
        throw InvalidArgument(
            "MultiNodeOptimizer::update: the parameters changed shape since the last update");
      }
      return;
    }
    offsets_.clear();
    sizes_.clear();
    std::size_t total = 0;
    for (const auto &p : params) {
      offsets_.push_back(total);
      sizes_.push_back(p.size());
      total += p.size();
    }
    if (averaged_.size() != total) {
      if (!averaged_.empty()) {
        throw InvalidArgument("MultiNodeOptimizer::update: the parameters do not match the " +
                              std::to_string(averaged_.size()) + " elements of the loaded state");
      }
      averaged_.assign(total, 0.0f);
    }
    averaged_spans_.clear();
    for (std::size_t i = 0; i < params.size(); ++i) {
      averaged_spans_.emplace_back(averaged_.data() + offsets_[i], sizes_[i]);
    }
    const std::size_t element_bytes = options_.grad_dtype == GradDtype::kFloat32 ? 4 : 2;
    buckets_.clear();
    if (options_.fusion_buffer_bytes == 0) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (sizes_[i]) buckets_.emplace_back(offsets_[i], sizes_[i]);
      }
    } else {
      const std::size_t per_bucket =
          std::max<std::size_t>(1, options_.fusion_buffer_bytes / element_bytes);
      for (std::size_t offset = 0; offset < total; offset += per_bucket) {
        buckets_.emplace_back(offset, std::min(per_bucket, total - offset));
      }
    }
    switch (options_.grad_dtype) {
      case GradDtype::kFloat32:
        if (options_.double_buffering) comm_f32_.assign(total, 0.0f);
        break;
      case GradDtype::kFloat16:
        comm_f16_.assign(total, Float16{});
        break;
      case GradDtype::kBFloat16:
        comm_bf16_.assign(total, BFloat16{});
        break;
    }
    layout_ready_ = true;
  }

  // Packs the gradients and starts (double buffering) or runs the coalesced allreduce.
  void start_exchange(const GradSpans &grads) {
    const float inv_size = 1.0f / static_cast<float>(comm_->size());
    switch (options_.grad_dtype) {
      case GradDtype::kFloat32: {
        // Summed as they are and divided once on unpacking: exact for small integers.
        float *buffer = options_.double_buffering ? comm_f32_.data() : averaged_.data();
        pack(grads, buffer, [](float g) { return g; });
        launch(buffer);
        break;
      }
      case GradDtype::kFloat16:
        pack(grads, comm_f16_.data(), [inv_size](float g) { return to_float16(g * inv_size); });
        launch(comm_f16_.data());
        break;
      case GradDtype::kBFloat16:
        pack(grads, comm_bf16_.data(), [inv_size](float g) { return to_bfloat16(g * inv_size); });
        launch(comm_bf16_.data());
        break;
    }
    in_flight_ = true;
  }

  // Waits for the exchange (if any) and leaves the averages in averaged_.
  void finish_exchange() {
    if (!in_flight_) return;
    in_flight_ = false;
    request_.wait();
    const float inv_size = 1.0f / static_cast<float>(comm_->size());
    switch (options_.grad_dtype) {
      case GradDtype::kFloat32: {
        const float *sums = options_.double_buffering ? comm_f32_.data() : averaged_.data();
        for (std::size_t j = 0; j < averaged_.size(); ++j) averaged_[j] = sums[j] * inv_size;
        break;
      }
      case GradDtype::kFloat16:
        for (std::size_t j = 0; j < averaged_.size(); ++j) averaged_[j] = to_float(comm_f16_[j]);
        break;
      case GradDtype::kBFloat16:
        for (std::size_t j = 0; j < averaged_.size(); ++j) averaged_[j] = to_float(comm_bf16_[j]);
        break;
    }
    have_averaged_ = true;
  }

  template <class Wire, class Convert>
  void pack(const GradSpans &grads, Wire *buffer, Convert convert) const {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      Wire *out = buffer + offsets_[i];
      if (grads[i].empty()) {  // zero_fill
        std::fill_n(out, sizes_[i], convert(0.0f));
      } else {
        std::transform(grads[i].begin(), grads[i].end(), out, convert);
      }
    }
  }

  template <class Wire>
  void launch(Wire *buffer) {
    if (buckets_.empty()) return;
    std::vector<Span<Wire>> spans;
    spans.reserve(buckets_.size());
    for (const auto &[offset, count] : buckets_) spans.emplace_back(buffer + offset, count);
    if (options_.double_buffering) {
      request_ = comm_->iallreduce_coalesced(spans, ReduceOp::kSum);
    } else {
      comm_->allreduce_coalesced(spans, ReduceOp::kSum);
    }
  }

  Optimizer optimizer_;
  Communicator *comm_;
  Options options_;
  uint64_t updates_ = 0;

  bool layout_ready_ = false;
  std::vector<std::size_t> offsets_, sizes_;
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;  // (offset, count) in elements
  std::vector<float> averaged_;  // the averages handed to the wrapped optimizer
  GradSpans averaged_spans_;
  bool have_averaged_ = false;
  // Wire buffers: float32 only needs its own when double buffering (else averaged_ is used).
  std::vector<float> comm_f32_;
  std::vector<Float16> comm_f16_;
  std::vector<BFloat16> comm_bf16_;
  bool in_flight_ = false;
  Request request_;  // last: destroyed first, so its buffers outlive a wait in its destructor
};

// ChainerMN's spelling: create_multi_node_optimizer(optimizer, comm, options).
template <class Optimizer>
MultiNodeOptimizer<Optimizer> make_multi_node_optimizer(Optimizer optimizer, Communicator &comm,
                                                        MultiNodeOptimizerOptions options = {}) {
  return MultiNodeOptimizer<Optimizer>(std::move(optimizer), comm, options);
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_MULTI_NODE_OPTIMIZER_HPP

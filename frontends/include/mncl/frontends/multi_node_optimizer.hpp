// The multi-node optimizer (ChainerMN's create_multi_node_optimizer): wraps any optimizer with
// an update(params, grads) member (see optimizer.hpp) and makes data-parallel training look
// like single-process training.
//
//   mncl::MultiNodeOptimizer<mncl::Adam> opt(mncl::Adam({1e-3f}), comm);
//   for (...) { forward_backward(); opt.update(params, grads); }
//
//  - The first update() first broadcasts the parameters from the root rank, so every rank
//    starts from the same model whatever it initialised; the broadcast consumes no gradient,
//    that call's gradients are used like any other's. They were computed from this rank's own
//    initial parameters: where the ranks initialise differently (not from the same seeds),
//    call broadcast_parameters() before computing the first gradients.
//  - Every update() averages the gradients over the ranks, then steps the wrapped optimizer
//    with the averages. Gradients are packed into fusion buffers of at most
//    fusion_buffer_bytes and exchanged by one coalesced allreduce (like Horovod/DDP buckets).
//  - grad_dtype kFloat16/kBFloat16 sends the float32 gradients at half the bytes (scaled by
//    1/size before the conversion so the sum cannot overflow); the averages are float32 again.
//  - double_buffering overlaps the exchange of step t's gradients with the caller's compute of
//    step t+1 (non-blocking allreduce): update() then steps with the averages of the *previous*
//    update's gradients, a lag of exactly one step. The first update (or step, with
//    allreduce_every) only starts an exchange.
//  - zero_fill: a parameter may have no gradient on some ranks (pass an empty grad span); it
//    then contributes zeros, and every rank still steps it with the average. With zero_fill off
//    a missing gradient is an error (the ranks' buffers would no longer line up).
//  - allreduce_every = k (communication frequency): update() is called once per micro-batch;
//    k consecutive calls accumulate their gradients locally, and the k-th exchanges their mean
//    once and steps — the same step as one k-times larger batch (gradients being per-batch
//    means), for 1/k of the communication. Only that call returns true. Calls 1..k form the
//    first step, k+1..2k the second, and so on. Double buffering then overlaps each exchange
//    with the next k micro-batches.
//  - Built on a HierarchicalCommunicator (hierarchical.hpp), the gradients are averaged within
//    each host first, then across the hosts; the broadcast and the divisor use its world.
//    Without double buffering: the hierarchical allreduce has no non-blocking form.
//  - Every rank fails together (agreement.hpp): the calls that communicate (the first, which
//    broadcasts, and each round's last, which exchanges) and broadcast_parameters() first
//    exchange whether each rank accepts its arguments, with a digest of its parameter sizes,
//    settings and progress (one allgather of two int64 per rank, counted in wait_seconds).
//    Arguments refused on one rank (gradient sizes, a changed parameter list) throw
//    InvalidArgument there and RemoteError naming it on the others; parameter lists, settings
//    (grad_dtype, double_buffering, allreduce_every, fusion_buffer_bytes, root, the
//    communicator's max_message_bytes, hierarchical or not, and its algorithm) or progress (a
//    snapshot loaded on some ranks only) that differ between the ranks throw InvalidArgument on
//    every rank. Nothing moves or changes then (a double-buffered exchange in flight is completed
//    first; its averages wait for the next step). A micro-batch that only accumulates
//    (allreduce_every > 1) is checked on its rank alone, so that it holds no rank up: refused,
//    it throws there and counts for nothing, and the others wait at the round's exchange for
//    that rank's next micro-batch.
//  - The wrapped optimizer steps after the exchange: what its update throws comes out of
//    update() on its rank only, once every rank took part, and the round's gradients are spent
//    (the next round averages its own).
//  - stats() counts exchanges, bytes sent per rank's buffer and the seconds update() spent
//    blocked on communication (the allreduce, or waiting for the one in flight).
//  - save/load (a checkpoint) hold the wrapped optimizer's state: it needs save/load members,
//    or must be declared stateless (is_stateless_optimizer, optimizer.hpp), else they do not
//    compile. A snapshot loads into either double-buffering mode: one saved with double
//    buffering holds averages exchanged but not applied yet, which a run without it applies at
//    its first step (before that step's own); one saved without holds averages already
//    applied, so a double-buffered run starts as at the beginning, its first step only
//    starting an exchange. Either way every gradient is applied once. allreduce_every may
//    differ too, if the snapshot was saved at a step boundary (else load throws). A load that
//    throws changes nothing (the wrapped optimizer's state included, where it is copyable).
#ifndef MNCL_FRONTENDS_MULTI_NODE_OPTIMIZER_HPP
#define MNCL_FRONTENDS_MULTI_NODE_OPTIMIZER_HPP

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "mncl/frontends/agreement.hpp"
#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/dtype.hpp"
#include "mncl/frontends/hierarchical.hpp"
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
  // Micro-batches whose gradients are accumulated per exchange and step (>= 1).
  int allreduce_every = 1;
};

struct ExchangeStats {
  uint64_t exchanges = 0;   // gradient allreduces started
  uint64_t bytes = 0;       // their buffer bytes (in grad_dtype) on this rank
  double wait_seconds = 0;  // time update()/synchronize() spent blocked on them
};

template <class Optimizer>
class MultiNodeOptimizer {
 public:
  using Options = MultiNodeOptimizerOptions;

  // `comm` must outlive the optimizer.
  MultiNodeOptimizer(Optimizer optimizer, Communicator &comm, Options options = {})
      : optimizer_(std::move(optimizer)), comm_(&comm), options_(options) {
    if (options_.allreduce_every < 1) {
      throw InvalidArgument("MultiNodeOptimizer: allreduce_every must be >= 1, not " +
                            std::to_string(options_.allreduce_every));
    }
  }
  // Gradients through `hierarchical` (which must outlive the optimizer), see above.
  MultiNodeOptimizer(Optimizer optimizer, HierarchicalCommunicator &hierarchical,
                     Options options = {})
      : MultiNodeOptimizer(std::move(optimizer), hierarchical.world(), options) {
    if (options_.double_buffering) {
      throw InvalidArgument(
          "MultiNodeOptimizer: double_buffering needs a non-blocking allreduce, which a "
          "HierarchicalCommunicator does not have");
    }
    hierarchical_ = &hierarchical;
  }
  MultiNodeOptimizer(const MultiNodeOptimizer &) = delete;
  MultiNodeOptimizer &operator=(const MultiNodeOptimizer &) = delete;

  // Collective. params and grads pair up by index; an empty grad span means "no gradient on this
  // rank" (see zero_fill). The parameter list must keep its shape across updates. Returns
  // whether the parameters were stepped (false for micro-batches that only accumulate, and for
  // the first double-buffered exchange).
  bool update(const ParamSpans &params, const GradSpans &grads) {
    std::exception_ptr own_error;
    try {
      check_arguments(params, grads);
    } catch (...) {
      own_error = std::current_exception();
    }
    // Only the calls that communicate agree first (see the top of the file): a micro-batch that
    // only accumulates holds no rank up.
    const bool exchanges = accumulated_ + 1 >= options_.allreduce_every;
    if (!exchanges && broadcasted_) {
      if (own_error) std::rethrow_exception(own_error);
    } else {
      // Double buffering: the exchange in flight completes before the agreement's collective.
      if (exchanges) finish_exchange();
      agree(own_error, "MultiNodeOptimizer::update", digest(params));
    }
    // Not a step of its own: these gradients are the first micro-batch, so the first k calls
    // make the first step, as the caller's loop over groups of k micro-batches expects.
    if (!broadcasted_) {
      broadcast_params(params);
      broadcasted_ = true;
    }
    prepare_layout(params);
    ++updates_;
    const GradSpans *to_send = &grads;
    if (options_.allreduce_every > 1) {
      accumulate(grads);
      if (++accumulated_ < options_.allreduce_every) return false;
      accumulated_ = 0;
      to_send = &accumulated_spans_;
    }
    // The exchange before every step of the wrapped optimizer: what its update throws is this
    // rank's own, once every rank has taken part; and the round's micro-batches are spent once
    // packed (a step that threw left them to be sent again with the next round's).
    if (options_.double_buffering) {
      // The previous exchange's averages are ready (finish_exchange() above).
      start_exchange(*to_send);
      if (options_.allreduce_every > 1) clear_accumulator();
      if (!have_averaged_) return false;
      optimizer_.update(params, averaged_spans_);
      return true;
    }
    std::vector<float> unapplied = std::move(unapplied_);  // a double-buffered snapshot's
    unapplied_.clear();
    start_exchange(*to_send);
    if (options_.allreduce_every > 1) clear_accumulator();
    if (!unapplied.empty()) {  // exchanged before that snapshot, applied first (see load)
      try {
        optimizer_.update(params, spans_over(unapplied));
      } catch (...) {
        finish_exchange();  // this round's averages stay for averaged_grads()
        throw;
      }
    }
    finish_exchange();
    optimizer_.update(params, averaged_spans_);
    return true;
  }

  // Collective: broadcasts the root's parameters now; the first update() does it otherwise (and
  // then uses its gradients, computed from this rank's own initial parameters). Call it before
  // computing the first gradients where the ranks' initial parameters differ.
  void broadcast_parameters(const ParamSpans &params) {
    LayoutDigest sizes;
    sizes.add(static_cast<uint64_t>(options_.root)).add(comm_->max_message_bytes());
    sizes.add(params.size());
    for (const auto &p : params) sizes.add(p.size());
    agree(nullptr, "MultiNodeOptimizer::broadcast_parameters", sizes.value());
    broadcast_params(params);
    broadcasted_ = true;
  }

  // Double buffering: completes the exchange in flight (before a checkpoint, or to read the
  // averages). The next update() still steps with them, so the one-step lag is unchanged.
  void synchronize() { finish_exchange(); }

  // The averaged gradients the last step used (or the next double-buffered step will use).
  const GradSpans &averaged_grads() const noexcept { return averaged_spans_; }
  Optimizer &actual_optimizer() noexcept { return optimizer_; }
  // Calls to update() so far.
  uint64_t updates() const noexcept { return updates_; }
  // Micro-batches accumulated towards the next exchange (allreduce_every > 1).
  int pending_micro_batches() const noexcept { return accumulated_; }
  const Options &options() const noexcept { return options_; }
  const ExchangeStats &stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = ExchangeStats{}; }

  // A snapshot (checkpointer.hpp): progress, averages, accumulation and the wrapped optimizer's
  // state (see the top of the file). Complete an exchange in flight first (synchronize()).
  void save(OutArchive &ar) const {
    require_optimizer_state();
    if (in_flight_) {
      throw InvalidArgument(
          "MultiNodeOptimizer::save: a gradient exchange is in flight; call synchronize() first");
    }
    // Averages loaded from a double-buffered snapshot and not applied yet are still that
    // snapshot's state (averaged_ holds them until the step that applies them).
    const bool pending_averages = options_.double_buffering || !unapplied_.empty();
    ar << kSnapshotTag << kSnapshotVersion << updates_ << broadcasted_ << pending_averages
       << static_cast<int32_t>(options_.allreduce_every) << have_averaged_ << averaged_;
    if constexpr (is_serializable<Optimizer>()) ar << optimizer_;
    ar << accumulated_ << accumulator_;
  }
  void load(InArchive &ar) {
    require_optimizer_state();
    finish_exchange();
    // A load that throws (a truncated snapshot, another allreduce_every mid-round) leaves this
    // optimizer as it was: its own progress is read aside and committed last, and the wrapped
    // optimizer, which loads in place, gets back the state it saves here (its own save/load:
    // it need not be copyable). (from_bytes checks for bytes left over only after this.)
    std::vector<uint8_t> optimizer_before;
    if constexpr (is_serializable<Optimizer>()) optimizer_before = to_bytes(optimizer_);
    try {
      load_and_commit(ar);
    } catch (...) {
      if constexpr (is_serializable<Optimizer>()) {
        from_bytes(Span<const uint8_t>(optimizer_before), optimizer_);
      }
      throw;
    }
  }

 private:
  void load_and_commit(InArchive &ar) {
    Progress loaded;
    uint64_t first = 0;
    ar >> first;
    // What the snapshot's run did; snapshots from before the tag did not say, and are taken as
    // this run's settings (as they always were).
    bool saved_double_buffering = options_.double_buffering;
    int32_t saved_every = options_.allreduce_every;
    if (first == kSnapshotTag) {
      uint32_t version = 0;
      ar >> version;
      if (version != kSnapshotVersion) {
        throw SerializationError("MultiNodeOptimizer::load: snapshot format " +
                                 std::to_string(version) + " is unknown");
      }
      ar >> loaded.updates >> loaded.broadcasted >> saved_double_buffering >> saved_every >>
          loaded.have_averaged >> loaded.averaged;
      if constexpr (is_serializable<Optimizer>()) ar >> optimizer_;
      ar >> loaded.accumulated >> loaded.accumulator;
    } else {
      loaded.updates = first;  // (the broadcast counted as an update then)
      loaded.broadcasted = loaded.updates > 0;
      ar >> loaded.have_averaged >> loaded.averaged;
      if constexpr (is_serializable<Optimizer>()) ar >> optimizer_;
      if (options_.allreduce_every > 1) ar >> loaded.accumulated >> loaded.accumulator;
    }
    if (saved_every < 1 || loaded.accumulated < 0 || loaded.accumulated >= saved_every ||
        (!loaded.accumulator.empty() && loaded.accumulator.size() != loaded.averaged.size())) {
      throw SerializationError("MultiNodeOptimizer::load: inconsistent accumulation state");
    }
    if (saved_every != options_.allreduce_every) {
      // Part of a round of another length cannot be finished in this run's rounds.
      if (loaded.accumulated != 0) {
        throw InvalidArgument("MultiNodeOptimizer::load: the snapshot was saved after " +
                              std::to_string(loaded.accumulated) + " of " +
                              std::to_string(saved_every) +
                              " micro-batches (allreduce_every = " + std::to_string(saved_every) +
                              "); resume it with that allreduce_every, or save at a step boundary");
      }
      loaded.accumulator.clear();  // zeros of this run's layout on the next update
    }
    // The other double-buffering mode: apply every exchanged gradient exactly once.
    if (saved_double_buffering && !options_.double_buffering && loaded.have_averaged) {
      loaded.unapplied = loaded.averaged;  // exchanged, not applied: the next step applies them
    } else if (!saved_double_buffering && options_.double_buffering) {
      loaded.have_averaged = false;  // applied already: the next step only starts an exchange
    }
    // Commit (nothing below throws).
    updates_ = loaded.updates;
    broadcasted_ = loaded.broadcasted;
    have_averaged_ = loaded.have_averaged;
    averaged_ = std::move(loaded.averaged);
    accumulated_ = loaded.accumulated;
    accumulator_ = std::move(loaded.accumulator);
    unapplied_ = std::move(loaded.unapplied);
    layout_ready_ = false;  // rebuilt (and checked against averaged_) on the next update
    // The spans pointed into the vectors just replaced: aim them at the loaded ones while the
    // layout fits (averaged_grads() stays readable), else drop them until the next update.
    averaged_spans_ = spans_over(averaged_);
    accumulated_spans_ = spans_over(accumulator_);
  }

  // agree_or_throw (agreement.hpp), its time counted as time blocked on communication.
  void agree(std::exception_ptr own_error, const char *what, int64_t digest) {
    const auto begin = std::chrono::steady_clock::now();
    try {
      agree_or_throw(*comm_, what, own_error, digest);
    } catch (...) {
      stats_.wait_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      throw;
    }
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }

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
    if (layout_ready_) {
      bool same = sizes_.size() == params.size();
      for (std::size_t i = 0; same && i < params.size(); ++i) same = sizes_[i] == params[i].size();
      if (!same) {
        throw InvalidArgument(
            "MultiNodeOptimizer::update: the parameters changed shape since the last update");
      }
      return;
    }
    std::size_t total = 0;
    for (const auto &p : params) total += p.size();
    if (!averaged_.empty() && averaged_.size() != total) {
      throw InvalidArgument("MultiNodeOptimizer::update: the parameters' " + std::to_string(total) +
                            " elements do not match the " + std::to_string(averaged_.size()) +
                            " of the loaded state");
    }
  }

  // What must be the same on every rank for the exchange to line up: the parameter sizes, the
  // settings, and the progress that decides which collectives this update enters.
  int64_t digest(const ParamSpans &params) const {
    LayoutDigest d;
    d.add(options_.fusion_buffer_bytes)
        .add(static_cast<uint64_t>(options_.grad_dtype))
        .add(options_.double_buffering)
        .add(static_cast<uint64_t>(options_.root))
        .add(static_cast<uint64_t>(options_.allreduce_every))
        .add(comm_->max_message_bytes())  // the broadcast's chunks
        .add(hierarchical_ != nullptr)
        .add(hierarchical_ ? static_cast<uint64_t>(hierarchical_->options().algorithm) : 0)
        .add(broadcasted_)
        .add(static_cast<uint64_t>(accumulated_))
        .add(have_averaged_)
        .add(!unapplied_.empty())
        .add(params.size());
    for (const auto &p : params) d.add(p.size());
    return d.value();
  }

  // What load() reads before it commits.
  struct Progress {
    uint64_t updates = 0;
    bool broadcasted = false;
    bool have_averaged = false;
    std::vector<float> averaged;
    int accumulated = 0;
    std::vector<float> accumulator;
    std::vector<float> unapplied;
  };

  // Spans of each parameter's part of `flat`, by the last layout; none if it does not fit.
  GradSpans spans_over(std::vector<float> &flat) const {
    GradSpans spans;
    if (offsets_.empty() || offsets_.back() + sizes_.back() != flat.size()) return spans;
    for (std::size_t i = 0; i < offsets_.size(); ++i) {
      spans.emplace_back(flat.data() + offsets_[i], sizes_[i]);
    }
    return spans;
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
  // (check_arguments has refused parameters that do not fit.)
  void prepare_layout(const ParamSpans &params) {
    if (layout_ready_) return;
    offsets_.clear();
    sizes_.clear();
    std::size_t total = 0;
    for (const auto &p : params) {
      offsets_.push_back(total);
      sizes_.push_back(p.size());
      total += p.size();
    }
    if (averaged_.size() != total) averaged_.assign(total, 0.0f);
    averaged_spans_ = spans_over(averaged_);
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
    if (options_.allreduce_every > 1) {
      if (accumulator_.size() != total) accumulator_.assign(total, 0.0f);  // (a load may fill it)
      accumulated_spans_ = spans_over(accumulator_);
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

  // Sums a micro-batch's gradients into the accumulator (missing ones add nothing).
  void accumulate(const GradSpans &grads) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].empty()) continue;
      float *sum = accumulator_.data() + offsets_[i];
      const float *g = grads[i].data();
      for (std::size_t j = 0; j < sizes_[i]; ++j) sum[j] += g[j];
    }
  }
  void clear_accumulator() { std::fill(accumulator_.begin(), accumulator_.end(), 0.0f); }

  // The divisor that turns the exchanged sums into means: ranks x accumulated micro-batches.
  float count_divisor() const {
    return static_cast<float>(comm_->size()) * static_cast<float>(options_.allreduce_every);
  }
  float inverse_count() const { return 1.0f / count_divisor(); }

  // Packs the gradients and starts (double buffering) or runs the coalesced allreduce.
  void start_exchange(const GradSpans &grads) {
    const float inv_size = inverse_count();
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
    ++stats_.exchanges;
    stats_.bytes += averaged_.size() * (options_.grad_dtype == GradDtype::kFloat32 ? 4 : 2);
  }

  // Waits for the exchange (if any) and leaves the averages in averaged_.
  void finish_exchange() {
    if (!in_flight_) return;
    in_flight_ = false;
    const auto begin = std::chrono::steady_clock::now();
    request_.wait();
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    switch (options_.grad_dtype) {
      case GradDtype::kFloat32: {
        // A division, not a product with 1/n: sum / n is the correctly rounded mean (x * (1/7)
        // is 1 ulp off for many x), the one a single process on the whole batch computes.
        const float divisor = count_divisor();
        const float *sums = options_.double_buffering ? comm_f32_.data() : averaged_.data();
        for (std::size_t j = 0; j < averaged_.size(); ++j) averaged_[j] = sums[j] / divisor;
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
      const auto begin = std::chrono::steady_clock::now();
      if (hierarchical_) {
        // Agreed just before, on more than the hierarchical call checks: not again.
        hierarchical_->coalesced(spans, ReduceOp::kSum, false);
      } else {
        comm_->allreduce_coalesced(spans, ReduceOp::kSum);
      }
      stats_.wait_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    }
  }

  // Snapshots begin with this tag (then a version); older ones began with the update count.
  static constexpr uint64_t kSnapshotTag = 0x4d4e434c4d4e4f50ull;  // "MNCLMNOP"
  static constexpr uint32_t kSnapshotVersion = 2;
  // Instantiated by save and load only: wrapping such an optimizer is fine until a checkpoint.
  static constexpr void require_optimizer_state() {
    static_assert(
        is_serializable<Optimizer>() || is_stateless_optimizer<Optimizer>::value,
        "MultiNodeOptimizer save/load: the wrapped optimizer has no save(mncl::OutArchive&) const "
        "and load(mncl::InArchive&) members, so its state (momentum, moments) would be missing "
        "from the snapshot and restart from zero on resume. Give it those members, or, if it "
        "truly has no state, declare it stateless: a member `static constexpr bool "
        "stateless_optimizer = true;` or a specialization of mncl::is_stateless_optimizer "
        "(optimizer.hpp)");
  }

  Optimizer optimizer_;
  Communicator *comm_;
  HierarchicalCommunicator *hierarchical_ = nullptr;  // set: gradients go through it
  Options options_;
  uint64_t updates_ = 0;
  bool broadcasted_ = false;  // the root's parameters have been broadcast

  bool layout_ready_ = false;
  std::vector<std::size_t> offsets_, sizes_;
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;  // (offset, count) in elements
  std::vector<float> averaged_;  // the averages handed to the wrapped optimizer
  GradSpans averaged_spans_;
  bool have_averaged_ = false;
  // Loaded from a double-buffered snapshot into a run without it: averages exchanged but not
  // applied, which the next step applies before its own.
  std::vector<float> unapplied_;
  // Wire buffers: float32 only needs its own when double buffering (else averaged_ is used).
  std::vector<float> comm_f32_;
  std::vector<Float16> comm_f16_;
  std::vector<BFloat16> comm_bf16_;
  bool in_flight_ = false;
  // allreduce_every > 1: the running sum of this round's micro-batch gradients.
  std::vector<float> accumulator_;
  GradSpans accumulated_spans_;
  int accumulated_ = 0;
  ExchangeStats stats_;
  Request request_;  // last: destroyed first, so its buffers outlive a wait in its destructor
};

// ChainerMN's spelling: create_multi_node_optimizer(optimizer, comm, options).
template <class Optimizer>
MultiNodeOptimizer<Optimizer> make_multi_node_optimizer(Optimizer optimizer, Communicator &comm,
                                                        MultiNodeOptimizerOptions options = {}) {
  return MultiNodeOptimizer<Optimizer>(std::move(optimizer), comm, options);
}
template <class Optimizer>
MultiNodeOptimizer<Optimizer> make_multi_node_optimizer(Optimizer optimizer,
                                                        HierarchicalCommunicator &hierarchical,
                                                        MultiNodeOptimizerOptions options = {}) {
  return MultiNodeOptimizer<Optimizer>(std::move(optimizer), hierarchical, options);
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_MULTI_NODE_OPTIMIZER_HPP

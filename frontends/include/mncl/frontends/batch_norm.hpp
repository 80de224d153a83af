// Batch normalization, on one rank and across ranks (ChainerMN's MultiNodeBatchNormalization).
//
// In data-parallel training each rank sees only its shard of the batch. Plain batch
// normalization then normalizes by the shard's statistics, which are noisy when shards are
// small; MultiNodeBatchNormalization normalizes by the statistics of the whole global batch,
// exactly as one process holding every rank's samples would:
//
//   mncl::Sequential mlp;
//   mlp.emplace<mncl::Dense>(784, 256, 1)
//      .emplace<mncl::MultiNodeBatchNormalization>(256, comm)   // collective: every rank
//      .emplace<mncl::ReLU>() ...
//
// Input {batch, channels} or {batch, channels, d2, d3, ...} (NCHW-like): each channel is
// normalized over the batch and every trailing dimension. Training mode (the default):
//   forward:  one allreduce of 2C+2 doubles: the sample count and each channel's sum and sum
//             of squares, in float64 (ChainerMN reduces float32 means; the variance then loses
//             digits to cancellation when |mean| >> std).
//   backward: one allreduce of 2C+2 doubles: each channel's sum of dy and of dy * x_hat.
// Ranks may hold different numbers of samples, zero included; the statistics weigh each sample
// once. dx is the full-batch gradient. gamma's and beta's gradients are, as in ChainerMN, the
// global sums divided by the number of ranks (the mean over ranks of each rank's own sum), the
// same on every rank, so MultiNodeOptimizer's averaging leaves them as they are and gives what
// one process training on the global batch with the mean of the ranks' losses would.
//
// A rank whose input this link cannot take (wrong channel count, a shape that does not match
// its data, a backward without a successful forward) still joins the allreduce, so every rank
// fails together: it throws InvalidArgument naming the problem, the others RemoteError. Every
// rank must call forward and backward the same number of times, in the same mode (a layer
// before this one that throws on one rank only leaves the others waiting here until the
// communicator's timeout). Ranks may pass different trailing dimensions ({n, C} on one rank,
// {n, C, H, W} on another): each channel's samples are pooled whatever their layout.
//
// Evaluation mode (set_training(false), Link::set_training on a whole Sequential) normalizes by
// the running statistics and communicates nothing; its backward gives this rank's own sums as
// gamma's and beta's gradients.
//
// Finetuning (Chainer's and ChainerMN's finetune=True): start_finetuning(), then training
// forwards over the data; the N-th of them since updates the running statistics with decay
// 1 - 1/N, so they become the plain mean of those batches' (global) mean and unbiased variance:
// population statistics for evaluation, whatever they were before. stop_finetuning() returns
// to options.decay. The batch count is not persistent (a checkpoint does not carry it).
//
// Where this differs from ChainerMN's MultiNodeBatchNormalization (chainermn/links/
// batch_normalization.py, functions/batch_normalization.py):
// - the running variance starts at 1, as in Chainer's BatchNormalization and PyTorch; ChainerMN's
//   link starts it at 0, which pulls its running variance low for the first few dozen steps;
// - the unbiased factor is M/(M-1) with M the global batch's samples per channel; ChainerMN
//   takes each rank's own m, so with uneven shards its ranks' running variances differ;
// - the statistics weigh every sample once; ChainerMN averages the ranks' means unweighted,
//   which differs from the global batch's where shards are uneven.
// With equal shards the outputs and gradients are ChainerMN's.
#ifndef MNCL_FRONTENDS_BATCH_NORM_HPP
#define MNCL_FRONTENDS_BATCH_NORM_HPP

#include <cstdint>
#include <string>
#include <vector>

#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/links.hpp"

namespace mncl {

struct BatchNormalizationOptions {
  // running = decay * running + (1 - decay) * batch statistic (the variance unbiased, M/(M-1),
  // M the global batch's samples per channel). In (0, 1]; finetuning replaces it (see above).
  float decay = 0.9f;
  float eps = 2e-5f;
  bool use_gamma = true;  // false: the scale is fixed at 1 and is no parameter
  bool use_beta = true;   // false: the shift is fixed at 0 and is no parameter
};

// Batch normalization over this rank's batch only (Chainer's BatchNormalization).
class BatchNormalization : public Link {
 public:
  explicit BatchNormalization(int64_t channels, BatchNormalizationOptions options = {});
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::vector<Parameter *> parameters() override;
  std::vector<std::vector<float> *> persistents() override {
    return {&running_mean_, &running_var_};
  }
  void set_training(bool training) override { training_ = training; }
  std::string name() const override;
  // From the next training forward, the N-th one updates the running statistics with decay
  // 1 - 1/N (N counted from here); stop_finetuning() goes back to options.decay.
  void start_finetuning() noexcept {
    finetuning_ = true;
    finetuned_batches_ = 0;
  }
  void stop_finetuning() noexcept { finetuning_ = false; }
  bool finetuning() const noexcept { return finetuning_; }
  int64_t finetuned_batches() const noexcept { return finetuned_batches_; }

  bool training() const noexcept { return training_; }
  int64_t channels() const noexcept { return channels_; }
  Parameter &gamma() { return gamma_; }
  Parameter &beta() { return beta_; }
  const std::vector<float> &running_mean() const noexcept { return running_mean_; }
  const std::vector<float> &running_var() const noexcept { return running_var_; }
  // The statistics the last training forward normalized by (the global batch's, multi-node).
  const std::vector<double> &batch_mean() const noexcept { return batch_mean_; }
  const std::vector<double> &batch_var() const noexcept { return batch_var_; }

 protected:
  // The per-batch sums, laid out [count, bad ranks, C sums, C sums]: summed here over the
  // samples of every rank that shares the statistics (none but this one, here).
  virtual void reduce_sums(std::vector<double> &sums);
  // How many ranks' losses the gradients of gamma and beta are averaged over.
  virtual int ranks() const { return 1; }
  // Drops what the last forward kept for backward (a backward then has no forward to go
  // through): a copied layer must not mix another layer's batch into its own statistics.
  void forget_last_forward() noexcept;

 private:
  std::string check_input(const Tensor &t, bool gradient) const;
  Tensor normalize(const Tensor &x, const std::vector<double> &mean);
  void fail_together(double bad_ranks, const std::string &own_error, const char *what) const;

  int64_t channels_;
  BatchNormalizationOptions options_;
  bool training_ = true;
  Parameter gamma_, beta_;
  std::vector<float> running_mean_, running_var_;
  // What backward needs from the last forward.
  std::vector<int64_t> input_shape_;
  bool forward_was_training_ = false;
  std::vector<float> x_hat_;
  std::vector<double> batch_mean_, batch_var_, inv_std_;
  double samples_ = 0;  // M: the samples per channel of the (global) batch
  bool finetuning_ = false;
  int64_t finetuned_batches_ = 0;  // N: training forwards since start_finetuning()
};

// Batch normalization by the statistics of every rank's batch (collective: every rank of
// `comm` calls forward and backward together). `comm` must outlive the link.
class MultiNodeBatchNormalization : public BatchNormalization {
 public:
  MultiNodeBatchNormalization(int64_t channels, Communicator &comm,
                              BatchNormalizationOptions options = {})
      : BatchNormalization(channels, options), comm_(&comm) {}
  // `local`'s options, parameters, running statistics, mode and finetuning state, now shared
  // across `comm`'s ranks; not its last forward (a backward first fails on every rank).
  MultiNodeBatchNormalization(const BatchNormalization &local, Communicator &comm)
      : BatchNormalization(local), comm_(&comm) {
    forget_last_forward();
  }
  std::string name() const override;

 protected:
  void reduce_sums(std::vector<double> &sums) override;
  int ranks() const override { return comm_->size(); }

 private:
  Communicator *comm_;
};

// ChainerMN's AllreducePersistent: averages the persistent values (the running statistics of
// batch normalization) of `model` over the ranks of `comm`, so that per-rank BatchNormalization
// layers evaluate and checkpoint alike. Collective; every rank's model must have the same
// layout (agreed first: models that differ throw InvalidArgument on every rank, naming the
// ranks). MultiNodeBatchNormalization keeps them equal already.
void allreduce_persistent(Communicator &comm, Link &model);

// ChainerMN's create_mnbn_model, in place: every BatchNormalization of `model` (exactly that
// class, in nested Sequentials too) becomes a MultiNodeBatchNormalization over `comm` with its
// state (above). Returns how many it replaced; links that are multi-node already, and
// subclasses, are left as they were; a layer that appears twice (one shared_ptr) is replaced
// by one layer, in both places. Pointers to the old links and their parameters (parameters(),
// persistents(), an optimizer's spans) no longer belong to the model: take them again. Local:
// call it on every rank, before the first forward of the converted model. Running statistics
// are carried as they are: where the ranks trained apart before, allreduce_persistent(comm,
// model) (above) makes them agree.
std::size_t convert_to_multi_node_batch_normalization(Sequential &model, Communicator &comm);

}  // namespace mncl

#endif  // MNCL_FRONTENDS_BATCH_NORM_HPP

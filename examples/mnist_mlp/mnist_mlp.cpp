// Data-parallel training of a 784-H-10 MLP on Fashion-MNIST, ChainerMN style:
//
//   mncl-run -n 4 -- mnist_mlp [--epochs 5] [--batch-size 128] [--checkpoint-dir DIR] ...
//
// Rank 0 reads the data and scatter_dataset hands every rank its shard; the multi-node
// optimizer broadcasts the initial model and averages gradients; the evaluator averages the
// test metrics over the ranks' test shards; the checkpointer saves every epoch and resumes.
// The global batch is split over the ranks, so runs with any number of ranks follow the same
// optimisation path up to the order of the samples (--per-rank-batch instead keeps the work per
// rank fixed: weak scaling). A PrefetchLoader assembles each rank's batches on background
// threads; --allreduce-every K exchanges gradients once per K micro-batches. Every epoch
// reports samples/s and the share of training time spent waiting on communication and data.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"
#include "mncl/frontends.hpp"
#include "mncl/frontends/prefetch_loader.hpp"

namespace {

using fashion_mnist::Options;
using fashion_mnist::Sample;

// Test loss and accuracy of `model` on a batch of contiguous samples.
mncl::Metrics evaluate_batch(mncl::Link &model, const Sample *samples, std::size_t n) {
  std::vector<const Sample *> pointers(n);
  for (std::size_t i = 0; i < n; ++i) pointers[i] = samples + i;
  mncl::Tensor x;
  std::vector<int32_t> labels;
  fashion_mnist::make_batch(pointers.data(), n, x, labels);
  mncl::SoftmaxCrossEntropy loss_fn;
  const double loss = loss_fn.forward(model.forward(x), labels);
  return {{"loss", loss}, {"accuracy", static_cast<double>(loss_fn.correct()) / n}};
}

template <class Optimizer>
int train(mncl::Communicator &comm, const Options &o, Optimizer inner) {
  const bool is_root = comm.rank() == 0;
  // Only rank 0 reads the files; everyone learns whether that worked.
  std::vector<Sample> train_set, test_set;
  std::string error;
  if (is_root) error = fashion_mnist::load_sets(o, train_set, test_set);
  comm.bcast_obj(error);
  if (!error.empty()) {
    if (is_root) {
      std::fprintf(stderr,
                   "mnist_mlp: %s\n(install the Debian package dataset-fashion-mnist, or pass "
                   "--data-dir)\n",
                   error.c_str());
    }
    return fashion_mnist::kExitNoData;
  }
  const int global_batch = o.per_rank_batch > 0 ? o.per_rank_batch * comm.size() : o.batch_size;
  if (global_batch % (comm.size() * o.allreduce_every) != 0) {
    if (is_root) {
      std::fprintf(stderr,
                   "mnist_mlp: the batch size %d does not split over %d ranks x %d micro-batches\n",
                   global_batch, comm.size(), o.allreduce_every);
    }
    return 2;
  }

  // Training shards of equal length (every rank runs the same number of steps); test shards
  // disjoint, so every test image is counted once.
  mncl::ScatterOptions train_scatter;
  train_scatter.shuffle = true;
  train_scatter.seed = o.seed;
  const auto train_shard = mncl::scatter_dataset(train_set, comm, train_scatter);
  mncl::ScatterOptions test_scatter;
  test_scatter.force_equal_length = false;
  const auto test_shard = mncl::scatter_dataset(test_set, comm, test_scatter);
  train_set = {};
  test_set = {};

  mncl::Sequential model;
  model.emplace<mncl::Dense>(fashion_mnist::kPixels, o.hidden, o.seed, false);
  // Batch normalization by each rank's own samples, or by the global batch's (every rank's).
  if (o.batch_norm == "local") {
    model.emplace<mncl::BatchNormalization>(o.hidden);
  } else if (o.batch_norm == "multi-node") {
    model.emplace<mncl::MultiNodeBatchNormalization>(o.hidden, comm);
  } else if (o.batch_norm != "none") {
    throw std::invalid_argument("--batch-norm must be none, local or multi-node");
  }
  model.emplace<mncl::ReLU>().emplace<mncl::Dense>(o.hidden, fashion_mnist::kClasses, o.seed + 1);
  const auto params = model.parameters();
  const auto values = mncl::value_spans(params);
  const auto grads = mncl::grad_spans(params);

  mncl::MultiNodeOptimizerOptions exchange = fashion_mnist::exchange_options(o);
  exchange.allreduce_every = o.allreduce_every;
  if (o.grad_dtype == "float16") {
    exchange.grad_dtype = mncl::GradDtype::kFloat16;
  } else if (o.grad_dtype == "bfloat16") {
    exchange.grad_dtype = mncl::GradDtype::kBFloat16;
  } else if (o.grad_dtype != "float32") {
    throw std::invalid_argument("--grad-dtype must be float32, float16 or bfloat16");
  }
  mncl::MultiNodeOptimizer<Optimizer> optimizer(std::move(inner), comm, exchange);
  mncl::Evaluator evaluator(comm);

  // A snapshot: the epoch, the parameters and the optimizer (its state and step count).
  int first_epoch = 1;
  std::unique_ptr<mncl::Checkpointer> checkpointer;
  if (!o.checkpoint_dir.empty()) {
    checkpointer = std::make_unique<mncl::Checkpointer>(comm, o.checkpoint_dir, "mnist_mlp");
    const auto resumed = checkpointer->resume_with([&](mncl::Span<const uint8_t> bytes) {
      mncl::InArchive ar(bytes);
      std::vector<std::vector<float>> saved_values;
      ar >> saved_values >> optimizer;
      mncl::restore_values(params, saved_values);
      if (o.batch_norm != "none") {
        std::vector<std::vector<float>> saved_statistics;
        ar >> saved_statistics;
        mncl::restore_persistents(model, saved_statistics);
      }
    });
    if (resumed) {
      first_epoch = static_cast<int>(*resumed) + 1;
      if (is_root) std::printf("resumed from the snapshot of epoch %d\n", first_epoch - 1);
    }
  }

  const std::size_t local_batch = static_cast<std::size_t>(global_batch / comm.size());
  const std::size_t micro_batch = local_batch / static_cast<std::size_t>(o.allreduce_every);
  // Each rank reshuffles its own shard every epoch (seeded per rank, so reproducible).
  mncl::PrefetchOptions loading;
  loading.batch_size = micro_batch;
  loading.threads = o.loader_threads;
  loading.depth = o.prefetch;
  loading.seed = o.seed * 1000003u + static_cast<uint64_t>(comm.rank());
  mncl::PrefetchLoader<Sample, fashion_mnist::Batch> loader(train_shard, loading,
                                                            fashion_mnist::assemble);
  const std::size_t steps =
      loader.batches_per_epoch() / static_cast<std::size_t>(o.allreduce_every);
  std::size_t grad_bytes = 0;
  for (const auto &v : values) grad_bytes += v.size() * sizeof(float);
  if (is_root) {
    std::printf(
        "mnist_mlp: %d rank(s) on backend %s; MLP 784-%d-10 (batch norm: %s); %s lr %g (%s); "
        "global batch %d (%zu "
        "per rank, %d micro-batch(es) of %zu); %zu steps/epoch; train shard %zu, test shard %zu; "
        "grads %s (%zu bytes)%s; loader %d thread(s), prefetch %zu\n",
        comm.size(), comm.backend().c_str(), o.hidden, o.batch_norm.c_str(), o.optimizer.c_str(),
        o.lr, o.lr_schedule.c_str(), global_batch, local_batch, o.allreduce_every, micro_batch,
        steps, train_shard.size(), test_shard.size(), o.grad_dtype.c_str(), grad_bytes,
        o.double_buffering ? ", double buffering" : "", o.loader_threads, o.prefetch);
    std::fflush(stdout);
  }

  mncl::SoftmaxCrossEntropy loss_fn;
  mncl::Metrics test_metrics{{"accuracy", 0.0}};
  double total_seconds = 0;
  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    const auto start = fashion_mnist::Clock::now();
    loader.start_epoch(static_cast<uint64_t>(epoch));
    loader.reset_wait_seconds();
    optimizer.reset_stats();
    double loss_sum = 0;
    std::size_t correct = 0, seen = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      optimizer.actual_optimizer().options().lr =
          fashion_mnist::learning_rate_at(o, epoch, step, steps);
      for (int micro = 0; micro < o.allreduce_every; ++micro) {
        const auto batch = loader.next();
        const float loss = loss_fn.forward(model.forward(batch->x), batch->labels);
        model.backward(loss_fn.backward());
        // Exchanges and steps on the step's last micro-batch (the first call also broadcasts
        // the initial model, taking no micro-batch: each step is exactly its K micro-batches).
        optimizer.update(values, grads);
        loss_sum += static_cast<double>(loss) * micro_batch;
        correct += loss_fn.correct();
        seen += micro_batch;
      }
    }
    const double train_seconds = fashion_mnist::seconds_since(start);
    // Throughput from the slowest rank; wait shares averaged over the ranks.
    std::vector<double> timing{train_seconds, optimizer.stats().wait_seconds,
                               loader.wait_seconds()};
    std::vector<double> slowest = timing;
    comm.allreduce(slowest, mncl::ReduceOp::kMax);
    comm.allreduce(timing, mncl::ReduceOp::kSum);
    const double samples_per_s = static_cast<double>(steps) * global_batch / slowest[0];
    const double comm_share = timing[1] / timing[0], data_share = timing[2] / timing[0];
    const auto train_metrics = evaluator.average(
        {{"loss", loss_sum / seen}, {"accuracy", static_cast<double>(correct) / seen}}, seen);
    // Evaluation normalizes by the running statistics; per-rank ones are averaged first
    // (ChainerMN's AllreducePersistent), so that every rank's test shard sees the same model.
    if (o.batch_norm == "local") mncl::allreduce_persistent(comm, model);
    model.set_training(false);
    test_metrics = evaluator.evaluate(
        test_shard, fashion_mnist::kTestBatch,
        [&](const Sample *s, std::size_t n) { return evaluate_batch(model, s, n); });
    model.set_training(true);
    const double epoch_seconds = fashion_mnist::seconds_since(start);
    total_seconds += epoch_seconds;
    if (is_root) {
      std::printf(
          "epoch %d  train loss %.4f acc %.4f  test loss %.4f acc %.4f  time %.2f s (train "
          "%.2f s, %.0f samples/s, comm wait %.1f %%, data wait %.1f %%)\n",
          epoch, train_metrics.at("loss"), train_metrics.at("accuracy"), test_metrics.at("loss"),
          test_metrics.at("accuracy"), epoch_seconds, slowest[0], samples_per_s, 100 * comm_share,
          100 * data_share);
      // One machine-readable line per epoch for weak_scaling.sh.
      std::printf(
          "perf epoch=%d ranks=%d backend=%s double_buffering=%d steps=%zu "
          "samples_per_s=%.1f step_ms=%.4f comm_wait_ms=%.4f data_wait_ms=%.4f "
          "grad_bytes=%zu\n",
          epoch, comm.size(), comm.backend().c_str(), o.double_buffering ? 1 : 0, steps,
          samples_per_s, 1e3 * slowest[0] / steps, 1e3 * timing[1] / comm.size() / steps,
          1e3 * timing[2] / comm.size() / steps, grad_bytes);
      std::fflush(stdout);
    }
    if (checkpointer) {
      optimizer.synchronize();  // a double-buffered exchange must land before it is saved
      mncl::OutArchive ar;
      ar << mncl::snapshot_values(params) << optimizer;
      if (o.batch_norm != "none") ar << mncl::snapshot_persistents(model);
      checkpointer->save_bytes(static_cast<uint64_t>(epoch), ar.bytes());
    }
  }
  const double accuracy = test_metrics.at("accuracy");
  if (is_root) fashion_mnist::print_final(accuracy, o.epochs, total_seconds);
  if (accuracy < o.min_accuracy) {
    if (is_root) std::fprintf(stderr, "mnist_mlp: below --min-accuracy %g\n", o.min_accuracy);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  // A generic lambda: train is a template over the optimizer that main_with picks.
  return fashion_mnist::main_with(argc, argv, "mnist_mlp",
                                  [](mncl::Communicator &comm, const Options &o, auto optimizer) {
                                    return train(comm, o, std::move(optimizer));
                                  });
}

// Hybrid data x model parallelism for the same 784-H-10 MLP on Fashion-MNIST: the ranks form
// R replicas of an M-stage pipeline (default M = 2; 4 ranks = 2 replicas x 2 stages):
//
//   mncl-run -n 4 -- mnist_mlp_hybrid [--model-parallel 2] [--epochs 5] [--batch-size 128] ...
//
// split_hybrid gives each rank two groups: its replica's pipeline (model_parallel: stage 0 holds
// Dense(784, H) + ReLU and sends activations on, stage 1 holds Dense(H, 10) and the loss) and
// the same stage of every replica (data_parallel), where a MultiNodeOptimizer averages that
// stage's gradients — never across stages. The global batch is split over the replicas, so the
// optimisation matches the pure data-parallel run. Stage 0 of each replica gets a shard of the
// images (scatter_dataset over stage 0's data-parallel group) and sends its labels to stage 1;
// both stages walk the shard with PrefetchLoaders of the same seed, hence in the same order.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "fashion_mnist.hpp"
#include "mncl/frontends.hpp"
#include "mncl/frontends/hybrid.hpp"
#include "mncl/frontends/prefetch_loader.hpp"

namespace {

using fashion_mnist::Options;
using fashion_mnist::Sample;

template <class Optimizer>
int train(mncl::Communicator &world, const Options &o, Optimizer inner) {
  const bool is_root = world.rank() == 0;
  if (o.model_parallel != 2 || world.size() % 2 != 0 || o.batch_size % (world.size() / 2) != 0) {
    if (is_root) {
      std::fprintf(stderr,
                   "mnist_mlp_hybrid: needs --model-parallel 2 (the MLP has 2 stages), an even "
                   "number of ranks, and a batch that splits over the replicas\n");
    }
    return 2;
  }
  std::string error;
  std::vector<Sample> train_set, test_set;
  if (is_root) error = fashion_mnist::load_sets(o, train_set, test_set);
  world.bcast_obj(error);
  if (!error.empty()) {
    if (is_root) std::fprintf(stderr, "mnist_mlp_hybrid: %s\n", error.c_str());
    return fashion_mnist::kExitNoData;
  }

  auto groups = mncl::split_hybrid(world, o.model_parallel);
  const auto &where = groups.coords;
  const bool first_stage = where.stage == 0;

  // Stage 0 ranks share out the images (world rank 0 is replica 0's stage 0, the root of that
  // group); each sends its shard's labels to its stage 1.
  std::vector<Sample> train_shard, test_shard;
  std::vector<int32_t> train_labels, test_labels;
  if (first_stage) {
    mncl::ScatterOptions scatter;
    scatter.shuffle = true;
    scatter.seed = o.seed;
    train_shard = mncl::scatter_dataset(train_set, groups.data_parallel, scatter);
    mncl::ScatterOptions disjoint;
    disjoint.force_equal_length = false;
    test_shard = mncl::scatter_dataset(test_set, groups.data_parallel, disjoint);
    for (const auto &s : train_shard) train_labels.push_back(s.label);
    for (const auto &s : test_shard) test_labels.push_back(s.label);
    groups.model_parallel.send_obj(train_labels, 1);
    groups.model_parallel.send_obj(test_labels, 1);
  } else {
    train_labels = groups.model_parallel.recv_obj<std::vector<int32_t>>(0);
    test_labels = groups.model_parallel.recv_obj<std::vector<int32_t>>(0);
  }
  train_set = {};
  test_set = {};

  mncl::MultiNodeChainList chain(groups.model_parallel);
  fashion_mnist::add_mlp_stage(chain, o, first_stage);
  const auto params = chain.parameters();
  const auto values = mncl::value_spans(params);
  const auto grads = mncl::grad_spans(params);
  // Averages this stage's gradients over the replicas only.
  mncl::MultiNodeOptimizer<Optimizer> optimizer(std::move(inner), groups.data_parallel,
                                                fashion_mnist::exchange_options(o));

  // Same seed on both stages of a replica: the same batch order over the same shard.
  const std::size_t local_batch = static_cast<std::size_t>(o.batch_size / where.replicas);
  mncl::PrefetchOptions loading;
  loading.batch_size = local_batch;
  loading.threads = first_stage ? o.loader_threads : 0;
  loading.depth = o.prefetch;
  loading.seed = o.seed * 1000003u + static_cast<uint64_t>(where.replica);
  mncl::PrefetchLoader<Sample, fashion_mnist::Batch> image_loader(train_shard, loading,
                                                                  fashion_mnist::assemble);
  mncl::PrefetchOptions label_loading = loading;
  label_loading.threads = 0;  // labels are cheap to gather
  mncl::PrefetchLoader<int32_t, std::vector<int32_t>> label_loader(
      train_labels, label_loading,
      [](const int32_t *const *labels, std::size_t n, std::vector<int32_t> &out) {
        for (std::size_t i = 0; i < n; ++i) out.push_back(*labels[i]);
      });
  const std::size_t steps =
      first_stage ? image_loader.batches_per_epoch() : label_loader.batches_per_epoch();
  if (is_root) {
    std::printf(
        "mnist_mlp_hybrid: %d ranks = %d replica(s) x %d stages on backend %s; 784-%d | %d-10; "
        "%s lr %g; global batch %d (%zu per replica); %zu steps/epoch\n",
        world.size(), where.replicas, where.stages, world.backend().c_str(), o.hidden, o.hidden,
        o.optimizer.c_str(), o.lr, o.batch_size, local_batch, steps);
    std::fflush(stdout);
  }

  mncl::SoftmaxCrossEntropy loss_fn;
  mncl::Evaluator evaluator(groups.data_parallel);  // stage 1's metrics, over the replicas
  double accuracy = 0, total_seconds = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto start = fashion_mnist::Clock::now();
    image_loader.start_epoch(static_cast<uint64_t>(epoch));
    label_loader.start_epoch(static_cast<uint64_t>(epoch));
    double loss_sum = 0;
    std::size_t correct = 0;
    chain.set_backward_follows(true);  // training: a failed forward tells the stages upstream
    for (std::size_t step = 0; step < steps; ++step) {
      optimizer.actual_optimizer().options().lr =
          fashion_mnist::learning_rate_at(o, epoch, step, steps);
      mncl::Tensor grad;
      if (first_stage) {
        chain.forward(image_loader.next()->x);
      } else {
        const auto labels = label_loader.next();
        loss_sum += loss_fn.forward(chain.forward(mncl::Tensor()), *labels) * local_batch;
        correct += loss_fn.correct();
        grad = loss_fn.backward();
      }
      chain.backward(grad);
      optimizer.update(values, grads);
    }
    // Test: stage 0 streams its test shard through the pipeline.
    chain.set_backward_follows(false);  // forward only, until the next epoch's training
    double test_loss = 0;
    std::size_t test_correct = 0;
    std::vector<const Sample *> pointers;
    fashion_mnist::for_each_test_batch(test_labels.size(), [&](std::size_t begin, std::size_t n) {
      mncl::Tensor x;
      if (first_stage) {
        pointers.resize(n);
        for (std::size_t i = 0; i < n; ++i) pointers[i] = &test_shard[begin + i];
        std::vector<int32_t> unused;
        fashion_mnist::make_batch(pointers.data(), n, x, unused);
      }
      const mncl::Tensor logits = chain.forward(x);
      if (!first_stage) {
        const std::vector<int32_t> labels(test_labels.begin() + begin,
                                          test_labels.begin() + begin + n);
        test_loss += loss_fn.forward(logits, labels) * n;
        test_correct += loss_fn.correct();
      }
    });
    const double seconds = fashion_mnist::seconds_since(start);
    total_seconds += seconds;
    // Stage 1 averages over the replicas, then tells its stage 0; world rank 0 prints.
    std::vector<double> metrics(4);
    if (!first_stage) {
      const double train_n = static_cast<double>(steps * local_batch);
      const auto train = evaluator.average(
          {{"loss", loss_sum / train_n}, {"accuracy", correct / train_n}}, steps * local_batch);
      const auto test =
          evaluator.average({{"loss", test_loss / test_labels.size()},
                             {"accuracy", static_cast<double>(test_correct) / test_labels.size()}},
                            test_labels.size());
      metrics = {train.at("loss"), train.at("accuracy"), test.at("loss"), test.at("accuracy")};
    }
    accuracy = fashion_mnist::report_epoch(groups.model_parallel, metrics, epoch, seconds, is_root);
  }
  if (is_root) fashion_mnist::print_final(accuracy, o.epochs, total_seconds);
  optimizer.synchronize();
  groups.model_parallel.destroy();
  groups.data_parallel.destroy();
  return accuracy < o.min_accuracy ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  // A generic lambda: train is a template over the optimizer that main_with picks.
  return fashion_mnist::main_with(argc, argv, "mnist_mlp_hybrid",
                                  [](mncl::Communicator &comm, const Options &o, auto optimizer) {
                                    return train(comm, o, std::move(optimizer));
                                  });
}

// Tensor-parallel training of the same 784-H-10 MLP on Fashion-MNIST: both weight matrices are
// split over all the ranks (Megatron-LM's MLP split, tensor_parallel.hpp), any number of them:
//
//   mncl-run -n 3 -- mnist_mlp_tensor_parallel [--epochs 5] [--batch-size 128] ...
//
// Rank r holds columns feature_shard(H) of Dense(784, H) (ColumnParallelDense, its output not
// gathered) and the same rows of Dense(H, 10) (RowParallelDense, whose forward sums the ranks'
// partial logits: one allreduce of {batch, 10} floats; backward needs none, as the first layer
// computes no input gradient). Every rank sees every batch, in the same (seeded) order, computes
// the same loss, and steps only its own slices (nothing to average), plus the output bias,
// replicated, in lock step. The layers start as the one-process Dense(784, H, seed) and
// Dense(H, 10, seed + 1) would, so any number of ranks trains the same model as one rank does
// (up to the order of float sums).
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "fashion_mnist.hpp"
#include "mncl/frontends.hpp"

namespace {

using fashion_mnist::Options;
using fashion_mnist::Sample;

template <class Optimizer>
int train(mncl::Communicator &comm, const Options &o, Optimizer optimizer) {
  const bool is_root = comm.rank() == 0;
  std::vector<Sample> train_set, test_set;
  std::string error;
  if (o.hidden < comm.size()) {
    error = "--hidden " + std::to_string(o.hidden) + " cannot be split over " +
            std::to_string(comm.size()) + " ranks";
  } else if (is_root) {
    error = fashion_mnist::load_sets(o, train_set, test_set);
  }
  comm.bcast_obj(error);
  if (!error.empty()) {
    if (is_root) std::fprintf(stderr, "mnist_mlp_tensor_parallel: %s\n", error.c_str());
    return error.rfind("--hidden", 0) == 0 ? 2 : fashion_mnist::kExitNoData;
  }
  comm.bcast_obj(train_set);  // every rank computes (its slice of) every sample
  comm.bcast_obj(test_set);

  auto hidden = std::make_shared<mncl::ColumnParallelDense>(
      fashion_mnist::kPixels, o.hidden, comm, o.seed,
      mncl::ColumnParallelOptions{/*gather_output*/ false, /*compute_input_grad*/ false});
  auto output =
      std::make_shared<mncl::RowParallelDense>(o.hidden, fashion_mnist::kClasses, comm, o.seed + 1);
  mncl::Sequential model({hidden, std::make_shared<mncl::ReLU>(), output});
  const auto params = model.parameters();
  const auto values = mncl::value_spans(params);
  const auto grads = mncl::grad_spans(params);

  const std::size_t batch_size = static_cast<std::size_t>(o.batch_size);
  const std::size_t steps = train_set.size() / batch_size;
  if (is_root) {
    std::printf(
        "mnist_mlp_tensor_parallel: 784-%d-10 split over %d rank(s) (rank 0: hidden features "
        "[%zu, %zu)); backend %s; %s lr %g; batch %zu; %zu steps/epoch\n",
        o.hidden, comm.size(), hidden->columns().begin, hidden->columns().end,
        comm.backend().c_str(), o.optimizer.c_str(), o.lr, batch_size, steps);
    std::fflush(stdout);
  }
  mncl::Tensor x;
  std::vector<int32_t> labels;
  std::vector<const Sample *> batch;
  mncl::SoftmaxCrossEntropy loss_fn;
  // Forward (and, when training, backward and step) one batch: the loss and hits.
  auto run_batch = [&](const std::vector<Sample> &samples, const std::size_t *indices,
                       std::size_t n, bool training) {
    batch.resize(n);
    for (std::size_t b = 0; b < n; ++b) batch[b] = &samples[indices[b]];
    fashion_mnist::make_batch(batch.data(), n, x, labels);
    const double loss = loss_fn.forward(model.forward(x), labels);
    if (training) {
      model.backward(loss_fn.backward());
      optimizer.update(values, grads);
    }
    return std::make_pair(loss, loss_fn.correct());
  };

  double accuracy = 0, total_seconds = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto start = fashion_mnist::Clock::now();
    const auto order = mncl::permutation(train_set.size(), o.seed * 1000003u + epoch);
    double loss_sum = 0;
    std::size_t correct = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      optimizer.options().lr = fashion_mnist::learning_rate_at(o, epoch, step, steps);
      const auto [loss, hits] =
          run_batch(train_set, order.data() + step * batch_size, batch_size, true);
      loss_sum += loss * batch_size;
      correct += hits;
    }
    double test_loss = 0;
    std::size_t test_correct = 0;
    std::vector<std::size_t> indices;
    fashion_mnist::for_each_test_batch(test_set.size(), [&](std::size_t begin, std::size_t n) {
      indices.resize(n);
      std::iota(indices.begin(), indices.end(), begin);
      const auto [loss, hits] = run_batch(test_set, indices.data(), n, false);
      test_loss += loss * n;
      test_correct += hits;
    });
    const double seconds = fashion_mnist::seconds_since(start);
    total_seconds += seconds;
    accuracy = static_cast<double>(test_correct) / test_set.size();
    const double trained = static_cast<double>(steps * batch_size);
    if (is_root) {
      fashion_mnist::print_epoch(
          {loss_sum / trained, correct / trained, test_loss / test_set.size(), accuracy}, epoch,
          seconds);
    }
  }
  if (is_root) fashion_mnist::print_final(accuracy, o.epochs, total_seconds);
  return accuracy < o.min_accuracy ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  // A generic lambda: train is a template over the optimizer that main_with picks.
  return fashion_mnist::main_with(argc, argv, "mnist_mlp_tensor_parallel",
                                  [](mncl::Communicator &comm, const Options &o, auto optimizer) {
                                    return train(comm, o, std::move(optimizer));
                                  });
}

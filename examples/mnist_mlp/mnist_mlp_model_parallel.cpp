// Model-parallel training of the same 784-H-10 MLP on Fashion-MNIST, split over two ranks with
// MultiNodeChainList:
//
//   mncl-run -n 2 -- mnist_mlp_model_parallel [--epochs 5] [--batch-size 128] ...
//
// Rank 0 holds Dense(784, H) + ReLU and sends the activations to rank 1; rank 1 holds
// Dense(H, 10) and the loss, and sends the activations' gradients back. Each rank steps its own
// parameters (nothing to average: no parameter lives on two ranks). Rank 0 reads the data and
// gives rank 1 the labels; both walk the batches in the same (seeded) order.
#include <cstdio>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "fashion_mnist.hpp"
#include "mncl/frontends.hpp"

namespace {

using fashion_mnist::Options;
using fashion_mnist::Sample;

std::vector<int32_t> labels_of(const std::vector<Sample> &samples) {
  std::vector<int32_t> labels;
  for (const auto &s : samples) labels.push_back(s.label);
  return labels;
}

template <class Optimizer>
int train(mncl::Communicator &comm, const Options &o, Optimizer optimizer) {
  const bool first_half = comm.rank() == 0;
  std::vector<Sample> train_set, test_set;
  std::string error;
  if (comm.size() != 2) {
    error = "needs exactly 2 ranks (mncl-run -n 2), not " + std::to_string(comm.size());
  } else if (first_half) {
    error = fashion_mnist::load_sets(o, train_set, test_set);
  }
  if (comm.size() == 2) comm.bcast_obj(error);
  if (!error.empty()) {
    if (first_half) std::fprintf(stderr, "mnist_mlp_model_parallel: %s\n", error.c_str());
    return comm.size() == 2 ? fashion_mnist::kExitNoData : 2;
  }
  // Rank 1 needs only the labels.
  std::vector<int32_t> train_labels = labels_of(train_set), test_labels = labels_of(test_set);
  comm.bcast_obj(train_labels);
  comm.bcast_obj(test_labels);

  mncl::MultiNodeChainList chain(comm);
  fashion_mnist::add_mlp_stage(chain, o, first_half);
  const auto params = chain.parameters();
  const auto values = mncl::value_spans(params);
  const auto grads = mncl::grad_spans(params);

  const std::size_t batch_size = static_cast<std::size_t>(o.batch_size);
  const std::size_t steps = train_labels.size() / batch_size;
  if (first_half) {
    std::printf(
        "mnist_mlp_model_parallel: 784-%d (rank 0) | %d-10 (rank 1); backend %s; %s lr "
        "%g; batch %zu; %zu steps/epoch\n",
        o.hidden, o.hidden, comm.backend().c_str(), o.optimizer.c_str(), o.lr, batch_size, steps);
    std::fflush(stdout);
  }
  mncl::Tensor x;
  std::vector<int32_t> batch_labels;
  std::vector<const Sample *> batch(batch_size);
  mncl::SoftmaxCrossEntropy loss_fn;
  // Forward (and, when training, backward) one batch; rank 1 returns the loss and hits.
  auto run_batch = [&](const std::vector<Sample> &samples, const std::vector<int32_t> &labels,
                       const std::vector<std::size_t> &indices, bool training) {
    const std::size_t n = indices.size();
    if (first_half) {
      batch.resize(n);
      for (std::size_t b = 0; b < n; ++b) batch[b] = &samples[indices[b]];
      fashion_mnist::make_batch(batch.data(), n, x, batch_labels);
    }
    chain.set_backward_follows(training);  // a failed forward then tells the ranks upstream
    const mncl::Tensor logits = chain.forward(x);
    std::pair<double, std::size_t> result{0.0, 0};
    mncl::Tensor grad;
    if (!first_half) {
      batch_labels.resize(n);
      for (std::size_t b = 0; b < n; ++b) batch_labels[b] = labels[indices[b]];
      result.first = loss_fn.forward(logits, batch_labels);
      result.second = loss_fn.correct();
      grad = loss_fn.backward();
    }
    if (training) {
      chain.backward(grad);
      optimizer.update(values, grads);
    }
    return result;
  };

  double accuracy = 0, total_seconds = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto start = fashion_mnist::Clock::now();
    const auto order = mncl::permutation(train_labels.size(), o.seed * 1000003u + epoch);
    double loss_sum = 0;
    std::size_t correct = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      optimizer.options().lr = fashion_mnist::learning_rate_at(o, epoch, step, steps);
      const std::vector<std::size_t> indices(order.begin() + step * batch_size,
                                             order.begin() + (step + 1) * batch_size);
      const auto [loss, hits] = run_batch(train_set, train_labels, indices, true);
      loss_sum += loss * batch_size;
      correct += hits;
    }
    double test_loss = 0;
    std::size_t test_correct = 0;
    fashion_mnist::for_each_test_batch(test_labels.size(), [&](std::size_t begin, std::size_t n) {
      std::vector<std::size_t> indices(n);
      std::iota(indices.begin(), indices.end(), begin);
      const auto [loss, hits] = run_batch(test_set, test_labels, indices, false);
      test_loss += loss * n;
      test_correct += hits;
    });
    const double seconds = fashion_mnist::seconds_since(start);
    total_seconds += seconds;
    // The metrics live on rank 1; rank 0 prints them.
    std::vector<double> metrics{
        loss_sum / (steps * batch_size), static_cast<double>(correct) / (steps * batch_size),
        test_loss / test_labels.size(), static_cast<double>(test_correct) / test_labels.size()};
    accuracy = fashion_mnist::report_epoch(comm, metrics, epoch, seconds, first_half);
  }
  if (first_half) fashion_mnist::print_final(accuracy, o.epochs, total_seconds);
  return accuracy < o.min_accuracy ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  // A generic lambda: train is a template over the optimizer that main_with picks.
  return fashion_mnist::main_with(argc, argv, "mnist_mlp_model_parallel",
                                  [](mncl::Communicator &comm, const Options &o, auto optimizer) {
                                    return train(comm, o, std::move(optimizer));
                                  });
}

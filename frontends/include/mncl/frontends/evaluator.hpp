// Multi-node evaluation (ChainerMN's create_multi_node_evaluator): every rank evaluates its own
// shard, and the metrics are averaged over the ranks weighted by how many samples each one saw,
// so the result equals a single-process evaluation of all shards together. The shards must be
// disjoint for that: scatter_dataset's default (force_equal_length = true) gives neighbouring
// ranks up to one sample in common, which is then counted once per rank holding it (test data:
// ScatterOptions::force_equal_length = false, as the examples do).
//
//   mncl::Evaluator evaluator(comm);
//   auto metrics = evaluator.evaluate(test_shard, 256, [&](const Sample *batch, std::size_t n) {
//     ...; return mncl::Metrics{{"loss", mean_loss}, {"accuracy", mean_accuracy}};
//   });
//
// Every rank fails together: an evaluate_batch that throws on one rank (a bad sample), or a
// batch_size of 0 there, is reported in the allreduce that averaging does anyway (no extra
// collective): that rank throws its own error, the others a RemoteError naming it, at once
// (they once waited for it until the timeout). evaluate_batch must not communicate: a rank whose
// batch threw would meet the others' collectives in the averaging allreduce.
#ifndef MNCL_FRONTENDS_EVALUATOR_HPP
#define MNCL_FRONTENDS_EVALUATOR_HPP

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mncl/frontends/communicator.hpp"

namespace mncl {

// Metric name -> value (a mean over some samples).
using Metrics = std::map<std::string, double>;

class Evaluator {
 public:
  // `comm` must outlive the evaluator.
  explicit Evaluator(Communicator &comm) : comm_(&comm) {}

  // Collective: the sample-weighted mean over ranks of each rank's means. Ranks with samples
  // must pass the same metric names (a mismatch, none included, throws InvalidArgument on every
  // rank); what a rank without samples passes is ignored (no metrics, or NaN means of nothing).
  // With no samples anywhere the result is empty.
  Metrics average(const Metrics &local_means, uint64_t local_samples) {
    return average(local_means, local_samples, nullptr);
  }

  // Collective: runs `evaluate_batch(const Sample *first, std::size_t count) -> Metrics` (means
  // over that batch) over `shard` in batches of `batch_size`, and averages over everything.
  // Where evaluate_batch throws (or batch_size is 0, or a batch reports other metric names than
  // the rank's first: such a metric would be divided by every sample, a mean biased toward
  // zero) on some ranks, those rethrow their own exception and the others throw RemoteError
  // naming them, once every rank has evaluated.
  template <class Sample, class EvaluateBatch>
  Metrics evaluate(const std::vector<Sample> &shard, std::size_t batch_size,
                   EvaluateBatch &&evaluate_batch) {
    Metrics sums;
    std::exception_ptr failure;
    try {
      if (batch_size == 0) {
        throw InvalidArgument("Evaluator::evaluate: batch_size must be positive");
      }
      for (std::size_t begin = 0; begin < shard.size(); begin += batch_size) {
        const std::size_t count = std::min(batch_size, shard.size() - begin);
        const Metrics batch = evaluate_batch(shard.data() + begin, count);
        if (begin > 0 && !same_names(batch, sums)) {
          throw InvalidArgument("Evaluator::evaluate: the batch from sample " +
                                std::to_string(begin) +
                                " reports other metric names than the first batch: every batch "
                                "must report the same ones");
        }
        for (const auto &[name, value] : batch) sums[name] += value * static_cast<double>(count);
      }
      for (auto &entry : sums) entry.second /= static_cast<double>(shard.size());  // never empty
    } catch (...) {  // whatever it is, the others must hear of it; rethrown below
      failure = std::current_exception();
    }
    if (failure) return average(Metrics{}, 0, failure);
    return average(sums, shard.size(), nullptr);
  }

 private:
  // average(), where `failure` (null: none) is what this rank rethrows once every rank knows:
  // its slots in the allreduce name it to the others.
  Metrics average(const Metrics &local_means, uint64_t local_samples, std::exception_ptr failure) {
    const uint64_t size = static_cast<uint64_t>(comm_->size());
    const uint64_t rank = static_cast<uint64_t>(comm_->rank());
    const bool reports = local_samples > 0 && failure == nullptr;
    const uint64_t hash = names_hash(local_means);
    // In one allreduce (min): min(hash), max(hash) (as min of ~hash), the first reporting rank,
    // and the first and (as size - 1 - rank) the last rank that failed.
    constexpr uint64_t kNeutral = std::numeric_limits<uint64_t>::max();
    std::vector<uint64_t> agree{reports ? hash : kNeutral, reports ? ~hash : kNeutral,
                                reports ? rank : size, failure ? rank : size,
                                failure ? size - 1 - rank : size};
    try {
      comm_->allreduce(agree, ReduceOp::kMin);
    } catch (const Error &) {
      if (!failure) throw;  // the world itself failed: that error says more
    }
    if (failure) std::rethrow_exception(failure);
    if (agree[3] != size) {
      const uint64_t first = agree[3], last = size - 1 - agree[4];
      std::string ranks = "rank " + std::to_string(first);
      if (last != first) {
        ranks = "ranks " + std::to_string(first) + " and " + std::to_string(last) +
                (last > first + 1 ? " (and perhaps some between)" : "");
      }
      throw RemoteError("Evaluator::evaluate: " + ranks +
                        " could not evaluate (the cause is thrown there)");
    }
    if (agree[2] == size) return {};
    if (agree[0] != ~agree[1]) {
      throw InvalidArgument("Evaluator::average: the ranks report different metric names");
    }
    // Ranks that report nothing learn the names from the first one that does.
    std::vector<std::string> names;
    for (const auto &entry : local_means) names.push_back(entry.first);
    comm_->bcast_obj(names, static_cast<int>(agree[2]));

    std::vector<double> sums{static_cast<double>(local_samples)};
    for (const auto &name : names) {
      sums.push_back(reports ? local_means.at(name) * static_cast<double>(local_samples) : 0.0);
    }
    comm_->allreduce(sums, ReduceOp::kSum);
    Metrics global;
    for (std::size_t k = 0; k < names.size(); ++k) {
      global[names[k]] =
          sums[0] > 0 ? sums[k + 1] / sums[0] : std::numeric_limits<double>::quiet_NaN();
    }
    return global;
  }

  static bool same_names(const Metrics &a, const Metrics &b) {
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(),
                      [](const auto &x, const auto &y) { return x.first == y.first; });
  }

  // FNV-1a over the sorted names: equal on every rank iff the names are (with high probability).
  static uint64_t names_hash(const Metrics &metrics) {
    uint64_t hash = 0xcbf29ce484222325ull;
    for (const auto &entry : metrics) {
      for (unsigned char c : entry.first + '\0') hash = (hash ^ c) * 0x100000001b3ull;
    }
    return hash;
  }

  Communicator *comm_;
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_EVALUATOR_HPP

// Dataset scattering with ChainerMN's semantics.
//
// With n samples over `size` ranks, rank r's shard starts at floor(n * r / size) and
//   - force_equal_length = true (the default): holds ceil(n / size) samples, so every rank runs
//     the same number of iterations; neighbouring shards then overlap, repeating a few samples
//     (n=10, size=3: [0,4) [3,7) [6,10));
//   - force_equal_length = false: disjoint shards covering all samples once, the first n % size
//     ranks holding one sample more, as ChainerMN's scatter_index ([0,4) [4,7) [7,10); MNCL once
//     spread the longer shards out as floor(n * r / size): [0,3) [3,6) [6,10)).
// shuffle first permutes the sample order on the root (with `seed`, reproducibly).
#ifndef MNCL_FRONTENDS_DATASET_HPP
#define MNCL_FRONTENDS_DATASET_HPP

#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mncl/frontends/agreement.hpp"
#include "mncl/frontends/communicator.hpp"

namespace mncl {

// Samples [begin, end) of the (possibly permuted) dataset.
struct ShardRange {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const noexcept { return end - begin; }
  bool operator==(const ShardRange &other) const noexcept {
    return begin == other.begin && end == other.end;
  }
};

// Rank `rank`'s shard of n samples (pure arithmetic, no communication).
inline ShardRange shard_range(std::size_t n, int size, int rank, bool force_equal_length = true) {
  if (size <= 0 || rank < 0 || rank >= size) {
    throw InvalidArgument("shard_range: rank " + std::to_string(rank) +
                          " is out of range for size " + std::to_string(size));
  }
  const auto s = static_cast<std::size_t>(size);
  // floor(n * r / size) without overflowing n * r: n = q * size + m.
  auto floor_fraction = [&](std::size_t r) { return n / s * r + n % s * r / s; };
  const std::size_t begin = floor_fraction(static_cast<std::size_t>(rank));
  if (force_equal_length) {
    // begin + ceil(n/size) never passes n: floor(n*(size-1)/size) + ceil(n/size) == n.
    return {begin, begin + n / s + (n % s != 0 ? 1 : 0)};
  }
  // ChainerMN's: n / size each, the first n % size ranks one more.
  const std::size_t r = static_cast<std::size_t>(rank), quotient = n / s, remainder = n % s;
  const std::size_t first = r * quotient + std::min(r, remainder);
  return {first, first + quotient + (r < remainder ? 1 : 0)};
}

// Collective: this rank's shard of the root's n (only the root's n counts).
inline ShardRange scatter_index(std::size_t n, Communicator &comm, int root = 0,
                                bool force_equal_length = true) {
  uint64_t total = n;
  comm.bcast(Span<uint64_t>(&total, 1), root);
  return shard_range(static_cast<std::size_t>(total), comm.size(), comm.rank(), force_equal_length);
}

// A permutation of [0, n) that depends only on the seed (std::shuffle and the standard
// distributions differ between library versions; this does not).
inline std::vector<std::size_t> permutation(std::size_t n, uint64_t seed) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 engine(seed);
  for (std::size_t i = n; i > 1; --i) {  // Fisher-Yates, unbiased bounded draws by rejection
    const uint64_t bound = i;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t draw;
    do {
      draw = engine();
    } while (draw >= limit);
    std::swap(order[i - 1], order[draw % bound]);
  }
  return order;
}

struct ScatterOptions {
  int root = 0;
  bool shuffle = false;
  std::optional<uint64_t> seed;  // shuffle seed; unset: a random one (on the root)
  bool force_equal_length = true;
};

// Collective: the root's dataset split into one shard per rank, each rank receiving only its
// own shard. `dataset` is read on the root only (pass an empty one elsewhere); it needs size()
// and operator[](std::size_t) returning a serializable sample. Other ranks get their shard as a
// std::vector of samples. The root holds one shard at a time besides the dataset. If the
// dataset fails on the root (size(), an index, a sample that does not serialize), every rank
// throws, together: the root the reason, the others RemoteError (a flag travels before each
// shard, and every rank's outcome in a last allgather), instead of the ones still waiting for a
// shard waiting out the timeout; so does a rank that cannot decode its shard. The ranks first
// agree on the root (agreement.hpp): a rank given another root once waited for a shard from
// the wrong rank until the timeout. The other options are read on the root only.
template <class Dataset>
auto scatter_dataset(const Dataset &dataset, Communicator &comm,
                     const ScatterOptions &options = {}) {
  using Sample = std::decay_t<decltype(dataset[std::size_t{0}])>;
  static_assert(is_serializable<Sample>(), "scatter_dataset: the sample type is not serializable");
  using Shard = std::vector<Sample>;
  const int root = options.root;
  const auto remote_failure = [&] {
    return RemoteError("scatter_dataset: root " + std::to_string(root) +
                       " could not provide the shards (it throws the reason)");
  };
  {
    std::exception_ptr bad_root;
    if (root < 0 || root >= comm.size()) {
      bad_root = std::make_exception_ptr(
          InvalidArgument("scatter_dataset: root " + std::to_string(root) + " is not a rank of " +
                          std::to_string(comm.size())));
    }
    LayoutDigest digest;
    digest.add(static_cast<uint64_t>(root));  // (the other options are read on the root only)
    agree_or_throw(comm, "scatter_dataset", bad_root, digest.value());
  }
  // Every rank's outcome (0: its shard went out, or came in and decoded), then the same
  // decision everywhere.
  const auto finish = [&](const std::exception_ptr &own) {
    const std::vector<uint64_t> failed = comm.allgather(std::vector<uint64_t>{own ? 1u : 0u});
    if (own) std::rethrow_exception(own);
    if (failed[static_cast<std::size_t>(root)] != 0) throw remote_failure();
    std::string ranks;
    for (std::size_t r = 0; r < failed.size(); ++r) {
      if (failed[r] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!ranks.empty()) {
      throw RemoteError("scatter_dataset: rank(s) " + ranks +
                        " could not decode their shards (their own errors say what)");
    }
  };
  if (comm.rank() != root) {
    std::array<uint64_t, 1> failed{};
    comm.recv(failed, root);
    Shard shard;
    std::exception_ptr own;
    if (failed[0] == 0) {
      const std::vector<uint8_t> bytes = comm.recv_bytes(root);
      try {
        from_bytes(Span<const uint8_t>(bytes), shard);
      } catch (...) {  // decoding only: a failed receive is the communicator's
        own = std::current_exception();
      }
    }
    finish(own);
    return shard;
  }

  // Only the dataset's and the serializer's failures are caught: a failed send is the
  // communicator's, which the other ranks hear of from their own calls.
  std::exception_ptr failure;
  std::size_t n = 0;
  std::vector<std::size_t> order;
  auto shard_of = [&](int rank) {
    const ShardRange range = shard_range(n, comm.size(), rank, options.force_equal_length);
    Shard shard;
    shard.reserve(range.size());
    for (std::size_t i = range.begin; i < range.end; ++i) {
      shard.push_back(dataset[order.empty() ? i : order[i]]);
    }
    return shard;
  };
  try {
    n = dataset.size();
    if (options.shuffle) {
      order = permutation(n, options.seed ? *options.seed : std::random_device{}());
    }
  } catch (...) {
    failure = std::current_exception();
  }
  for (int rank = 0; rank < comm.size(); ++rank) {
    if (rank == root) continue;
    std::vector<uint8_t> bytes;
    if (!failure) {
      try {
        bytes = to_bytes(shard_of(rank));
      } catch (...) {
        failure = std::current_exception();
      }
    }
    std::array<uint64_t, 1> failed{failure ? 1u : 0u};
    comm.send(failed, rank);
    if (!failure) comm.send_bytes(bytes, rank);
  }
  Shard own;
  if (!failure) {
    try {
      own = shard_of(root);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  finish(failure);
  return own;
}

// ChainerMN's create_multi_node_iterator: the root reads the items and every rank gets each
// one (through bcast_obj), e.g. a pipeline whose first stage alone opens the data while the
// last one needs the labels. T is any default-constructible type serialize.hpp handles
// (move-only ones too).
//
//   mncl::MultiNodeIterator<Batch> batches(comm, [&]() -> std::optional<Batch> {
//     return loader.has_next() ? std::optional<Batch>(loader.next()) : std::nullopt;
//   });  // the source is called on the root only (pass {} elsewhere)
//   while (auto batch = batches.next()) train(*batch);
//
// Collective: the constructor (the ranks agree on the root: one small allgather) and every
// next(), which every rank calls equally often until it returns std::nullopt on every rank
// alike (then, and after a failure, next() returns std::nullopt again without communicating).
// A source that throws, or an item that does not serialize, throws on the root and
// RemoteError naming the root on the others.
template <class T>
class MultiNodeIterator {
 public:
  using Source = std::function<std::optional<T>()>;

  // `comm` must outlive the iterator; `source` must be set on the root.
  MultiNodeIterator(Communicator &comm, Source source, int root = 0)
      : comm_(&comm), source_(std::move(source)), root_(root) {
    std::exception_ptr refused;
    if (root < 0 || root >= comm.size()) {
      refused = std::make_exception_ptr(InvalidArgument(
          "MultiNodeIterator: root " + std::to_string(root) +
          " is not a rank of a communicator of size " + std::to_string(comm.size())));
    } else if (comm.rank() == root && !source_) {
      refused =
          std::make_exception_ptr(InvalidArgument("MultiNodeIterator: the root's source is empty"));
    }
    LayoutDigest digest;
    digest.add(static_cast<uint64_t>(root));
    agree_or_throw(comm, "MultiNodeIterator", refused, digest.value());
  }

  std::optional<T> next() {
    if (done_) return std::nullopt;
    // ((kind, a failure's text), the item): decoded inside bcast_obj, so that an item that
    // does not decode on one rank fails every rank alike.
    std::pair<std::pair<uint8_t, std::string>, T> message;
    message.first.first = kEnd;
    std::exception_ptr failure;
    if (comm_->rank() == root_) {
      try {
        if (std::optional<T> item = source_()) {
          message.first.first = kItem;
          message.second = std::move(*item);  // moved, never copied: T may be move-only
        }
      } catch (const std::exception &e) {
        failure = std::current_exception();
        message.first = {kFailed, e.what()};
      } catch (...) {
        failure = std::current_exception();
        message.first = {kFailed, "an exception not derived from std::exception"};
      }
    }
    try {
      comm_->bcast_obj(message, root_);
    } catch (...) {
      done_ = true;
      throw;
    }
    if (message.first.first == kItem) return std::move(message.second);
    done_ = true;
    if (failure) std::rethrow_exception(failure);
    if (message.first.first == kFailed) {
      throw RemoteError("MultiNodeIterator: the source failed on the root (rank " +
                        std::to_string(root_) + "): " + message.first.second);
    }
    return std::nullopt;
  }

  // True once next() has returned std::nullopt or thrown.
  bool done() const noexcept { return done_; }

 private:
  static constexpr uint8_t kItem = 1, kEnd = 2, kFailed = 3;
  Communicator *comm_;
  Source source_;
  int root_;
  bool done_ = false;
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_DATASET_HPP

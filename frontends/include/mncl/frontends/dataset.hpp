// Dataset scattering with ChainerMN's semantics.
//
// With n samples over `size` ranks, rank r's shard starts at floor(n * r / size) and
//   - force_equal_length = true (the default): holds ceil(n / size) samples, so every rank runs
//     the same number of iterations; neighbouring shards then overlap, repeating a few samples
//     (n=10, size=3: [0,4) [3,7) [6,10));
//   - force_equal_length = false: ends where the next one starts: disjoint shards covering all
//     samples once, whose lengths differ by at most one ([0,3) [3,6) [6,10)).
// shuffle first permutes the sample order on the root (with `seed`, reproducibly).
#ifndef MNCL_FRONTENDS_DATASET_HPP
#define MNCL_FRONTENDS_DATASET_HPP

#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <type_traits>
#include <vector>

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
  return {begin, floor_fraction(static_cast<std::size_t>(rank) + 1)};
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
// std::vector of samples.
template <class Dataset>
auto scatter_dataset(const Dataset &dataset, Communicator &comm,
                     const ScatterOptions &options = {}) {
  using Sample = std::decay_t<decltype(dataset[std::size_t{0}])>;
  static_assert(is_serializable<Sample>(), "scatter_dataset: the sample type is not serializable");
  if (comm.rank() != options.root) return comm.recv_obj<std::vector<Sample>>(options.root);

  const std::size_t n = dataset.size();
  std::vector<std::size_t> order;
  if (options.shuffle) {
    order = permutation(n, options.seed ? *options.seed : std::random_device{}());
  }
  auto shard_of = [&](int rank) {
    const ShardRange range = shard_range(n, comm.size(), rank, options.force_equal_length);
    std::vector<Sample> shard;
    shard.reserve(range.size());
    for (std::size_t i = range.begin; i < range.end; ++i) {
      shard.push_back(dataset[order.empty() ? i : order[i]]);
    }
    return shard;
  };
  // One shard in memory at a time besides the dataset itself.
  for (int rank = 0; rank < comm.size(); ++rank) {
    if (rank != options.root) comm.send_obj(shard_of(rank), rank);
  }
  return shard_of(options.root);
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_DATASET_HPP

// mncl::HierarchicalCommunicator: an allreduce in two levels, the ranks of each host first and
// the hosts after -- ChainerMN's `hierarchical` and `two_dimensional` communicators, built on
// the public C API (mncl_comm_split_type) alone.
//
//   mncl::Communicator world;
//   mncl::HierarchicalCommunicator hier(world);  // collective; the host's ranks on shm if built
//   hier.allreduce(grads, mncl::ReduceOp::kAvg);  // the same result as world.allreduce
//
// Why: the ranks of one host share memory, the hosts share a network. A flat allreduce over
// every rank puts every rank's traffic on the network, although most of it could stay inside
// a host, where shared memory (the shm backend, chosen by "auto") moves bytes at memcpy speed.
// With M ranks on each of H hosts and n elements:
//  - kReduceBcast (ChainerMN's hierarchical): reduce onto each host's first rank, allreduce
//    among the H first ranks, bcast within each host. Only one rank per host uses the network,
//    with n elements, as in an allreduce of H ranks instead of H * M; but the other M-1 ranks'
//    share of the network link stays idle. Works with any number of ranks per host.
//  - kTwoDimensional (ChainerMN's two_dimensional): reduce_scatter within each host (every rank
//    ends with its host's sum of one 1/M shard), allreduce of each shard across the hosts among
//    the ranks at the same position (M allreduces of n/M elements at once), allgather within
//    each host. Every rank uses the network for 1/M of the data: better for large buffers when
//    one stream cannot fill the link. It needs the same number of ranks on every host (the
//    constructor checks it, on every rank alike).
// Both run three collectives in a row, after the agreement below, where a flat allreduce runs
// one, so small buffers pay about four latencies; the gain is for buffers large enough that the
// network's bandwidth decides. On one machine (mncl-run --ranks-per-host M simulates hosts) there
// is no network to spare, so there the hierarchy shows its overhead, not its gain.
//
// Results: integer reductions are bit-exact, the same as world.allreduce. Floating-point sums
// may differ in the last bits (another summation order). Float16/BFloat16 travel as float32
// (twice the bytes) and are rounded once at the end, as the backends accumulate them: in 16
// bits a host's partial sum could overflow or round where the world's does not. kAvg travels
// as a SUM through every level and is divided once, by the world size, as mncl.h's AVG
// (integers: truncating toward zero).
//
// Host memory only: the padding, the 16-bit widening and kAvg's division touch the buffers on
// the CPU. "auto" for the intra backend follows MNCL_MEMORY like any "auto": on a host with an
// NVIDIA GPU it means CUDA memory (nccl), so there set MNCL_MEMORY=host or pass "shm".
//
// Construction is collective and ends alike everywhere: a group whose backend fails on its own
// ranks (a plugin missing on one host) makes every rank throw, the others a RemoteError, once
// every rank has tried, instead of leaving them waiting for it.
//
// Every allreduce fails together too: before any data moves it agrees over the world
// (agree_or_throw, agreement.hpp: one small allgather, two int64 per rank, on every call) on
// whether each rank accepts its buffers and on a digest of the op, dtype, buffer counts and
// algorithm. Buffers refused on one rank (send and receive of other sizes) throw
// InvalidArgument there and RemoteError naming it on the others; ops, dtypes or counts that
// differ between the ranks (an empty buffer on one rank, kAvg against kSum) throw
// InvalidArgument on every rank. The levels' own collectives cannot tell: they once waited
// until the timeout, or returned a wrong result on every rank (kAvg travels as a SUM, and
// kTwoDimensional pads counts). MultiNodeOptimizer's exchange skips it: its own
// agreement, just before, covers more (the sizes, dtype and settings behind the buffers). The
// agreement runs on the world communicator: no other thread may use it meanwhile (mncl.h's rule
// for every communicator).
#ifndef MNCL_FRONTENDS_HIERARCHICAL_HPP
#define MNCL_FRONTENDS_HIERARCHICAL_HPP

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mncl/frontends/agreement.hpp"
#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/dtype.hpp"
#include "mncl/frontends/error.hpp"
#include "mncl/frontends/span.hpp"

namespace mncl {

template <class Optimizer>
class MultiNodeOptimizer;  // multi_node_optimizer.hpp

enum class HierarchicalAlgorithm {
  kReduceBcast,     // reduce in the host, allreduce among the hosts' first ranks, bcast
  kTwoDimensional,  // reduce_scatter in the host, allreduce of each shard across, allgather
};

struct HierarchicalOptions {
  // The backend of the ranks of one host; "auto" picks shm where it is built.
  std::string intra_backend = "auto";
  // The backend between the hosts; "": the world's.
  std::string inter_backend;
  HierarchicalAlgorithm algorithm = HierarchicalAlgorithm::kReduceBcast;
};

namespace detail {

// values[i] /= divisor as mncl.h's AVG does: integers truncate toward zero (in 64 bits, so a
// divisor beyond the element type's range still divides). 16-bit floats never get here (they
// travel as float32).
template <class T>
void divide_by(Span<T> values, int divisor) {
  for (T &v : values) {
    if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      v = static_cast<T>(static_cast<int64_t>(v) / divisor);
    } else if constexpr (std::is_integral_v<T>) {
      v = static_cast<T>(static_cast<uint64_t>(v) / static_cast<uint64_t>(divisor));
    } else {
      v = v / static_cast<T>(divisor);
    }
  }
}

// True when [a, a + n) and [b, b + n) share memory without being the same buffer.
template <class T>
bool partially_overlap(const T *a, const T *b, std::size_t n) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x != y && x < y + n * sizeof(T) && y < x + n * sizeof(T);
}

}  // namespace detail

class HierarchicalCommunicator {
 public:
  // Collective over `world`, which must outlive this object: splits it into the ranks of each
  // host (intra) and the ranks that talk across hosts (inter). With kTwoDimensional and hosts
  // of different sizes every rank throws InvalidArgument naming the sizes.
  explicit HierarchicalCommunicator(Communicator &world, HierarchicalOptions options = {})
      : world_(&world), options_(std::move(options)) {
    if (!world.valid()) throw InvalidArgument("HierarchicalCommunicator: the world is empty");
    make_everywhere("the ranks of each host",
                    [&] { intra_ = world.split_host(0, SplitOptions{options_.intra_backend}); });
    // Every host's size, from its first rank, in the order of those ranks: one world
    // collective, so every rank sees the same layout and takes the same decisions below.
    const std::vector<int32_t> firsts =
        world.allgather(std::vector<int32_t>{intra_.rank() == 0 ? intra_.size() : 0});
    std::vector<int> host_sizes;
    for (int32_t s : firsts) {
      if (s > 0) host_sizes.push_back(s);
    }
    num_hosts_ = static_cast<int>(host_sizes.size());
    if (options_.algorithm == HierarchicalAlgorithm::kTwoDimensional &&
        std::any_of(host_sizes.begin(), host_sizes.end(),
                    [&](int s) { return s != host_sizes.front(); })) {
      intra_.destroy();  // collective within the host, and every rank gets here
      throw InvalidArgument(
          "HierarchicalCommunicator: the two-dimensional algorithm needs the same number of "
          "ranks on every host, but the " +
          std::to_string(num_hosts_) + " hosts have " + join(host_sizes) +
          " ranks (use kReduceBcast)");
    }
    make_everywhere("the ranks across hosts", [&] {
      if (options_.algorithm == HierarchicalAlgorithm::kTwoDimensional) {
        inter_ = world.split_cross_host(0, SplitOptions{options_.inter_backend});
      } else {  // only the hosts' first ranks talk across: no idle groups of the others
        inter_ = world.split(intra_.rank() == 0 ? 0 : MNCL_SPLIT_NONE, 0,
                             SplitOptions{options_.inter_backend});
      }
    });
    // My host's index: how many hosts have their first rank before mine.
    int first_rank = world.rank();
    intra_.bcast(Span<int>(&first_rank, 1), 0);
    host_index_ = static_cast<int>(std::count_if(firsts.begin(), firsts.begin() + first_rank,
                                                 [](int32_t s) { return s > 0; }));
  }

  Communicator &world() noexcept { return *world_; }
  // The ranks of this rank's host, ordered by world rank.
  Communicator &intra() noexcept { return intra_; }
  // The ranks that talk across hosts, ordered by world rank. kTwoDimensional: the ranks at
  // this rank's position (intra_rank) on every host (a host with fewer ranks has no member in
  // the groups of the higher positions). kReduceBcast: the hosts' first ranks; empty (not
  // valid()) on the other ranks.
  Communicator &inter() noexcept { return inter_; }
  const HierarchicalOptions &options() const noexcept { return options_; }

  int rank() const noexcept { return world_->rank(); }
  int size() const noexcept { return world_->size(); }
  int intra_rank() const noexcept { return intra_.rank(); }
  int intra_size() const noexcept { return intra_.size(); }
  // ChainerMN's inter_rank / inter_size: this rank's host (hosts ordered by their first world
  // rank) and the number of hosts. inter().rank() / size() are the place in, and size of, this
  // rank's own group: the same at position 0, and wherever every host holds M consecutive
  // world ranks.
  int inter_rank() const noexcept { return host_index_; }
  int inter_size() const noexcept { return num_hosts_; }
  int num_hosts() const noexcept { return num_hosts_; }

  // Collective: frees both communicators now and reports a failure (the destructor cannot).
  void destroy() {
    inter_.destroy();
    intra_.destroy();
  }

 private:
  // Runs `make` (a split) on every rank, then agrees over the world on whether every rank
  // succeeded: a rank that failed rethrows its own error, the others throw a RemoteError, and
  // what was made is freed. A split fails on the ranks of one group only when that group's
  // backend fails; without this the other groups would wait in the next world collective.
  template <class Make>
  void make_everywhere(const char *what, Make make) {
    std::exception_ptr failure;
    try {
      make();
    } catch (...) {  // whatever it is, the others must hear of it
      failure = std::current_exception();
    }
    int everywhere = 0;
    try {
      everywhere = world_->allreduce_value(failure ? 0 : 1, ReduceOp::kMin);
    } catch (const Error &) {
      if (!failure) throw;  // the world itself failed: that error says more
    }
    if (failure == nullptr && everywhere == 1) return;
    abandon();
    if (failure) std::rethrow_exception(failure);
    throw RemoteError(std::string("HierarchicalCommunicator: making ") + what +
                      " failed on other ranks (their errors say why)");
  }
  // Frees what a failed construction made; its own failures are secondary.
  void abandon() noexcept {
    for (Communicator *c : {&inter_, &intra_}) {
      try {
        c->destroy();
      } catch (const Error &) {
      }
    }
  }

 public:
  // ------------------------------------------------------------------------------------------
  // Allreduce, as Communicator's: the same ops and dtypes, the same result on every rank.
  // Each agrees first (see the top of the file): an extra small allgather over the world.
  // ------------------------------------------------------------------------------------------

  template <class Buffer, class = detail::EnableIfBuffer<Buffer>>
  void allreduce(Buffer &&inout, ReduceOp op = ReduceOp::kSum) {
    auto buf = as_span(inout);
    static_assert(!std::is_const_v<typename decltype(buf)::element_type>,
                  "allreduce: the buffer must be writable");
    using T = std::remove_cv_t<typename decltype(buf)::element_type>;
    LayoutDigest layout;
    layout.add(kSingle).add(buf.size());
    agree<T>(kAllreduce, op_refused(kAllreduce, op), op, layout);
    run(buf.data(), buf.data(), buf.size(), op);
  }
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void allreduce(const Send &send, Recv &&recv, ReduceOp op = ReduceOp::kSum) {
    auto [s, r] = detail::typed_pair(send, recv);
    using T = std::remove_cv_t<typename decltype(r)::element_type>;
    std::exception_ptr refused = op_refused(kAllreduce, op);
    if (s.size() != r.size()) {
      refused = refusal(kAllreduce, "send and receive buffers differ in size");
    } else if (detail::partially_overlap(s.data(), r.data(), s.size())) {
      refused = refusal(kAllreduce, "send and receive buffers overlap without being the same");
    }
    LayoutDigest layout;
    layout.add(kSingle).add(s.size());
    agree<T>(kAllreduce, refused, op, layout);
    run(s.data(), r.data(), s.size(), op);
  }
  // Several in-place allreduces of one type in one: buffers that lie back to back in memory
  // (the buckets of one flat gradient buffer) are reduced where they are, others are packed
  // into one buffer first. One pass through the three levels either way. Every rank passes the
  // same number of buffers and the same sizes, empty ones included.
  template <class T>
  void allreduce_coalesced(const std::vector<Span<T>> &buffers, ReduceOp op = ReduceOp::kSum) {
    coalesced(buffers, op, true);
  }

 private:
  // MultiNodeOptimizer agrees on more than this call's agreement would (the sizes, dtype and
  // settings behind these buffers) just before its exchange, and skips the second one.
  template <class Optimizer>
  friend class MultiNodeOptimizer;

  template <class T>
  void coalesced(const std::vector<Span<T>> &buffers, ReduceOp op, bool agree_first) {
    static_assert(!std::is_const_v<T>, "coalesced allreduce works in place: use Span<T>");
    constexpr const char *what = "HierarchicalCommunicator::allreduce_coalesced";
    LayoutDigest layout;
    layout.add(kCoalesced).add(buffers.size());
    for (const auto &b : buffers) layout.add(b.size());
    std::vector<Span<T>> used;
    std::size_t total = 0;
    bool back_to_back = true;
    std::vector<std::remove_cv_t<T>> packed;
    std::exception_ptr refused = op_refused(what, op);
    try {  // a bad_alloc here must not leave the others in the agreement
      for (const auto &b : buffers) {
        if (b.empty()) continue;
        if (!used.empty() && used.back().end() != b.begin()) back_to_back = false;
        used.push_back(b);
        total += b.size();
      }
      if (!back_to_back) packed.reserve(total);
    } catch (...) {
      refused = std::current_exception();
    }
    if (agree_first) {
      agree<T>(what, refused, op, layout);
    } else if (refused) {  // the caller agreed on the rest: a bad_alloc of this rank's
      std::rethrow_exception(refused);
    }
    if (used.empty()) return;  // on every rank alike (agreed)
    if (back_to_back) {
      run(used.front().data(), used.front().data(), total, op);
      return;
    }
    for (const auto &b : used) packed.insert(packed.end(), b.begin(), b.end());
    run(packed.data(), packed.data(), total, op);
    std::size_t offset = 0;
    for (const auto &b : used) {
      std::copy_n(packed.data() + offset, b.size(), b.data());
      offset += b.size();
    }
  }

  static constexpr const char *kAllreduce = "HierarchicalCommunicator::allreduce";
  static constexpr uint64_t kSingle = 1, kCoalesced = 2;  // which call, in the digest

  static std::exception_ptr refusal(const char *what, const std::string &reason) {
    return std::make_exception_ptr(InvalidArgument(std::string(what) + ": " + reason));
  }
  // Null for an op of mncl.h, else this rank's refusal.
  static std::exception_ptr op_refused(const char *what, ReduceOp op) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kProd:
      case ReduceOp::kMin:
      case ReduceOp::kMax:
      case ReduceOp::kAvg:
        return nullptr;
    }
    return refusal(what, "unknown reduction op " + std::to_string(static_cast<int>(op)));
  }
  // agree_or_throw over the world on `own_error` and the digest of `layout` (the call and its
  // counts), the dtype, the op and the algorithm: returns where every rank may go on.
  template <class T>
  void agree(const char *what, std::exception_ptr own_error, ReduceOp op, LayoutDigest layout) {
    layout.add(static_cast<uint64_t>(dtype_of<T>()))
        .add(static_cast<uint64_t>(op))
        .add(static_cast<uint64_t>(options_.algorithm));
    agree_or_throw(*world_, what, own_error, layout.value());
  }

  template <class T>
  void run(const T *send, T *recv, std::size_t count, ReduceOp op) {
    if (count == 0) return;  // every rank passes the same count (agreed): nothing to exchange
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      // In float32 through every level and rounded once at the end, as the backends
      // accumulate 16-bit floats: a host's 16-bit partial sum could overflow or round.
      std::vector<float> wide(count);
      std::transform(send, send + count, wide.begin(), [](T v) { return to_float(v); });
      run(wide.data(), wide.data(), count, op);
      if constexpr (std::is_same_v<T, Float16>) {
        std::transform(wide.begin(), wide.end(), recv, [](float v) { return to_float16(v); });
      } else {
        std::transform(wide.begin(), wide.end(), recv, [](float v) { return to_bfloat16(v); });
      }
    } else {
      // AVG is a SUM through every level, divided once by the world size (not by a group's).
      const bool average = op == ReduceOp::kAvg;
      const ReduceOp wire = average ? ReduceOp::kSum : op;
      if (options_.algorithm == HierarchicalAlgorithm::kTwoDimensional) {
        two_dimensional(send, recv, count, wire, average);
      } else {
        reduce_bcast(send, recv, count, wire, average);
      }
    }
  }

  // Levels of size 1 are skipped: intra_size is a property of the host (its ranks alike skip),
  // num_hosts one of the job (every rank alike skips).
  template <class T>
  void reduce_bcast(const T *send, T *recv, std::size_t count, ReduceOp wire, bool average) {
    const Span<T> result(recv, count);
    if (intra_.size() > 1) {
      intra_.reduce(Span<const T>(send, count), result, 0, wire);  // in place when send == recv
    } else if (send != recv) {
      std::copy_n(send, count, recv);
    }
    if (intra_.rank() == 0) {
      if (num_hosts_ > 1) inter_.allreduce(result, wire);
      if (average) detail::divide_by(result, world_->size());
    }
    if (intra_.size() > 1) intra_.bcast(result, 0);
  }

  template <class T>
  void two_dimensional(const T *send, T *recv, std::size_t count, ReduceOp wire, bool average) {
    const std::size_t ranks = static_cast<std::size_t>(intra_.size());
    const std::size_t shard_count = (count + ranks - 1) / ranks;
    const std::size_t padded = shard_count * ranks;
    // reduce_scatter needs equal blocks: a count that does not divide goes through a copy
    // padded with zeros, which only ever meet other padding (every rank's count is the same,
    // agreed) and are dropped at the end.
    // Otherwise the levels run in place in recv, without a copy.
    std::vector<T> scratch;
    T *work = recv;
    if (padded != count) {
      scratch.assign(padded, T{});
      std::copy_n(send, count, scratch.data());
      send = work = scratch.data();
    }
    const Span<T> shard(work + shard_count * static_cast<std::size_t>(intra_.rank()), shard_count);
    if (ranks > 1) {
      intra_.reduce_scatter(Span<const T>(send, padded), shard, wire);
    } else if (send != work) {
      std::copy_n(send, count, work);
    }
    if (num_hosts_ > 1) inter_.allreduce(shard, wire);
    if (average) detail::divide_by(shard, world_->size());
    if (ranks > 1) intra_.allgather(Span<const T>(shard), Span<T>(work, padded));  // in place
    if (work != recv) std::copy_n(work, count, recv);
  }

  static std::string join(const std::vector<int> &values) {
    std::string text;
    for (int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
    return text;
  }

  Communicator *world_;
  HierarchicalOptions options_;
  // Empty until the constructor splits (a default-built Communicator would join a new world).
  Communicator intra_ = Communicator::adopt(nullptr, kDefaultMaxMessageBytes);
  Communicator inter_ = Communicator::adopt(nullptr, kDefaultMaxMessageBytes);
  int num_hosts_ = 1;
  int host_index_ = 0;
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_HIERARCHICAL_HPP

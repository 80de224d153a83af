// MultiNodeChainList (ChainerMN's model parallelism): one model split into links placed on
// different ranks. Each rank builds a chain list holding only its own links, in the order they
// run, and names where each link's input comes from and where its output goes:
//
//   // rank 0: the first half, output sent to rank 1
//   chain.add_link(first_half, std::nullopt, 1);
//   // rank 1: input from rank 0, output is the model's output on this rank
//   chain.add_link(second_half, 0, std::nullopt);
//
// forward(x) runs the local links in order: a link without rank_in takes x, others receive
// their input from rank_in; a link with rank_out sends its output there, and the one link
// without rank_out (at most one per rank, as in ChainerMN: add_link refuses a second) has its
// output returned. backward(grad) runs them in reverse: a link without rank_out gets `grad`, others
// receive their output gradient from rank_out; input gradients go back to rank_in, or are
// returned. Tensors travel with their shapes, so ranks need not know each other's sizes.
// Every rank must add its links so that sends and receives pair up in the same order (the
// natural order of the model does).
//
// Branches: rank_in and rank_out may each name several ranks ({1, 2}), as in ChainerMN (an
// empty list is none; a rank twice in one list is refused). A link with several rank_out sends
// its output to each, and its output gradient is the sum of theirs (a branch that returns no
// input gradient counts as zero). A link with several rank_in takes the sum of their tensors,
// which must have one shape (ChainerMN passes them as separate arguments; a Link here takes one
// tensor), and its input gradient goes back to each. A link's sends to the ranks of a list go
// as one batch (mncl_sendrecv_batch), so no rank of the list waits on another's receive; its
// receives take the list's order (the reverse order in backward(), which makes every send and
// receive in the reverse order of the forward's, so that a backward completes wherever its
// forward did). Where a send waits for its receive (gloo, MPI and shm past small tensors),
// list a join's ranks in the model's order: with 0 -> 2, 0 -> 1 and 1 -> 2 as separate links
// of rank 0 (its send to 2 first), rank 2's rank_in {0, 1} completes, while {1, 0} waits on
// rank 1, which waits for rank 0's send queued behind the one to rank 2. A sum adds in the
// list's order.
//
//   // rank 0: a trunk feeding two branches, then the head that joins them
//   chain.add_link(trunk, {}, {1, 2});
//   chain.add_link(head, {1, 2}, {});
//   // ranks 1 and 2: one branch each
//   chain.add_link(branch, 0, 0);
//
// Failing together. When a link throws on one rank (or its tensor cannot travel: over 7
// dimensions, data that does not fill its shape), that rank still makes every send and receive
// of the pass, with a failure marker (its rank in `comm`, the error's text) in place of each
// tensor it would have sent, and throws only then: the link's own exception. A rank that
// receives a marker does the same and throws RemoteError naming that rank and the error. So
// every rank that waits for a message the failure would have sent fails at once instead of
// waiting until the timeout; ranks that wait for nothing more return normally:
//   - A failed forward fails the ranks downstream in their forward. The ranks upstream have
//     finished theirs: in training they wait in backward() for a gradient, and learn of the
//     failure only where every rank of the chain said that a backward follows each forward
//     (set_backward_follows(true)): a failed forward then also makes the backward's sends and
//     receives, with markers. Off by default, because a rank that then makes a forward-only
//     pass (evaluation) would leave the failing rank waiting for a gradient until the timeout:
//     turn it on for training passes and off for the others (as examples/mnist_mlp does).
//     backward() after a failed forward, twice, or before any forward throws InvalidArgument,
//     communicating nothing.
//   - A failed backward fails the ranks it sends gradients to (upstream) in their backward;
//     the ranks downstream sent theirs already and have returned.
//   A pass can thus fail on some ranks and succeed on others (downstream of a failed backward,
//   a branch fed before the failure, which learns of it in its backward and only with
//   set_backward_follows(true)): a loop that goes on after a failure skips the step on every
//   rank by itself (an allreduce of a flag, say). Every message carries its pass's
//   number, so a rank whose count of forward() calls differs from its peer's (a chain rebuilt
//   on one rank) fails with RemoteError at its next receive instead of pairing one batch's
//   tensor with another's; the ranks then rebuild their chains together. Errors of the
//   communicator itself (TimeoutError, a peer gone; naming the pass's failure, if any) and
//   stages failing on their own in one pass are thrown as they come. Chain messages are not
//   send_tensor's: the two do not pair.
#ifndef MNCL_FRONTENDS_CHAIN_LIST_HPP
#define MNCL_FRONTENDS_CHAIN_LIST_HPP

#include <array>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/links.hpp"

namespace mncl {

// Sends a tensor's shape, then its data (point to point).
void send_tensor(Communicator &comm, const Tensor &tensor, int peer);
Tensor recv_tensor(Communicator &comm, int peer);

// A link's rank_in or rank_out: none (std::nullopt, {}), one rank, or several ({1, 2}).
struct ChainRanks {
  std::vector<int> ranks;
  ChainRanks() = default;
  ChainRanks(std::nullopt_t) {}          // NOLINT: implicit, as the ranks' other spellings
  ChainRanks(int rank) : ranks{rank} {}  // NOLINT
  template <class Int, class = std::enable_if_t<std::is_integral_v<Int>>>
  ChainRanks(const std::optional<Int> &rank) {  // NOLINT
    if (rank) ranks.push_back(to_rank(*rank));
  }
  ChainRanks(std::initializer_list<int> list) : ranks(list) {}
  ChainRanks(std::vector<int> list) : ranks(std::move(list)) {}  // NOLINT
  template <class Int,
            class = std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, int>>>
  ChainRanks(const std::vector<Int> &list) {  // NOLINT
    for (Int rank : list) ranks.push_back(to_rank(rank));
  }
  bool empty() const noexcept { return ranks.empty(); }

 private:
  // Out of int's range: -1, which add_link refuses as no rank (never another rank by wrapping).
  template <class Int>
  static int to_rank(Int rank) noexcept {
    constexpr auto kMax = static_cast<unsigned long long>(std::numeric_limits<int>::max());
    if constexpr (std::is_signed_v<Int>) {
      if (rank < 0) return -1;
    }
    return static_cast<unsigned long long>(rank) > kMax ? -1 : static_cast<int>(rank);
  }
};

class MultiNodeChainList {
 public:
  // `comm` must outlive the chain list.
  explicit MultiNodeChainList(Communicator &comm) : comm_(&comm) {}

  // Ranks other than this one, each at most once per list.
  void add_link(std::shared_ptr<Link> link, ChainRanks rank_in = {}, ChainRanks rank_out = {});

  // The output of the local link without rank_out (an empty tensor if there is none).
  Tensor forward(const Tensor &x);
  // grad: the loss gradient w.r.t. forward()'s result (ignored if that was empty). Returns the
  // gradient w.r.t. x, summed over the links that took x (empty if none did, or if they do not
  // compute input gradients).
  Tensor backward(const Tensor &grad);

  std::vector<Parameter *> parameters();
  std::size_t size() const noexcept { return entries_.size(); }

  // Whether every rank of the chain calls backward() after each forward() (training passes):
  // then a failed forward tells the ranks upstream too (see above). Off by default; every rank
  // of the chain sets the same.
  void set_backward_follows(bool follows) noexcept { backward_follows_ = follows; }
  bool backward_follows() const noexcept { return backward_follows_; }

 private:
  struct Entry {
    std::shared_ptr<Link> link;
    std::vector<int> rank_in, rank_out;
    // The last pass's received activation and gradient, kept for their memory: a tensor of the
    // same size is received into it without a new allocation or zero fill.
    Tensor spare_input, spare_grad;
  };
  // What failed a pass: the rank where it began and its text; on that rank, the exception too.
  struct Failure {
    int origin = -1;
    std::string what;
    std::exception_ptr local;
  };
  struct Received {
    Tensor tensor;
    std::optional<Failure> failure;  // a marker: no tensor came
  };
  enum class Direction : int64_t { kForward = 1, kBackward = 2 };

  // chain_list.cpp's layout: 12 words, then room for a payload of 1 KiB.
  using ChainHeader = std::array<int64_t, 12 + 128>;

  // The sum of the tensors from every rank of `peers` (none: an empty tensor); a marker from
  // any sets `failure`. Throws RemoteError for a message that does not belong here.
  // `spare` (may be null) lends its memory to the first tensor received.
  Tensor receive_sum(Direction direction, const std::vector<int> &peers, std::size_t link,
                     std::optional<Failure> &failure, Tensor *spare = nullptr);
  // Sends `tensor` to every rank of `peers`, or markers once the pass has failed. A tensor that
  // cannot travel fails the pass here (`failure` is set) and markers go in its place.
  void send_all(Direction direction, const Tensor &tensor, const std::vector<int> &peers,
                std::optional<Failure> &failure);
  // Runs and clears `ops`, sends to `peers` ranks: one batch, or plain sends for one rank.
  void exchange(std::vector<P2POp> &ops, std::size_t peers);
  void drop_stale_markers(ChainHeader &header, int peer);
  // Sized for the payload, in `spare`'s memory where its size is right.
  Received prepare(const ChainHeader &header, int peer, Tensor *spare);
  void judge(const ChainHeader &header, int peer, Direction direction) const;

  // The backward's sends and receives with markers in place of gradients (a failed pass).
  void run_backward_with_markers(const Failure &failure);
  [[noreturn]] void throw_failure(const Failure &failure, const char *call) const;
  // Called while handling `error`, a communicator's: rethrows it, naming `failure` if set.
  [[noreturn]] static void rethrow_with_failure(const Error &error,
                                                const std::optional<Failure> &failure);

  Communicator *comm_;
  std::vector<Entry> entries_;
  bool backward_follows_ = false;
  int64_t pass_ = 0;             // forward() calls so far; every message carries it
  bool backward_ready_ = false;  // the last forward succeeded, and no backward went through it
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_CHAIN_LIST_HPP

#include "mncl/frontends/chain_list.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "shape_check.hpp"

namespace mncl {

namespace {
// Shape header: the number of dimensions, then up to kMaxDims sizes.
constexpr std::size_t kMaxDims = 7;

// A failure's text travels cut to this many bytes.
constexpr std::size_t kMaxFailureText = 1024;
// A payload (a tensor's data, a failure's text) of at most this many bytes travels in the
// header's message: a small tensor, and every marker, is one message instead of two.
constexpr std::size_t kInlineBytes = kMaxFailureText;

// A chain message's header, int64 words, with room for an inline payload; a payload too large
// for it follows in a message of its own.
enum ChainWord : std::size_t {
  kWordDirection,  // MultiNodeChainList::Direction: an activation or a gradient
  kWordPass,       // the sender's pass number
  kWordFailed,     // 1: a failure marker, no tensor
  kWordLength,     // the tensor's dimensions, or the failure text's bytes
  kWordOrigin,     // a marker's rank where the failure began
  kWordShape,      // the tensor's sizes (kMaxDims words)
  kWordInline = kWordShape + kMaxDims,  // the payload, where it fits (kInlineBytes)
  kChainHeaderWords = kWordInline + kInlineBytes / sizeof(int64_t)
};

bool travels_inline(std::size_t bytes) {
  return bytes <= kInlineBytes;
}

const char *direction_name(int64_t direction) {
  return direction == 1 ? "activation" : direction == 2 ? "gradient" : "message";
}

// The text of the exception a link threw.
std::string describe(const std::exception_ptr &error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception &e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}
}  // namespace

void send_tensor(Communicator &comm, const Tensor &tensor, int peer) {
  if (tensor.shape.size() > kMaxDims) {
    throw InvalidArgument("send_tensor: " + std::to_string(tensor.shape.size()) +
                          " dimensions; at most " + std::to_string(kMaxDims) + " travel");
  }
  if (tensor.data.size() != Tensor::element_count(tensor.shape)) {  // before anything travels
    throw InvalidArgument("send_tensor: a tensor of shape " + tensor.shape_string() + " holds " +
                          std::to_string(tensor.data.size()) + " elements");
  }
  std::array<int64_t, kMaxDims + 1> header{};
  header[0] = static_cast<int64_t>(tensor.shape.size());
  std::copy(tensor.shape.begin(), tensor.shape.end(), header.begin() + 1);
  comm.send(header, peer);
  if (!tensor.data.empty()) comm.send(tensor.data, peer);
}

Tensor recv_tensor(Communicator &comm, int peer) {
  std::array<int64_t, kMaxDims + 1> header{};
  comm.recv(header, peer);
  if (header[0] < 0 || header[0] > static_cast<int64_t>(kMaxDims)) {
    throw RemoteError("recv_tensor: rank " + std::to_string(peer) + " sent a tensor with " +
                      std::to_string(header[0]) + " dimensions");
  }
  Tensor tensor;
  try {
    tensor = Tensor(std::vector<int64_t>(header.begin() + 1, header.begin() + 1 + header[0]));
  } catch (const InvalidArgument &e) {  // a shape no tensor can have: the peer is broken
    throw RemoteError("recv_tensor: rank " + std::to_string(peer) +
                      " sent a bad shape: " + e.what());
  }
  if (!tensor.data.empty()) comm.recv(tensor.data, peer);
  return tensor;
}

void MultiNodeChainList::add_link(std::shared_ptr<Link> link, ChainRanks rank_in,
                                  ChainRanks rank_out) {
  if (!link) throw InvalidArgument("MultiNodeChainList::add_link: null link");
  for (const auto *list : {&rank_in.ranks, &rank_out.ranks}) {
    for (std::size_t i = 0; i < list->size(); ++i) {
      const int rank = (*list)[i];
      if (rank < 0 || rank >= comm_->size() || rank == comm_->rank()) {
        throw InvalidArgument("MultiNodeChainList::add_link: rank " + std::to_string(rank) +
                              " is not another rank of a communicator of size " +
                              std::to_string(comm_->size()));
      }
      if (std::find(list->begin(), list->begin() + i, rank) != list->begin() + i) {
        throw InvalidArgument("MultiNodeChainList::add_link: rank " + std::to_string(rank) +
                              " is named twice in one list");
      }
    }
  }
  // As ChainerMN: one output per rank. forward() could return only one of two, and backward()
  // would feed the loss gradient to both (a silently wrong input and parameter gradient).
  const auto output = std::find_if(entries_.begin(), entries_.end(),
                                   [](const Entry &entry) { return entry.rank_out.empty(); });
  if (rank_out.empty() && output != entries_.end()) {
    throw InvalidArgument(
        "MultiNodeChainList::add_link: this rank already has a link without rank_out (link " +
        std::to_string(output - entries_.begin()) +
        "), whose output forward() returns; a rank has one output (combine the two links into "
        "one, e.g. a Sequential, or send one's output to another rank)");
  }
  Entry entry;
  entry.link = std::move(link);
  entry.rank_in = std::move(rank_in.ranks);
  entry.rank_out = std::move(rank_out.ranks);
  entries_.push_back(std::move(entry));
}

// A link's sends to several ranks (a fan-out, or a join's gradients) go as one batch, every
// peer's header and payload together: the batch progresses them all at once, so no peer waits
// on another's receive. Receives stay one peer after the other (a batch of them would wait for
// every header before any payload, and a sender whose payload is due to one rank might be
// needed first by another: chains that complete with single calls then waited until the
// timeout). A single peer takes plain calls.
void MultiNodeChainList::exchange(std::vector<P2POp> &ops, std::size_t peers) {
  if (peers > 1) {
    comm_->sendrecv_batch(ops);
  } else {
    for (const P2POp &op : ops) {  // one peer: its header, then its payload
      check(mncl_send(comm_->handle(), op.data(), op.count(), op.dtype(), op.peer(), nullptr),
            "mncl_send");
    }
  }
  ops.clear();
}

void MultiNodeChainList::drop_stale_markers(ChainHeader &header, int peer) {
  while (header[kWordFailed] != 0 &&
         header[kWordDirection] == static_cast<int64_t>(Direction::kBackward) &&
         header[kWordPass] < pass_) {
    // A failed forward's marker for an earlier pass's backward that never came (a rank that
    // said a backward follows, then made a forward-only pass): dropped, with its text.
    if (header[kWordLength] < 0 || header[kWordLength] > static_cast<int64_t>(kMaxFailureText)) {
      throw RemoteError("MultiNodeChainList: rank " + std::to_string(peer) +
                        " sent a failure marker of " + std::to_string(header[kWordLength]) +
                        " bytes");
    }
    comm_->recv(header, peer);  // (its text came inline)
  }
}

MultiNodeChainList::Received MultiNodeChainList::prepare(const ChainHeader &header, int peer,
                                                         Tensor *spare) {
  const std::string from = "MultiNodeChainList: rank " + std::to_string(peer);
  Received received;
  const int64_t length = header[kWordLength];
  if (header[kWordFailed] != 0) {
    if (length < 0 || length > static_cast<int64_t>(kMaxFailureText)) {
      throw RemoteError(from + " sent a failure marker of " + std::to_string(length) + " bytes");
    }
    received.failure = Failure{static_cast<int>(header[kWordOrigin]),
                               std::string(static_cast<std::size_t>(length), '\0'), nullptr};
    return received;
  }
  if (length < 0 || length > static_cast<int64_t>(kMaxDims)) {
    throw RemoteError(from + " sent a tensor with " + std::to_string(length) + " dimensions");
  }
  std::vector<int64_t> shape(header.begin() + kWordShape, header.begin() + kWordShape + length);
  try {
    const std::size_t count = Tensor::element_count(shape);  // checks the shape
    if (spare != nullptr && spare->data.size() == count) {
      received.tensor = std::move(*spare);  // its values are all overwritten by the receive
      received.tensor.shape = std::move(shape);
    } else {
      received.tensor = Tensor(std::move(shape));
    }
  } catch (const InvalidArgument &e) {  // a shape no tensor can have: the peer is broken
    throw RemoteError(from + " sent a bad shape: " + e.what());
  }
  return received;
}

void MultiNodeChainList::judge(const ChainHeader &header, int peer, Direction direction) const {
  static_assert(std::tuple_size_v<ChainHeader> == kChainHeaderWords,
                "chain_list.hpp's ChainHeader holds the header's words");
  const std::string from = "MultiNodeChainList: rank " + std::to_string(peer);
  if (header[kWordDirection] != static_cast<int64_t>(direction)) {
    throw RemoteError(from + " sent a " + direction_name(header[kWordDirection]) +
                      " where this rank waits for a " +
                      direction_name(static_cast<int64_t>(direction)) +
                      ": the ranks' chains do not pair their sends and receives (add_link)");
  }
  if (header[kWordPass] != pass_) {
    throw RemoteError(from + " sent a " + direction_name(header[kWordDirection]) + " of its pass " +
                      std::to_string(header[kWordPass]) + " to this rank's pass " +
                      std::to_string(pass_) +
                      ": every rank of the chain calls forward (and backward) equally often");
  }
}

Tensor MultiNodeChainList::receive_sum(Direction direction, const std::vector<int> &peers,
                                       std::size_t link, std::optional<Failure> &failure,
                                       Tensor *spare) {
  const std::size_t n = peers.size();
  std::vector<Received> received(n);
  // Peer after peer, in the list's order for activations and in the reverse order for
  // gradients (the reverse of the forward's, so that a backward completes wherever its forward
  // did). Each message is received whole before it is judged: nothing of it is left to pair
  // with the next receive.
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t i = direction == Direction::kForward ? j : n - 1 - j;
    ChainHeader header{};
    comm_->recv(header, peers[i]);
    drop_stale_markers(header, peers[i]);
    received[i] = prepare(header, peers[i], j == 0 ? spare : nullptr);
    const auto *payload = reinterpret_cast<const char *>(header.data() + kWordInline);
    if (received[i].failure) {  // a marker's text always fits inline
      std::string &text = received[i].failure->what;
      std::copy(payload, payload + text.size(), text.begin());
    } else {
      std::vector<float> &data = received[i].tensor.data;
      if (travels_inline(data.size() * sizeof(float))) {
        std::copy(payload, payload + data.size() * sizeof(float),
                  reinterpret_cast<char *>(data.data()));
      } else {
        comm_->recv(data, peers[i]);
      }
    }
    judge(header, peers[i], direction);
  }

  Tensor sum;
  std::size_t first = n;  // the peer whose tensor `sum` started from
  for (std::size_t i = 0; i < n; ++i) {
    if (received[i].failure) {
      if (!failure) failure = std::move(received[i].failure);
    } else if (!failure) {
      Tensor &tensor = received[i].tensor;
      if (direction == Direction::kBackward && tensor.empty()) {
        continue;  // a branch that computes no input gradient: zero
      }
      if (first == n) {
        first = i;
        sum = std::move(tensor);
      } else if (tensor.shape != sum.shape) {
        const std::string what =
            std::string("MultiNodeChainList::") +
            (direction == Direction::kForward ? "forward" : "backward") + ": link " +
            std::to_string(link) + " sums the " + direction_name(static_cast<int64_t>(direction)) +
            "s of ranks " + std::to_string(peers[first]) + " and " + std::to_string(peers[i]) +
            ", of shapes " + sum.shape_string() + " and " + tensor.shape_string();
        failure = Failure{comm_->rank(), what, std::make_exception_ptr(InvalidArgument(what))};
      } else {
        for (std::size_t k = 0; k < sum.data.size(); ++k) sum.data[k] += tensor.data[k];
      }
    }
  }
  return sum;
}

void MultiNodeChainList::send_all(Direction direction, const Tensor &tensor,
                                  const std::vector<int> &peers, std::optional<Failure> &failure) {
  if (peers.empty()) return;
  ChainHeader header{};
  header[kWordDirection] = static_cast<int64_t>(direction);
  header[kWordPass] = pass_;
  if (!failure) {  // checked before anything travels: markers go instead
    std::string problem;
    if (tensor.shape.size() > kMaxDims) {
      problem = std::to_string(tensor.shape.size()) + " dimensions; at most " +
                std::to_string(kMaxDims) + " travel";
    } else if (const auto count = internal::checked_element_count(tensor.shape); !count) {
      problem = "no tensor has the shape " + tensor.shape_string();  // (not thrown: markers go)
    } else if (tensor.data.size() != (tensor.shape.empty() ? 0 : *count)) {  // {}: no tensor
      problem = "a tensor of shape " + tensor.shape_string() + " holds " +
                std::to_string(tensor.data.size()) + " elements";
    }
    if (!problem.empty()) {
      std::string to;
      for (int peer : peers) to += (to.empty() ? "" : ", ") + std::to_string(peer);
      const std::string what = std::string("MultiNodeChainList::") +
                               (direction == Direction::kForward ? "forward" : "backward") +
                               ": the " + direction_name(header[kWordDirection]) + " for rank" +
                               (peers.size() > 1 ? "s " : " ") + to + " cannot travel: " + problem;
      failure = Failure{comm_->rank(), what, std::make_exception_ptr(InvalidArgument(what))};
    }
  }
  auto *payload = reinterpret_cast<char *>(header.data() + kWordInline);
  bool payload_follows = false;
  if (failure) {
    const std::string text = failure->what.substr(0, kMaxFailureText);
    header[kWordFailed] = 1;
    header[kWordLength] = static_cast<int64_t>(text.size());
    header[kWordOrigin] = failure->origin;
    std::copy(text.begin(), text.end(), payload);
  } else {
    header[kWordLength] = static_cast<int64_t>(tensor.shape.size());
    std::copy(tensor.shape.begin(), tensor.shape.end(), header.begin() + kWordShape);
    const std::size_t bytes = tensor.data.size() * sizeof(float);
    payload_follows = !travels_inline(bytes);
    if (!payload_follows) {
      const auto *data = reinterpret_cast<const char *>(tensor.data.data());
      std::copy(data, data + bytes, payload);
    }
  }
  std::vector<P2POp> ops;
  for (int peer : peers) {
    ops.push_back(isend_op(header, peer));
    if (payload_follows) ops.push_back(isend_op(tensor.data, peer));
  }
  exchange(ops, peers.size());
}

void MultiNodeChainList::run_backward_with_markers(const Failure &failure) {
  std::optional<Failure> marker = failure;
  // As backward(): the links in the reverse of the forward's order.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    const std::size_t k = static_cast<std::size_t>(entries_.rend() - it) - 1;
    receive_sum(Direction::kBackward, it->rank_out, k, marker);  // whatever it is: dropped
    send_all(Direction::kBackward, Tensor(), it->rank_in, marker);
  }
}

void MultiNodeChainList::rethrow_with_failure(const Error &error,
                                              const std::optional<Failure> &failure) {
  if (!failure) throw;  // NOLINT: rethrows `error`, the exception being handled
  // The communicator failed while this rank told its peers of the pass's failure: both count.
  throw_error(error.status(),
              std::string(error.what()) + " (the pass had failed already: " +
                  (failure->local ? "" : "on rank " + std::to_string(failure->origin) + ": ") +
                  failure->what + ")");
}

void MultiNodeChainList::throw_failure(const Failure &failure, const char *call) const {
  if (failure.local) std::rethrow_exception(failure.local);
  throw RemoteError(std::string("MultiNodeChainList::") + call + ": the pass failed on rank " +
                    std::to_string(failure.origin) + ": " + failure.what);
}

Tensor MultiNodeChainList::forward(const Tensor &x) {
  ++pass_;
  backward_ready_ = false;  // until this forward returns
  std::optional<Failure> failure;
  Tensor result;
  // A failure stops the links, never the messages: every send and receive of the pass still
  // happens, with markers in place of the tensors this rank would have sent.
  try {
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      Entry &entry = entries_[k];
      Tensor input =
          receive_sum(Direction::kForward, entry.rank_in, k, failure, &entry.spare_input);
      Tensor y;
      if (!failure) {
        try {
          y = entry.link->forward(entry.rank_in.empty() ? x : input);
        } catch (...) {
          failure = Failure{comm_->rank(),
                            "link " + std::to_string(k) + " (" + entry.link->name() +
                                ") forward: " + describe(std::current_exception()),
                            std::current_exception()};
        }
      }
      if (!input.data.empty()) entry.spare_input = std::move(input);  // its memory, next pass
      if (entry.rank_out.empty()) {
        if (!failure) result = std::move(y);
      }
      send_all(Direction::kForward, y, entry.rank_out, failure);
    }
    if (failure && backward_follows_) run_backward_with_markers(*failure);
  } catch (const Error &e) {
    rethrow_with_failure(e, failure);
  }
  if (failure) throw_failure(*failure, "forward");
  backward_ready_ = true;
  return result;
}

Tensor MultiNodeChainList::backward(const Tensor &grad) {
  if (!backward_ready_) {
    throw InvalidArgument(
        "MultiNodeChainList::backward: no forward to go back through (the last one failed, or "
        "went back already, or none was made); the peers were not waited for");
  }
  backward_ready_ = false;
  std::optional<Failure> failure;
  Tensor grad_x;
  try {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      const std::size_t k = static_cast<std::size_t>(entries_.rend() - it) - 1;
      Tensor grad_y = receive_sum(Direction::kBackward, it->rank_out, k, failure, &it->spare_grad);
      Tensor grad_in;
      if (!failure) {
        try {
          grad_in = it->link->backward(it->rank_out.empty() ? grad : grad_y);
          if (it->rank_in.empty() && !grad_x.empty() && !grad_in.empty() &&
              grad_in.shape != grad_x.shape) {
            throw InvalidArgument(
                "MultiNodeChainList::backward: input gradients of different shapes, " +
                grad_x.shape_string() + " and " + grad_in.shape_string());
          }
        } catch (...) {
          failure = Failure{comm_->rank(),
                            "link " + std::to_string(k) + " (" + it->link->name() +
                                ") backward: " + describe(std::current_exception()),
                            std::current_exception()};
        }
      }
      if (!grad_y.data.empty()) it->spare_grad = std::move(grad_y);  // its memory, next pass
      send_all(Direction::kBackward, grad_in, it->rank_in, failure);
      if (it->rank_in.empty() && !failure) {
        if (grad_x.empty()) {
          grad_x = std::move(grad_in);
        } else if (!grad_in.empty()) {
          for (std::size_t i = 0; i < grad_x.data.size(); ++i) grad_x.data[i] += grad_in.data[i];
        }
      }
    }
  } catch (const Error &e) {
    rethrow_with_failure(e, failure);
  }
  if (failure) throw_failure(*failure, "backward");
  return grad_x;
}

std::vector<Parameter *> MultiNodeChainList::parameters() {
  std::vector<Parameter *> all;
  for (auto &entry : entries_) {
    for (Parameter *p : entry.link->parameters()) all.push_back(p);
  }
  return all;
}

}  // namespace mncl

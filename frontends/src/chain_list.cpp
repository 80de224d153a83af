#include "mncl/frontends/chain_list.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

namespace mncl {

namespace {
// Shape header: the number of dimensions, then up to kMaxDims sizes.
constexpr std::size_t kMaxDims = 7;

// A chain message's header, int64 words; the tensor's data, or the failure's text, follows.
enum ChainWord : std::size_t {
  kWordDirection,  // MultiNodeChainList::Direction: an activation or a gradient
  kWordPass,       // the sender's pass number
  kWordFailed,     // 1: a failure marker, no tensor
  kWordLength,     // the tensor's dimensions, or the failure text's bytes
  kWordOrigin,     // a marker's rank where the failure began
  kWordShape,      // the tensor's sizes (kMaxDims words)
  kChainHeaderWords = kWordShape + kMaxDims
};
using ChainHeader = std::array<int64_t, kChainHeaderWords>;
// A failure's text travels cut to this many bytes.
constexpr std::size_t kMaxFailureText = 1024;

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
  entries_.push_back({std::move(link), std::move(rank_in.ranks), std::move(rank_out.ranks)});
}

MultiNodeChainList::Received MultiNodeChainList::receive(Direction direction, int peer) {
  ChainHeader header{};
  comm_->recv(header, peer);
  while (header[kWordFailed] != 0 &&
         header[kWordDirection] == static_cast<int64_t>(Direction::kBackward) &&
         header[kWordPass] < pass_) {
    // A failed forward's marker for an earlier pass's backward that never came (a rank that
    // said a backward follows, then made a forward-only pass): dropped, with its text.
    if (header[kWordLength] > 0 && header[kWordLength] <= static_cast<int64_t>(kMaxFailureText)) {
      std::string text(static_cast<std::size_t>(header[kWordLength]), '\0');
      comm_->recv(Span<char>(text.data(), text.size()), peer);
    }
    comm_->recv(header, peer);
  }
  const std::string from = "MultiNodeChainList: rank " + std::to_string(peer);
  Received received;
  const int64_t length = header[kWordLength];
  // A well-formed message is received whole before it is judged, so nothing of it is left to
  // pair with the next receive.
  if (header[kWordFailed] != 0) {
    if (length < 0 || length > static_cast<int64_t>(kMaxFailureText)) {
      throw RemoteError(from + " sent a failure marker of " + std::to_string(length) + " bytes");
    }
    std::string text(static_cast<std::size_t>(length), '\0');
    if (length > 0) comm_->recv(Span<char>(text.data(), text.size()), peer);
    received.failure = Failure{static_cast<int>(header[kWordOrigin]), std::move(text), nullptr};
  } else {
    if (length < 0 || length > static_cast<int64_t>(kMaxDims)) {
      throw RemoteError(from + " sent a tensor with " + std::to_string(length) + " dimensions");
    }
    try {
      received.tensor = Tensor(
          std::vector<int64_t>(header.begin() + kWordShape, header.begin() + kWordShape + length));
    } catch (const InvalidArgument &e) {  // a shape no tensor can have: the peer is broken
      throw RemoteError(from + " sent a bad shape: " + e.what());
    }
    if (!received.tensor.data.empty()) comm_->recv(received.tensor.data, peer);
  }
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
  return received;
}

Tensor MultiNodeChainList::receive_sum(Direction direction, const std::vector<int> &peers,
                                       std::size_t link, std::optional<Failure> &failure) {
  Tensor sum;
  std::size_t first = peers.size();  // the peer whose tensor `sum` started from
  for (std::size_t i = 0; i < peers.size(); ++i) {
    Received received = receive(direction, peers[i]);  // every one, whatever came before
    if (received.failure) {
      if (!failure) failure = std::move(received.failure);
    } else if (!failure) {
      if (direction == Direction::kBackward && received.tensor.empty()) {
        continue;  // a branch that computes no input gradient: zero
      }
      if (first == peers.size()) {
        first = i;
        sum = std::move(received.tensor);
      } else if (received.tensor.shape != sum.shape) {
        const std::string what =
            std::string("MultiNodeChainList::") +
            (direction == Direction::kForward ? "forward" : "backward") + ": link " +
            std::to_string(link) + " sums the " + direction_name(static_cast<int64_t>(direction)) +
            "s of ranks " + std::to_string(peers[0]) + " and " + std::to_string(peers[i]) +
            ", of shapes " + sum.shape_string() + " and " + received.tensor.shape_string();
        failure = Failure{comm_->rank(), what, std::make_exception_ptr(InvalidArgument(what))};
      } else {
        for (std::size_t k = 0; k < sum.data.size(); ++k) sum.data[k] += received.tensor.data[k];
      }
    }
  }
  return sum;
}

void MultiNodeChainList::send(Direction direction, const Tensor &tensor, int peer,
                              std::optional<Failure> &failure) {
  ChainHeader header{};
  header[kWordDirection] = static_cast<int64_t>(direction);
  header[kWordPass] = pass_;
  if (!failure) {  // checked before anything travels: a marker goes instead
    std::string problem;
    if (tensor.shape.size() > kMaxDims) {
      problem = std::to_string(tensor.shape.size()) + " dimensions; at most " +
                std::to_string(kMaxDims) + " travel";
    } else if (tensor.data.size() != Tensor::element_count(tensor.shape)) {
      problem = "a tensor of shape " + tensor.shape_string() + " holds " +
                std::to_string(tensor.data.size()) + " elements";
    }
    if (!problem.empty()) {
      const std::string what = std::string("MultiNodeChainList::") +
                               (direction == Direction::kForward ? "forward" : "backward") +
                               ": the " + direction_name(header[kWordDirection]) + " for rank " +
                               std::to_string(peer) + " cannot travel: " + problem;
      failure = Failure{comm_->rank(), what, std::make_exception_ptr(InvalidArgument(what))};
    }
  }
  if (failure) {
    const std::string text = failure->what.substr(0, kMaxFailureText);
    header[kWordFailed] = 1;
    header[kWordLength] = static_cast<int64_t>(text.size());
    header[kWordOrigin] = failure->origin;
    comm_->send(header, peer);
    if (!text.empty()) comm_->send(Span<const char>(text.data(), text.size()), peer);
    return;
  }
  header[kWordLength] = static_cast<int64_t>(tensor.shape.size());
  std::copy(tensor.shape.begin(), tensor.shape.end(), header.begin() + kWordShape);
  comm_->send(header, peer);
  if (!tensor.data.empty()) comm_->send(tensor.data, peer);
}

void MultiNodeChainList::run_backward_with_markers(const Failure &failure) {
  std::optional<Failure> marker = failure;
  // As backward(): everything in the reverse of the forward's order.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    for (auto peer = it->rank_out.rbegin(); peer != it->rank_out.rend(); ++peer) {
      receive(Direction::kBackward, *peer);  // whatever it is: dropped
    }
    for (auto peer = it->rank_in.rbegin(); peer != it->rank_in.rend(); ++peer) {
      send(Direction::kBackward, Tensor(), *peer, marker);
    }
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
      const Tensor input = receive_sum(Direction::kForward, entry.rank_in, k, failure);
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
      if (entry.rank_out.empty()) {
        if (!failure) result = std::move(y);
      }
      // A tensor that cannot travel fails the pass at its first send: markers go to the rest.
      for (int peer : entry.rank_out) send(Direction::kForward, y, peer, failure);
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
      // The reverse of the forward's order, within the lists too, so that a backward completes
      // wherever its forward did (skip connection 0 -> {1, 2}, 1 -> 2: in list order, rank 0
      // waited for 1's gradient, 1 for 2's, and 2 to send its own to rank 0).
      const std::vector<int> gradient_sources(it->rank_out.rbegin(), it->rank_out.rend());
      const Tensor grad_y = receive_sum(Direction::kBackward, gradient_sources, k, failure);
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
      for (auto peer = it->rank_in.rbegin(); peer != it->rank_in.rend(); ++peer) {
        send(Direction::kBackward, grad_in, *peer, failure);
      }
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

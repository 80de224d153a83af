#include "mncl/frontends/chain_list.hpp"

#include <algorithm>
#include <array>
#include <string>

namespace mncl {

namespace {
// Shape header: the number of dimensions, then up to kMaxDims sizes.
constexpr std::size_t kMaxDims = 7;
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

void MultiNodeChainList::add_link(std::shared_ptr<Link> link, std::optional<int> rank_in,
                                  std::optional<int> rank_out) {
  if (!link) throw InvalidArgument("MultiNodeChainList::add_link: null link");
  for (const auto &rank : {rank_in, rank_out}) {
    if (rank && (*rank < 0 || *rank >= comm_->size() || *rank == comm_->rank())) {
      throw InvalidArgument("MultiNodeChainList::add_link: rank " + std::to_string(*rank) +
                            " is not another rank of a communicator of size " +
                            std::to_string(comm_->size()));
    }
  }
  // As ChainerMN: one output per rank. forward() could return only one of two, and backward()
  // would feed the loss gradient to both (a silently wrong input and parameter gradient).
  const auto output = std::find_if(entries_.begin(), entries_.end(),
                                   [](const Entry &entry) { return !entry.rank_out; });
  if (!rank_out && output != entries_.end()) {
    throw InvalidArgument(
        "MultiNodeChainList::add_link: this rank already has a link without rank_out (link " +
        std::to_string(output - entries_.begin()) +
        "), whose output forward() returns; a rank has one output (combine the two links into "
        "one, e.g. a Sequential, or send one's output to another rank)");
  }
  entries_.push_back({std::move(link), rank_in, rank_out});
}

Tensor MultiNodeChainList::forward(const Tensor &x) {
  Tensor result;
  for (auto &entry : entries_) {
    Tensor y = entry.link->forward(entry.rank_in ? recv_tensor(*comm_, *entry.rank_in) : x);
    if (entry.rank_out) {
      send_tensor(*comm_, y, *entry.rank_out);
    } else {
      result = std::move(y);
    }
  }
  return result;
}

Tensor MultiNodeChainList::backward(const Tensor &grad) {
  Tensor grad_x;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    Tensor grad_in = it->link->backward(it->rank_out ? recv_tensor(*comm_, *it->rank_out) : grad);
    if (it->rank_in) {
      send_tensor(*comm_, grad_in, *it->rank_in);
    } else if (grad_x.empty()) {
      grad_x = std::move(grad_in);
    } else if (!grad_in.empty()) {
      if (grad_in.shape != grad_x.shape) {
        throw InvalidArgument("MultiNodeChainList::backward: input gradients of different shapes");
      }
      for (std::size_t k = 0; k < grad_x.data.size(); ++k) grad_x.data[k] += grad_in.data[k];
    }
  }
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

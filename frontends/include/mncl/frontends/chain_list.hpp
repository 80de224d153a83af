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
#ifndef MNCL_FRONTENDS_CHAIN_LIST_HPP
#define MNCL_FRONTENDS_CHAIN_LIST_HPP

#include <memory>
#include <optional>
#include <vector>

#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/links.hpp"

namespace mncl {

// Sends a tensor's shape, then its data (point to point).
void send_tensor(Communicator &comm, const Tensor &tensor, int peer);
Tensor recv_tensor(Communicator &comm, int peer);

class MultiNodeChainList {
 public:
  // `comm` must outlive the chain list.
  explicit MultiNodeChainList(Communicator &comm) : comm_(&comm) {}

  void add_link(std::shared_ptr<Link> link, std::optional<int> rank_in = std::nullopt,
                std::optional<int> rank_out = std::nullopt);

  // The output of the local link without rank_out (an empty tensor if there is none).
  Tensor forward(const Tensor &x);
  // grad: the loss gradient w.r.t. forward()'s result (ignored if that was empty). Returns the
  // gradient w.r.t. x, summed over the links that took x (empty if none did, or if they do not
  // compute input gradients).
  Tensor backward(const Tensor &grad);

  std::vector<Parameter *> parameters();
  std::size_t size() const noexcept { return entries_.size(); }

 private:
  struct Entry {
    std::shared_ptr<Link> link;
    std::optional<int> rank_in, rank_out;
  };
  Communicator *comm_;
  std::vector<Entry> entries_;
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_CHAIN_LIST_HPP

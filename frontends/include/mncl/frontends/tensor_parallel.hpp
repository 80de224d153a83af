// Tensor (intra-layer) model parallelism, as Megatron-LM splits a transformer's MLP: one dense
// layer's weight matrix cut across the ranks of a model-parallel group, so a layer too large
// for one rank (or too slow) runs on several. ChainerMN's differentiable collectives
// (chainermn.functions.allgather, ...) are the same idea; MultiNodeChainList (chain_list.hpp)
// is the other kind of model parallelism, whole links placed on different ranks.
//
//   // the MLP block x -> Dense(d, 4d) -> ReLU -> Dense(4d, d), split over `group`:
//   mncl::Sequential block;
//   block.emplace<mncl::ColumnParallelDense>(d, 4 * d, group, seed1, mncl::ColumnParallelOptions{
//                                                /*gather_output*/ false});
//   block.emplace<mncl::ReLU>();
//   block.emplace<mncl::RowParallelDense>(4 * d, d, group, seed2);   // input_is_parallel
//   y = block.forward(x);   // every rank passes the same x and gets the same y
//
// Activations are {rows..., features}: every dimension but the last is a row. Every rank of the
// group passes the same (replicated) input to a column-parallel layer; between the two layers
// each rank holds its own slice of the 4d features; the row-parallel layer's output is the sum
// of the ranks' partial products, replicated again. That is two allreduces per block and step
// (one in forward, one in backward) and no weight ever moves.
//
// The four collectives are links of their own, each the other's adjoint in backward:
//   CopyToTensorParallel      forward: identity             backward: allreduce (sum)
//   ReduceFromTensorParallel  forward: allreduce (sum)      backward: identity
//   GatherFromTensorParallel  forward: allgather features   backward: this rank's slice
//   ScatterToTensorParallel   forward: this rank's slice    backward: allgather features
// Rank r's slice of F features is shard_range(F, size, r, false) (dataset.hpp): contiguous, in
// rank order, sizes differing by at most one, so no size has to divide anything.
//
// Weights: ColumnParallelDense(in, out, group, seed) holds columns [c0, c1) of the weight and
// bias of Dense(in, out, seed), RowParallelDense rows [r0, r1) of the weight and the whole bias
// (replicated: every rank computes the same bias gradient and keeps the same copy). So a
// parallel model starts exactly where its one-process twin starts, and its forward, backward
// and parameter gradients equal the twin's up to the order of float sums (exactly, with
// integer-valued data). For hybrid training, average the gradients over the data-parallel
// group only (split_hybrid, hybrid.hpp): each rank's shards are its own parameters.
//
// Failures end alike. Every forward and backward here, also those that move no data, first
// exchanges each rank's [failed, rows, features, shape] in one small allgather (40 bytes per
// rank): a rank whose tensor is wrong throws InvalidArgument naming the problem and every other
// rank RemoteError naming that rank; ranks whose tensors disagree (a batch of 4 here, 5 there,
// a replicated input of different widths, slices that are not one split; dense layers built
// with other sizes or options, whose digest rides with the shape) all throw InvalidArgument
// with the same message. No rank waits in, or reads past, a collective the
// others never enter, whichever layer of a model the bad tensor reaches first. The price: four
// small allgathers per block and step beside the two allreduces (mncl-tp-bench measures it). A
// group of one rank communicates nothing.
#ifndef MNCL_FRONTENDS_TENSOR_PARALLEL_HPP
#define MNCL_FRONTENDS_TENSOR_PARALLEL_HPP

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/dataset.hpp"
#include "mncl/frontends/links.hpp"

namespace mncl {

// The features of a tensor-parallel slice on one rank: [begin, end) of `total`.
ShardRange feature_shard(int64_t total, const Communicator &group);

// forward: y = x; backward: the sum of every rank's gradient (x was used by every rank).
class CopyToTensorParallel : public Link {
 public:
  explicit CopyToTensorParallel(Communicator &group) : group_(&group) {}
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::string name() const override { return "CopyToTensorParallel"; }

 private:
  Communicator *group_;
  std::vector<int64_t> shape_;
};

// forward: y = the sum of every rank's x; backward: dy as it is (replicated).
class ReduceFromTensorParallel : public Link {
 public:
  explicit ReduceFromTensorParallel(Communicator &group) : group_(&group) {}
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::string name() const override { return "ReduceFromTensorParallel"; }

 private:
  Communicator *group_;
  std::vector<int64_t> shape_;
};

// forward: every rank's features side by side, in rank order (rank r's x may have any number
// of features, zero included); backward: this rank's columns of dy.
class GatherFromTensorParallel : public Link {
 public:
  explicit GatherFromTensorParallel(Communicator &group) : group_(&group) {}
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::string name() const override { return "GatherFromTensorParallel"; }

 private:
  Communicator *group_;
  std::vector<int64_t> output_shape_;
  int64_t begin_ = 0, end_ = 0;  // this rank's columns of the output
};

// forward: this rank's feature_shard of x (x replicated); backward: every rank's gradient
// slices side by side (the gradient of the whole x).
class ScatterToTensorParallel : public Link {
 public:
  explicit ScatterToTensorParallel(Communicator &group) : group_(&group) {}
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::string name() const override { return "ScatterToTensorParallel"; }

 private:
  Communicator *group_;
  std::vector<int64_t> input_shape_;
  int64_t begin_ = 0, end_ = 0;
};

struct ColumnParallelOptions {
  // true: forward returns all `out` features on every rank (an allgather); false: this rank's
  // slice, for a RowParallelDense with input_is_parallel to take.
  bool gather_output = true;
  // false skips dL/dx and its allreduce (the first layer of a network).
  bool compute_input_grad = true;
};

// y = x W + b with W's and b's columns split over the group: rank r computes the features
// feature_shard(out, group). x is {batch, in}, the same on every rank. Needs out >= group size.
class ColumnParallelDense : public Link {
 public:
  ColumnParallelDense(int64_t in_features, int64_t out_features, Communicator &group, uint64_t seed,
                      ColumnParallelOptions options = {});
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::vector<Parameter *> parameters() override { return local_->parameters(); }
  std::string name() const override;

  ShardRange columns() const noexcept { return columns_; }
  Parameter &weight() { return local_->weight(); }  // {in, columns().size()}
  Parameter &bias() { return local_->bias(); }      // columns().size()

 private:
  Communicator *group_;
  int64_t in_, out_;
  ColumnParallelOptions options_;
  ShardRange columns_;
  std::unique_ptr<Dense> local_;  // this rank's columns
  bool forward_done_ = false;     // the last forward succeeded (local_ caches its input)
  int64_t batch_ = 0;             // its rows
};

struct RowParallelOptions {
  // true: x is this rank's slice of the in features (a ColumnParallelDense's output without
  // gather); false: x holds all of them, replicated, and the layer takes its slice.
  bool input_is_parallel = true;
  bool compute_input_grad = true;
};

// y = sum over ranks of x_r W_r, + b: W's rows split over the group (rank r holds rows
// feature_shard(in, group)), b replicated; y {batch, out}, the same on every rank. Needs
// in >= group size.
class RowParallelDense : public Link {
 public:
  RowParallelDense(int64_t in_features, int64_t out_features, Communicator &group, uint64_t seed,
                   RowParallelOptions options = {});
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::vector<Parameter *> parameters() override { return {&local_->weight(), &bias_}; }
  std::string name() const override;

  ShardRange rows() const noexcept { return rows_; }
  Parameter &weight() { return local_->weight(); }  // {rows().size(), out}
  Parameter &bias() { return bias_; }               // out, the same on every rank

 private:
  Communicator *group_;
  int64_t in_, out_;
  RowParallelOptions options_;
  ShardRange rows_;
  std::unique_ptr<Dense> local_;  // this rank's rows; its own bias stays zero, not a parameter
  Parameter bias_;
  bool forward_done_ = false;
  int64_t batch_ = 0;
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_TENSOR_PARALLEL_HPP

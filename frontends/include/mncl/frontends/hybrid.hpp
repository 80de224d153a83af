// Hybrid parallelism: the world split into data-parallel x model-parallel groups, e.g. 4 ranks =
// 2 replicas x 2 pipeline stages.
//
//   auto groups = mncl::split_hybrid(world, /*model_parallel_size*/ 2);
//   mncl::MultiNodeChainList chain(groups.model_parallel);   // the pipeline of my replica
//   ... add my stage's links (stage groups.stage) ...
//   mncl::MultiNodeOptimizer<mncl::Adam> opt(adam, groups.data_parallel);  // my stage's copies
//
// World rank r sits at replica r / M, stage r % M (M = model_parallel_size): a replica's stages
// are neighbouring ranks, which on real clusters puts the chatty activation traffic inside a
// node and the gradient allreduce across nodes. The data-parallel group of a rank holds the
// same stage of every replica (world ranks stage, stage + M, stage + 2M, ...), ordered by
// replica, so an optimizer on it averages only the copies of the same parameters.
#ifndef MNCL_FRONTENDS_HYBRID_HPP
#define MNCL_FRONTENDS_HYBRID_HPP

#include <string>
#include <utility>
#include <vector>

#include "mncl/frontends/communicator.hpp"

namespace mncl {

// Where a world rank sits in a replicas x stages grid (pure arithmetic).
struct HybridCoordinates {
  int replica = 0;   // index of its data-parallel replica: 0 .. replicas-1
  int stage = 0;     // its model-parallel stage: 0 .. model_parallel_size-1
  int replicas = 1;  // data-parallel size
  int stages = 1;    // model-parallel size
};

inline HybridCoordinates hybrid_coordinates(int world_rank, int world_size,
                                            int model_parallel_size) {
  if (model_parallel_size <= 0 || world_size <= 0 || world_size % model_parallel_size != 0) {
    throw InvalidArgument("hybrid: " + std::to_string(world_size) +
                          " ranks do not split into model-parallel groups of " +
                          std::to_string(model_parallel_size));
  }
  if (world_rank < 0 || world_rank >= world_size) {
    throw InvalidArgument("hybrid: rank " + std::to_string(world_rank) + " out of range");
  }
  return {world_rank / model_parallel_size, world_rank % model_parallel_size,
          world_size / model_parallel_size, model_parallel_size};
}

// World ranks of a group (for logs and tests).
inline std::vector<int> data_parallel_members(const HybridCoordinates &c) {
  std::vector<int> ranks;
  for (int r = 0; r < c.replicas; ++r) ranks.push_back(r * c.stages + c.stage);
  return ranks;
}
inline std::vector<int> model_parallel_members(const HybridCoordinates &c) {
  std::vector<int> ranks;
  for (int s = 0; s < c.stages; ++s) ranks.push_back(c.replica * c.stages + s);
  return ranks;
}

struct HybridGroups {
  HybridCoordinates coords;
  // The same stage of every replica; rank in it == coords.replica. Gradients average here.
  Communicator data_parallel;
  // The stages of this replica; rank in it == coords.stage. Activations travel here.
  Communicator model_parallel;
};

// Collective over `world`: both splits, in the same order on every rank.
inline HybridGroups split_hybrid(Communicator &world, int model_parallel_size) {
  // (Communicator's default constructor would join the world, so no default-built groups.)
  const HybridCoordinates c = hybrid_coordinates(world.rank(), world.size(), model_parallel_size);
  Communicator data_parallel = world.split(c.stage, c.replica);
  Communicator model_parallel = world.split(c.replica, c.stage);
  return HybridGroups{c, std::move(data_parallel), std::move(model_parallel)};
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_HYBRID_HPP

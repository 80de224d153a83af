// The collectives mncl-perf measures: names, nccl-tests size conventions, bandwidth factors,
// buffer layouts (out-of-place and in-place) and the MNCL call for each.
#pragma once

#include <mncl/mncl.h>

#include <cstddef>
#include <string>
#include <vector>

namespace mncl::perf {

enum class CollKind {
  kAllreduce,
  kReduce,
  kBcast,
  kScatter,
  kGather,
  kAllgather,
  kReduceScatter,
  kAlltoall,
  kSendrecv,
  kAllgatherv,
  kAlltoallv,
  kGatherv,
  kScatterv,
};

struct CollSpec {
  CollKind kind;
  const char *name;  // as on the command line and in the outputs
  bool reduces;      // takes an operator
  bool rooted;       // takes a root
  bool has_inplace;  // an in-place form distinct from out-of-place exists
};

const std::vector<CollSpec> &all_collectives();
const CollSpec &spec_of(CollKind kind);
// Accepts the names above plus "broadcast", "reducescatter", "all" handled by the caller.
bool coll_from_name(const std::string &name, CollKind *kind);

// busbw = algbw * factor (the nccl-tests factors, see bench/perf/README.md).
double busbw_factor(CollKind kind, int nranks);
// Lower bound on the memory traffic (bytes read + written, all ranks together) of one call,
// in units of the reported size: the intra-node limit is algbw <= B_mem / traffic_factor.
double traffic_factor(CollKind kind, int nranks);

// Block counts of the v collectives (allgatherv, alltoallv, gatherv, scatterv), in elements,
// deterministic so that every rank knows every other rank's counts. `per` is the mean block (the
// nccl-tests count of allgather / alltoall / gather / scatter at the same size). Blocks alternate
// 50 % and 150 % of the mean (per/2 rounded down, then 2*per minus that); with an odd number of
// ranks the last block is the mean itself, so the n blocks add up to n*per exactly. per == 1 gives
// empty blocks (0 and 2 elements).
size_t v_block(size_t per, int nranks, int index);
// alltoallv: the elements rank `from` sends to rank `to`, v_block of (from + to) mod n. Every
// rank then sends and receives n*per elements in all, and the pairs' counts differ.
size_t v_pair(size_t per, int nranks, int from, int to);

// Buffer sizes for one reported size, in elements, following nccl-tests: `size` is the
// largest per-rank buffer in bytes, `count` the element count passed to the call.
struct Layout {
  size_t count = 0;       // the `count` argument of the call (per-rank block for the /n kinds;
                          // the mean block for the v collectives)
  size_t send_elems = 0;  // elements of the send buffer on a rank that sends everything
  size_t recv_elems = 0;  // elements of the receive buffer on a rank that receives everything
  size_t bytes = 0;       // the reported size
};
Layout layout_for(CollKind kind, size_t bytes, size_t elem_size, int nranks);

// One call's arguments, with in-place pointers already resolved.
struct Call {
  CollKind kind;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  mncl_dtype_t dtype;
  mncl_op_t op;
  int root;
  int rank;
  int nranks;
  bool inplace;
  // Packed counts and displacements (elements) of the v collectives: allgatherv fills recvcounts
  // and rdispls (the same on every rank; count is recvcounts[rank]); alltoallv all four, this
  // rank's row and column of v_pair. gatherv fills recvcounts and rdispls, scatterv sendcounts
  // and sdispls: the root's arrays, computed on every rank (every rank verifies with them and
  // decides the same on the raw baseline's int limits) but passed to the call by the root only,
  // the others pass NULL as mncl.h allows; count is this rank's block (gatherv's sendcount,
  // scatterv's recvcount).
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;
};

// Points sendbuf/recvbuf into the two allocations for the given placement (see mncl.h for the
// in-place forms). `send`/`recv` each hold at least max(send_elems, recv_elems) elements.
Call make_call(CollKind kind, const Layout &l, bool inplace, void *send, void *recv,
               size_t elem_size, mncl_dtype_t dtype, mncl_op_t op, int root, int rank, int nranks);

// Runs one call through MNCL. Returns the status; the message is in mncl_last_error().
mncl_status_t run_mncl(mncl_comm_t comm, const Call &c);

}  // namespace mncl::perf

// Argument validation for every collective, run before any plugin sees the call: enums,
// counts whose byte size overflows, roots and peers, NULL buffers, and the in-place rules of
// mncl.h (any other overlap of send and receive buffers is refused).
#pragma once

#include <mncl/mncl_plugin.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mncl::core {

// Name of the public function for a kind ("mncl_allreduce").
const char *coll_function_name(int kind);
// Short name for logs and messages ("allreduce").
const char *coll_kind_name(int kind);
// An operation in messages: name (a kind's or function's) and sequence number, "allreduce #12";
// a batch has no sequence number of its own (each op has one per peer and direction): name only.
std::string op_label(const char *name, int kind, uint64_t seq);
// This rank's payload in bytes (count x dtype size; the sum over buffers when coalesced).
size_t coll_bytes(const mncl_coll_v1_t &coll);

// Throws mncl::Error(MNCL_ERR_INVALID_ARGUMENT or MNCL_ERR_NOT_SUPPORTED) naming the function
// and what was wrong. `backend` supplies the capability masks.
void validate_collective(const mncl_coll_v1_t &coll, int rank, int size,
                         const mncl_plugin_v5_t &backend);

// The ops of a batch (mncl_sendrecv_batch; kinds MNCL_COLL_SEND/RECV), before any starts: kinds,
// peers, dtypes, counts, NULL buffers, and receive buffers that overlap another buffer of the
// batch. Messages name `fn` and the op's index.
void validate_batch(const char *fn, const mncl_p2p_v4_t *ops, size_t n, int rank, int size,
                    const mncl_plugin_v5_t &backend);

// gatherv / scatterv (mncl.h, MNCL_1.3) in the caller's terms: `counts`/`displs` are the root's
// (gatherv: recvcounts; scatterv: sendcounts), `count` every rank's own (gatherv: sendcount;
// scatterv: recvcount).
struct RootedV {
  bool gather = true;  // gatherv, else scatterv
  const void *sendbuf = nullptr;
  void *recvbuf = nullptr;
  size_t count = 0;
  const size_t *counts = nullptr, *displs = nullptr;
  int32_t dtype = 0;
  int root = 0;
};
// Checks every fact this rank can (root, dtype, the root's blocks, NULL buffers, the in-place
// form, that `backend` runs gatherv/scatterv natively or has alltoallv), naming `fn`. Returns
// whether the call is the root's in-place form.
bool check_rooted_v(const char *fn, const RootedV &call, int rank, int size,
                    const mncl_plugin_v5_t &backend);
// What a rooted v-collective runs as on a backend without the plugin ABI v5 kinds: an alltoallv in
// which only pairs with the root carry data. `packed` holds sendcounts, sdispls, recvcounts,
// rdispls (mncl_plugin_v3.h's layout).
struct AlltoallvForm {
  std::vector<size_t> packed;
  const void *sendbuf = nullptr;
  void *recvbuf = nullptr;
};
// check_rooted_v, then that `backend` has alltoallv; returns the alltoallv to run.
AlltoallvForm rooted_v_as_alltoallv(const char *fn, const RootedV &call, int rank, int size,
                                    const mncl_plugin_v5_t &backend);

}  // namespace mncl::core

// Which buffers a collective touches on one rank, with the extents of mncl.h. Shared by the
// nccl plugin (host buffers through device scratch memory) and the core's CUDA staging
// (device buffers through pinned host memory), which both swap buffers for stand-ins.
#pragma once

#include <mncl/mncl_plugin.h>

#include <cstddef>

#include "common/coll.h"
#include "common/dtype.h"

namespace mncl::kit {

// Index of a pointer in a descriptor: 0 sendbuf, 1 recvbuf, coalesced 2+2i sendbufs[i] and
// 3+2i recvbufs[i]; a batch's op i is 2+2i when it sends and 3+2i when it receives.
constexpr size_t kSend = 0, kRecv = 1;

// Calls f(index, ptr, bytes, in, out) for every buffer this rank reads (in) or writes (out),
// with the extents of mncl.h; buffers the call ignores on this rank are not visited.
template <typename F>
void for_each_buffer(const mncl_coll_v1_t &c, int rank, int size, F &&f) {
  const size_t es = kit::dtype_size(c.dtype), n = c.count * es;
  const size_t all = n * static_cast<size_t>(size);
  const bool root = rank == c.root;
  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
      f(kSend, c.sendbuf, n, true, false);
      f(kRecv, c.recvbuf, n, false, true);
      break;
    case MNCL_COLL_REDUCE:
      f(kSend, c.sendbuf, n, true, false);
      if (root) f(kRecv, c.recvbuf, n, false, true);
      break;
    case MNCL_COLL_BCAST:
      f(kSend, c.sendbuf, n, false, false);
      f(kRecv, c.recvbuf, n, root, !root);
      break;
    case MNCL_COLL_SCATTER:
      if (root) f(kSend, c.sendbuf, all, true, false);
      f(kRecv, c.recvbuf, n, false, true);
      break;
    case MNCL_COLL_GATHER:
      f(kSend, c.sendbuf, n, true, false);
      if (root) f(kRecv, c.recvbuf, all, false, true);
      break;
    case MNCL_COLL_ALLGATHER:
      f(kSend, c.sendbuf, n, true, false);
      f(kRecv, c.recvbuf, all, false, true);
      break;
    case MNCL_COLL_REDUCE_SCATTER:
      f(kSend, c.sendbuf, all, true, false);
      f(kRecv, c.recvbuf, n, false, true);
      break;
    case MNCL_COLL_ALLTOALL:
      f(kSend, c.sendbuf, all, true, false);
      f(kRecv, c.recvbuf, all, false, true);
      break;
    case MNCL_COLL_SEND:
      f(kSend, c.sendbuf, n, true, false);
      break;
    case MNCL_COLL_RECV:
      f(kRecv, c.recvbuf, n, false, true);
      break;
    case MNCL_COLL_ALLREDUCE_COALESCED:
      for (size_t i = 0; i < c.nbufs; ++i) {
        f(2 + 2 * i, c.sendbufs[i], c.counts[i] * es, true, false);
        f(3 + 2 * i, c.recvbufs[i], c.counts[i] * es, false, true);
      }
      break;
    case MNCL_COLL_ALLGATHERV: {
      // The receive extent is read too: the elements between blocks must come back unchanged
      // from a stand-in (staging copies whole extents).
      const VLayout v = v_layout(c);
      f(kSend, c.sendbuf, n, true, false);
      f(kRecv, c.recvbuf, v_extent(v.recvcounts, v.rdispls, c.nbufs) * es, true, true);
      break;
    }
    case MNCL_COLL_ALLTOALLV: {
      const VLayout v = v_layout(c);
      f(kSend, c.sendbuf, v_extent(v.sendcounts, v.sdispls, c.nbufs) * es, true, false);
      f(kRecv, c.recvbuf, v_extent(v.recvcounts, v.rdispls, c.nbufs) * es, true, true);
      break;
    }
    case MNCL_COLL_GATHERV: {
      // As allgatherv: the gaps between the root's blocks come back unchanged from a stand-in.
      f(kSend, c.sendbuf, n, true, false);
      const RootedVLayout v = rooted_v_layout(c);
      if (root && v.counts) {
        f(kRecv, c.recvbuf, v_extent(v.counts, v.displs, c.nbufs) * es, true, true);
      }
      break;
    }
    case MNCL_COLL_SCATTERV: {
      const RootedVLayout v = rooted_v_layout(c);
      if (root && v.counts) {
        f(kSend, c.sendbuf, v_extent(v.counts, v.displs, c.nbufs) * es, true, false);
      }
      f(kRecv, c.recvbuf, n, false, true);
      break;
    }
    case MNCL_COLL_SENDRECV_BATCH: {
      const mncl_p2p_v4_t *ops = p2p_ops(c);
      for (size_t i = 0; i < c.nbufs; ++i) {
        const size_t bytes = ops[i].count * kit::dtype_size(ops[i].dtype);
        const bool send = ops[i].kind == MNCL_COLL_SEND;
        f(send ? 2 + 2 * i : 3 + 2 * i, ops[i].buf, bytes, send, !send);
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace mncl::kit

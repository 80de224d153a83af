#include "collectives.h"

#include <algorithm>
#include <cstdint>

namespace mncl::perf {

const std::vector<CollSpec> &all_collectives() {
  static const std::vector<CollSpec> specs = {
      {CollKind::kAllreduce, "allreduce", true, false, true},
      {CollKind::kBcast, "bcast", false, true, false},  // one buffer: always in place
      {CollKind::kReduce, "reduce", true, true, true},
      {CollKind::kScatter, "scatter", false, true, true},
      {CollKind::kGather, "gather", false, true, true},
      {CollKind::kAllgather, "allgather", false, false, true},
      {CollKind::kReduceScatter, "reduce_scatter", true, false, true},
      {CollKind::kAlltoall, "alltoall", false, false, true},
      // In place would send and receive through one buffer at once, which mncl.h forbids.
      {CollKind::kSendrecv, "sendrecv", false, false, false},
      {CollKind::kAllgatherv, "allgatherv", false, false, true},
      // mncl.h: alltoallv is never in place.
      {CollKind::kAlltoallv, "alltoallv", false, false, false},
      // mncl.h: in place at the root (gatherv: sendbuf == recvbuf + displs[root]; scatterv:
      // recvbuf == sendbuf + displs[root]).
      {CollKind::kGatherv, "gatherv", false, true, true},
      {CollKind::kScatterv, "scatterv", false, true, true},
  };
  return specs;
}

const CollSpec &spec_of(CollKind kind) {
  for (const auto &s : all_collectives())
    if (s.kind == kind) return s;
  return all_collectives().front();  // unreachable: every kind is in the table
}

bool coll_from_name(const std::string &name, CollKind *kind) {
  for (const auto &s : all_collectives()) {
    if (name == s.name) {
      *kind = s.kind;
      return true;
    }
  }
  if (name == "broadcast") return *kind = CollKind::kBcast, true;
  if (name == "reducescatter") return *kind = CollKind::kReduceScatter, true;
  return false;
}

double busbw_factor(CollKind kind, int nranks) {
  const double n = nranks;
  switch (kind) {
    case CollKind::kAllreduce:
      return 2 * (n - 1) / n;
    case CollKind::kReduceScatter:
    case CollKind::kAllgather:
    case CollKind::kAlltoall:
    case CollKind::kAllgatherv:  // as allgather / alltoall: the swept size is the same total
    case CollKind::kAlltoallv:
    // nccl-tests (scatter.cu, gather.cu) also uses (n-1)/n: the root's own block never moves.
    case CollKind::kScatter:
    case CollKind::kGather:
    case CollKind::kScatterv:  // as scatter / gather: the swept size is the same root total
    case CollKind::kGatherv:
      return (n - 1) / n;
    case CollKind::kBcast:
    case CollKind::kReduce:
    case CollKind::kSendrecv:
      return 1;
  }
  return 1;
}

double traffic_factor(CollKind kind, int nranks) {
  const double n = nranks;
  switch (kind) {
    case CollKind::kAllreduce:  // every rank reads its input and writes its output
    case CollKind::kAlltoall:
    case CollKind::kAlltoallv:
    case CollKind::kSendrecv:
      return 2 * n;
    case CollKind::kAllgather:  // n blocks read once, n full outputs written
    case CollKind::kAllgatherv:
    case CollKind::kReduceScatter:  // n full inputs read, n blocks written
    case CollKind::kReduce:         // n inputs read, one output written
      return n + 1;
    case CollKind::kBcast:  // the root's buffer read once, n-1 copies written
      return n;
    case CollKind::kScatter:  // the root's buffer read once, every block written once
    case CollKind::kGather:
    case CollKind::kScatterv:
    case CollKind::kGatherv:
      return 2;
  }
  return 2 * n;
}

size_t v_block(size_t per, int nranks, int index) {
  if (nranks % 2 == 1 && index == nranks - 1) return per;
  const size_t lo = per / 2;
  return index % 2 == 0 ? lo : 2 * per - lo;
}

size_t v_pair(size_t per, int nranks, int from, int to) {
  return v_block(per, nranks, (from + to) % nranks);
}

Layout layout_for(CollKind kind, size_t bytes, size_t elem_size, int nranks) {
  Layout l;
  const size_t count = bytes / elem_size;
  const size_t n = static_cast<size_t>(nranks);
  switch (kind) {
    case CollKind::kAllreduce:
    case CollKind::kReduce:
    case CollKind::kBcast:
    case CollKind::kSendrecv:
      l.count = count;
      l.send_elems = l.recv_elems = count;
      break;
    case CollKind::kScatter:
    case CollKind::kReduceScatter:
      l.count = count / n;
      l.send_elems = l.count * n;
      l.recv_elems = l.count;
      break;
    case CollKind::kGather:
    case CollKind::kAllgather:
      l.count = count / n;
      l.send_elems = l.count;
      l.recv_elems = l.count * n;
      break;
    case CollKind::kAlltoall:
    case CollKind::kAlltoallv:
      l.count = count / n;
      l.send_elems = l.recv_elems = l.count * n;
      break;
    case CollKind::kAllgatherv:
    case CollKind::kGatherv:  // the root receives everything
      l.count = count / n;
      for (int q = 0; q < nranks; ++q)
        l.send_elems = std::max(l.send_elems, v_block(l.count, nranks, q));
      l.recv_elems = l.count * n;
      break;
    case CollKind::kScatterv:  // the root sends everything
      l.count = count / n;
      l.send_elems = l.count * n;
      for (int q = 0; q < nranks; ++q)
        l.recv_elems = std::max(l.recv_elems, v_block(l.count, nranks, q));
      break;
  }
  l.bytes = std::max(l.send_elems, l.recv_elems) * elem_size;
  return l;
}

Call make_call(CollKind kind, const Layout &l, bool inplace, void *send, void *recv,
               size_t elem_size, mncl_dtype_t dtype, mncl_op_t op, int root, int rank, int nranks) {
  Call c{kind, send, recv, l.count, dtype, op, root, rank, nranks, inplace, {}, {}, {}, {}};
  if (kind == CollKind::kAllgatherv || kind == CollKind::kAlltoallv) {
    // Packed: each block starts where the previous one ends.
    const bool a2a = kind == CollKind::kAlltoallv;
    size_t soff = 0, roff = 0;
    for (int q = 0; q < nranks; ++q) {
      const size_t rc = a2a ? v_pair(l.count, nranks, q, rank) : v_block(l.count, nranks, q);
      c.recvcounts.push_back(rc);
      c.rdispls.push_back(roff);
      roff += rc;
      if (!a2a) continue;
      const size_t sc = v_pair(l.count, nranks, rank, q);
      c.sendcounts.push_back(sc);
      c.sdispls.push_back(soff);
      soff += sc;
    }
    if (!a2a) c.count = c.recvcounts[static_cast<size_t>(rank)];
  } else if (kind == CollKind::kGatherv || kind == CollKind::kScatterv) {
    // The root's packed blocks, block q of v_block for rank q.
    auto &counts = kind == CollKind::kGatherv ? c.recvcounts : c.sendcounts;
    auto &displs = kind == CollKind::kGatherv ? c.rdispls : c.sdispls;
    size_t off = 0;
    for (int q = 0; q < nranks; ++q) {
      counts.push_back(v_block(l.count, nranks, q));
      displs.push_back(off);
      off += counts.back();
    }
    c.count = counts[static_cast<size_t>(rank)];
  }
  if (!inplace) return c;
  auto at = [&](void *base, size_t elems) {
    return static_cast<void *>(static_cast<char *>(base) + elems * elem_size);
  };
  const size_t block = static_cast<size_t>(rank) * l.count;
  switch (kind) {
    case CollKind::kAllreduce:
    case CollKind::kReduce:
    case CollKind::kAlltoall:
    case CollKind::kBcast:
      c.sendbuf = recv;
      break;
    case CollKind::kScatter:
      // The root's block already sits in its send buffer; other ranks have no send buffer.
      c.recvbuf = rank == root ? at(send, block) : recv;
      break;
    case CollKind::kReduceScatter:
      c.recvbuf = at(send, block);
      break;
    case CollKind::kGather:
      c.sendbuf = rank == root ? at(recv, block) : send;
      break;
    case CollKind::kAllgather:
      c.sendbuf = at(recv, block);
      break;
    case CollKind::kAllgatherv:
      c.sendbuf = at(recv, c.rdispls[static_cast<size_t>(rank)]);
      break;
    case CollKind::kGatherv:  // as gather: the root's block already sits in its receive buffer
      if (rank == root) c.sendbuf = at(recv, c.rdispls[static_cast<size_t>(root)]);
      break;
    case CollKind::kScatterv:  // as scatter: the root's block stays in its send buffer
      if (rank == root) c.recvbuf = at(send, c.sdispls[static_cast<size_t>(root)]);
      break;
    case CollKind::kSendrecv:
    case CollKind::kAlltoallv:  // no in-place form
      break;
  }
  return c;
}

mncl_status_t run_mncl(mncl_comm_t comm, const Call &c) {
  switch (c.kind) {
    case CollKind::kAllreduce:
      return mncl_allreduce(comm, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, nullptr);
    case CollKind::kReduce:
      return mncl_reduce(comm, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, c.root, nullptr);
    case CollKind::kBcast:
      return mncl_bcast(comm, c.recvbuf, c.count, c.dtype, c.root, nullptr);
    case CollKind::kScatter:
      return mncl_scatter(comm, c.sendbuf, c.recvbuf, c.count, c.dtype, c.root, nullptr);
    case CollKind::kGather:
      return mncl_gather(comm, c.sendbuf, c.recvbuf, c.count, c.dtype, c.root, nullptr);
    case CollKind::kAllgather:
      return mncl_allgather(comm, c.sendbuf, c.recvbuf, c.count, c.dtype, nullptr);
    case CollKind::kReduceScatter:
      return mncl_reduce_scatter(comm, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, nullptr);
    case CollKind::kAlltoall:
      return mncl_alltoall(comm, c.sendbuf, c.recvbuf, c.count, c.dtype, nullptr);
    case CollKind::kAllgatherv:
      return mncl_allgatherv(comm, c.sendbuf, c.count, c.recvbuf, c.recvcounts.data(),
                             c.rdispls.data(), c.dtype, nullptr);
    case CollKind::kAlltoallv:
      return mncl_alltoallv(comm, c.sendbuf, c.sendcounts.data(), c.sdispls.data(), c.recvbuf,
                            c.recvcounts.data(), c.rdispls.data(), c.dtype, nullptr);
    case CollKind::kGatherv: {
      const bool root = c.rank == c.root;  // only the root's arrays are read
      return mncl_gatherv(comm, c.sendbuf, c.count, c.recvbuf, root ? c.recvcounts.data() : nullptr,
                          root ? c.rdispls.data() : nullptr, c.dtype, c.root, nullptr);
    }
    case CollKind::kScatterv: {
      const bool root = c.rank == c.root;
      return mncl_scatterv(comm, c.sendbuf, root ? c.sendcounts.data() : nullptr,
                           root ? c.sdispls.data() : nullptr, c.recvbuf, c.count, c.dtype, c.root,
                           nullptr);
    }
    case CollKind::kSendrecv: {
      if (c.nranks == 1) return MNCL_OK;  // no peer: MNCL forbids sending to oneself
      // A ring shift, as MPI_Sendrecv: both directions in flight at once, in one call that
      // every backend (nccl too, as one NCCL group) progresses together.
      const int next = (c.rank + 1) % c.nranks, prev = (c.rank + c.nranks - 1) % c.nranks;
      return mncl_sendrecv(comm, c.sendbuf, c.count, next, c.recvbuf, c.count, prev, c.dtype,
                           nullptr);
    }
  }
  return MNCL_ERR_INVALID_ARGUMENT;
}

}  // namespace mncl::perf

// Plugin kit: one way to fill a collective descriptor (mncl_coll_v1_t), for the core's API
// entry points and for tests that drive plugins directly. Fields not named stay zero (stream,
// coalesced arrays, seq, timeout): callers set what their path needs.
#pragma once

#include <mncl/mncl_plugin.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mncl::kit {

inline mncl_coll_v1_t make_coll(int32_t kind, int32_t dtype, int32_t op, int32_t root,
                                const void *sendbuf, void *recvbuf, size_t count) {
  mncl_coll_v1_t c{};
  c.struct_size = sizeof c;
  c.kind = kind;
  c.dtype = dtype;
  c.op = op;
  c.root = root;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = count;
  return c;
}

// The per-rank arrays of a collective with a count per rank (plugin ABI v3: ALLGATHERV,
// ALLTOALLV; see mncl_plugin_v3.h for the layout of `counts`). Entries are in elements. For
// allgatherv, this rank sends `count` elements to every rank: send arrays stay NULL.
struct VLayout {
  const size_t *sendcounts = nullptr, *sdispls = nullptr;
  const size_t *recvcounts = nullptr, *rdispls = nullptr;
};
inline VLayout v_layout(const mncl_coll_v1_t &c) {
  const size_t n = c.nbufs;
  VLayout v;
  if (c.counts == nullptr) return v;
  if (c.kind == MNCL_COLL_ALLGATHERV) {
    v.recvcounts = c.counts;
    v.rdispls = c.counts + n;
  } else if (c.kind == MNCL_COLL_ALLTOALLV) {
    v.sendcounts = c.counts;
    v.sdispls = c.counts + n;
    v.recvcounts = c.counts + 2 * n;
    v.rdispls = c.counts + 3 * n;
  }
  return v;
}

// GATHERV / SCATTERV (plugin ABI v5; mncl_plugin_v5.h): the root's blocks. On the root
// `counts` holds the blocks' counts (gatherv: recvcounts; scatterv: sendcounts) and `displs`
// their displacements, in elements; on other ranks both are NULL.
struct RootedVLayout {
  const size_t *counts = nullptr, *displs = nullptr;
};
inline bool is_rooted_v_kind(int32_t kind) {
  return kind == MNCL_COLL_GATHERV || kind == MNCL_COLL_SCATTERV;
}
inline RootedVLayout rooted_v_layout(const mncl_coll_v1_t &c) {
  RootedVLayout v;
  if (!is_rooted_v_kind(c.kind) || c.counts == nullptr) return v;
  v.counts = c.counts;
  v.displs = c.counts + c.nbufs;
  return v;
}

// The elements a set of blocks spans from the buffer's start: max(displs[i] + counts[i]) over
// blocks with a count (0 if none). The core has checked that nothing overflows.
inline size_t v_extent(const size_t *counts, const size_t *displs, size_t n) {
  size_t end = 0;
  for (size_t i = 0; i < n; ++i) {
    if (counts[i] != 0 && displs[i] + counts[i] > end) end = displs[i] + counts[i];
  }
  return end;
}

// Makes c own its arrays: copies the coalesced buffers and counts, or the v kinds' counts and
// displacements, into the vectors and points c at them, so that it outlives the call whose
// caller passed them (a posted operation). The vectors must outlive c's use and stay unresized.
inline void keep_arrays(mncl_coll_v1_t &c, std::vector<const void *> &sendbufs,
                        std::vector<void *> &recvbufs, std::vector<size_t> &counts) {
  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED && c.nbufs > 0 && c.sendbufs && c.recvbufs &&
      c.counts) {
    sendbufs.assign(c.sendbufs, c.sendbufs + c.nbufs);
    recvbufs.assign(c.recvbufs, c.recvbufs + c.nbufs);
    counts.assign(c.counts, c.counts + c.nbufs);
    c.sendbufs = sendbufs.data();
    c.recvbufs = recvbufs.data();
    c.counts = counts.data();
  } else if ((c.kind == MNCL_COLL_ALLGATHERV || c.kind == MNCL_COLL_ALLTOALLV ||
              is_rooted_v_kind(c.kind)) &&
             c.counts) {
    const size_t entries = c.nbufs * (c.kind == MNCL_COLL_ALLTOALLV ? 4 : 2);
    counts.assign(c.counts, c.counts + entries);
    c.counts = counts.data();
  }
}

// Elements in all blocks: the sum of n counts.
inline size_t v_total(const size_t *counts, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += counts[i];
  return total;
}

// A 64-bit mix (splitmix64's finalizer), for digests of counts.
inline uint64_t mix64(uint64_t h, uint64_t v) {
  h = (h ^ v) + 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// A 32-bit digest of how a coalesced allreduce splits its elements into buffers (nbufs and
// every counts[i]): the total alone lets ranks that split it differently (2+3 vs 3+2) mix
// elements across buffers, so backends compare this too. Ranks that agree get equal digests.
inline uint32_t split_digest(const size_t *counts, size_t nbufs) {
  uint64_t h = mix64(0, nbufs);
  for (size_t i = 0; i < nbufs; ++i) h = mix64(h, counts[i]);
  return static_cast<uint32_t>(h ^ (h >> 32));
}

// What no rank can check alone for allgatherv / alltoallv: that the sender of each block and its
// receiver agree on its count. Each rank adds up a hash of (from, to, count) over the blocks it
// sends (sums[0]) and over those it receives (sums[1]); summed over all ranks (one allreduce),
// the two totals are equal when every pair agrees (a false match has probability about 2^-64),
// and every rank reaches the same verdict. Backends whose transport cannot tell a message of
// the wrong size from a right one (MPI, Gloo) run this before any data moves.
inline void v_pair_sums(const mncl_coll_v1_t &c, int rank, uint64_t sums[2]) {
  const VLayout v = v_layout(c);
  const uint64_t me = static_cast<uint64_t>(rank);
  const auto pair = [](uint64_t from, uint64_t to, uint64_t count) {
    return mix64(mix64(mix64(0, from), to), count);
  };
  sums[0] = sums[1] = 0;
  for (size_t j = 0; j < c.nbufs; ++j) {
    sums[0] += pair(me, j, c.kind == MNCL_COLL_ALLGATHERV ? c.count : v.sendcounts[j]);
    sums[1] += pair(j, me, v.recvcounts[j]);
  }
}

// A descriptor for a collective with a count per rank: `counts` must hold 2 * size (allgatherv:
// recvcounts, displs) or 4 * size (alltoallv: sendcounts, sdispls, recvcounts, rdispls)
// entries and outlive the descriptor's use.
inline mncl_coll_v1_t make_v_coll(int32_t kind, int32_t dtype, const void *sendbuf, void *recvbuf,
                                  size_t count, int size, const size_t *counts) {
  mncl_coll_v1_t c{};
  c.struct_size = sizeof c;
  c.kind = kind;
  c.dtype = dtype;
  c.op = -1;
  c.root = -1;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = count;
  c.nbufs = static_cast<size_t>(size);
  c.counts = counts;
  return c;
}

// A GATHERV or SCATTERV descriptor: `count` is this rank's own block; `root_arrays` holds
// 2 * size entries (counts, then displs) on the root and is NULL elsewhere; it must outlive the
// descriptor's use.
inline mncl_coll_v1_t make_rooted_v_coll(int32_t kind, int32_t dtype, const void *sendbuf,
                                         void *recvbuf, size_t count, int root, int size,
                                         const size_t *root_arrays) {
  mncl_coll_v1_t c = make_v_coll(kind, dtype, sendbuf, recvbuf, count, size, root_arrays);
  c.root = root;
  return c;
}

// The ops of a SENDRECV_BATCH (plugin ABI v4): nbufs entries at sendbuf.
inline const mncl_p2p_v4_t *p2p_ops(const mncl_coll_v1_t &c) {
  return static_cast<const mncl_p2p_v4_t *>(c.sendbuf);
}

// A SENDRECV_BATCH descriptor over n ops (the array must outlive the operation).
inline mncl_coll_v1_t make_batch_coll(const mncl_p2p_v4_t *ops, size_t n) {
  mncl_coll_v1_t c = make_coll(MNCL_COLL_SENDRECV_BATCH, -1, -1, -1, ops, nullptr, 0);
  c.nbufs = n;
  return c;
}

}  // namespace mncl::kit

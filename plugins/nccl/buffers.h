// Which buffers a collective touches on one rank, and how to swap some of them for stand-ins
// while keeping the in-place forms in place. The nccl plugin uses it to run host buffers
// through device scratch memory (the core's sdk/cuda/staging.cpp does the reverse with the same
// rules; a candidate for the plugin kit once a second plugin needs it).
#pragma once

#include <mncl/mncl_plugin.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "common/dtype.h"

namespace mncl::nccl {

// Index of a pointer in a descriptor: 0 sendbuf, 1 recvbuf, coalesced 2+2i sendbufs[i] and
// 3+2i recvbufs[i].
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
    default:
      break;
  }
}

// A buffer to replace, and its stand-in's offset in one scratch allocation.
struct Slot {
  size_t index;
  const char *ptr;
  size_t bytes;
  bool in, out;
  size_t offset = 0;
};

// Gives each slot its offset: overlapping buffers (in-place forms) share one region at the same
// relative offsets, so the stand-ins alias exactly as the originals do. Returns the bytes needed.
inline size_t plan_regions(std::vector<Slot> &slots, size_t align = 256) {
  std::sort(slots.begin(), slots.end(), [](const Slot &a, const Slot &b) { return a.ptr < b.ptr; });
  size_t total = 0, region_offset = 0;
  const char *begin = nullptr, *end = nullptr;
  for (Slot &s : slots) {
    if (begin == nullptr || s.ptr >= end) {
      total = (total + align - 1) / align * align;
      begin = end = s.ptr;
      region_offset = total;
    }
    s.offset = region_offset + static_cast<size_t>(s.ptr - begin);
    if (s.ptr + s.bytes > end) {
      total += static_cast<size_t>(s.ptr + s.bytes - end);
      end = s.ptr + s.bytes;
    }
  }
  return total;
}

// A copy of a descriptor whose pointers can be replaced, coalesced arrays included.
struct CollCopy {
  mncl_coll_v1_t coll;
  std::vector<const void *> sendbufs;
  std::vector<void *> recvbufs;

  explicit CollCopy(const mncl_coll_v1_t &c) : coll(c) {
    if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED && c.nbufs > 0) {
      sendbufs.assign(c.sendbufs, c.sendbufs + c.nbufs);
      recvbufs.assign(c.recvbufs, c.recvbufs + c.nbufs);
      coll.sendbufs = sendbufs.data();
      coll.recvbufs = recvbufs.data();
    }
  }
  void set(size_t index, void *p) {
    if (index == kSend) {
      coll.sendbuf = p;
    } else if (index == kRecv) {
      coll.recvbuf = p;
    } else if (index % 2 == 0) {
      sendbufs[(index - 2) / 2] = p;
    } else {
      recvbufs[(index - 3) / 2] = p;
    }
  }
};

}  // namespace mncl::nccl

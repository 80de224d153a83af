// Which buffers a collective touches on one rank, and how to swap some of them for stand-ins
// while keeping the in-place forms in place. The nccl plugin uses it to run host buffers
// through device scratch memory (the core's sdk/cuda/staging.cpp does the reverse with the same
// buffer rules, common/buffers.h).
#pragma once

#include <mncl/mncl_plugin.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "common/buffers.h"
#include "common/dtype.h"

namespace mncl::nccl {

using kit::for_each_buffer;
using kit::kRecv;
using kit::kSend;

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

// A copy of a descriptor whose pointers can be replaced, coalesced arrays and batch ops included.
struct CollCopy {
  mncl_coll_v1_t coll;
  std::vector<const void *> sendbufs;
  std::vector<void *> recvbufs;
  std::vector<mncl_p2p_v4_t> ops;

  explicit CollCopy(const mncl_coll_v1_t &c) : coll(c) {
    if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED && c.nbufs > 0) {
      sendbufs.assign(c.sendbufs, c.sendbufs + c.nbufs);
      recvbufs.assign(c.recvbufs, c.recvbufs + c.nbufs);
      coll.sendbufs = sendbufs.data();
      coll.recvbufs = recvbufs.data();
    } else if (c.kind == MNCL_COLL_SENDRECV_BATCH && c.nbufs > 0) {
      ops.assign(kit::p2p_ops(c), kit::p2p_ops(c) + c.nbufs);
      coll.sendbuf = ops.data();
    }
  }
  void set(size_t index, void *p) {
    if (coll.kind == MNCL_COLL_SENDRECV_BATCH) {
      ops[(index - 2) / 2].buf = p;  // kit::for_each_buffer: op i is 2+2i or 3+2i
    } else if (index == kSend) {
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

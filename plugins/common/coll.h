// Plugin kit: one way to fill a collective descriptor (mncl_coll_v1_t), for the core's API
// entry points and for tests that drive plugins directly. Fields not named stay zero (stream,
// coalesced arrays, seq, timeout): callers set what their path needs.
#pragma once

#include <mncl/mncl_plugin.h>

#include <cstddef>
#include <cstdint>

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

}  // namespace mncl::kit

// Plugin kit: one table definition, exported under both plugin-ABI versions.
//
// A v2 plugin (mncl_plugin_v2.h) also exports its table as v1, so cores that predate v2 load it:
//
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = {...};
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);
//
// The v1 copy drops MNCL_CAP_CONCURRENT_P2P: a v1 core calls execute() from one thread at a
// time, which every v2 plugin also supports.
#pragma once

#include <mncl/mncl_plugin.h>

#include <cstdint>

namespace mncl::kit {

// The same functions under another table version: every plugin-ABI table so far has v1's
// fields in v1's order, so only the header, the capabilities and the kinds change.
template <typename To, typename From>
constexpr To relabel(const From &t, uint32_t abi_version, uint64_t caps, uint32_t coll_mask) {
  return To{sizeof(To),   t.magic,      abi_version,  t.name,        t.version,
            caps,         coll_mask,    t.dtype_mask, t.op_mask,     t.reserved0,
            t.init,       t.finalize,   t.probe,      t.comm_create, t.comm_destroy,
            t.comm_abort, t.comm_split, t.execute,    t.post,        t.test};
}

constexpr mncl_plugin_v1_t as_v1(const mncl_plugin_v2_t &t) {
  return relabel<mncl_plugin_v1_t>(t, MNCL_PLUGIN_ABI_V1, t.caps & ~MNCL_CAP_CONCURRENT_P2P,
                                   t.coll_mask);
}

// A v3 plugin (mncl_plugin_v3.h) exports its table as v2 and v1 too:
//
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = {...};
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = kit::as_v2(mncl_plugin_v3);
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);
//
// The v2 copy drops the kinds v2 does not define (a v2 core never asks for them).
constexpr mncl_plugin_v2_t as_v2(const mncl_plugin_v3_t &t) {
  return relabel<mncl_plugin_v2_t>(
      t, MNCL_PLUGIN_ABI_V2, t.caps,
      t.coll_mask & (MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED)));
}

// A v4 plugin (mncl_plugin_v4.h) exports its table as v3, v2 and v1 too, each copy without the
// kinds its version does not define:
//
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v4_t mncl_plugin_v4 = {...};
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = kit::as_v3(mncl_plugin_v4);
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = kit::as_v2(mncl_plugin_v3);
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);
constexpr mncl_plugin_v3_t as_v3(const mncl_plugin_v4_t &t) {
  return relabel<mncl_plugin_v3_t>(t, MNCL_PLUGIN_ABI_V3, t.caps,
                                   t.coll_mask & MNCL_COLL_MASK_ALL_V3);
}

// A v5 plugin (mncl_plugin_v5.h) exports its table as v4, v3, v2 and v1 too, each copy without
// the kinds its version does not define:
//
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v5_t mncl_plugin_v5 = {...};
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v4_t mncl_plugin_v4 = kit::as_v4(mncl_plugin_v5);
//   MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = kit::as_v3(mncl_plugin_v4);
//   ...
constexpr mncl_plugin_v4_t as_v4(const mncl_plugin_v5_t &t) {
  return relabel<mncl_plugin_v4_t>(t, MNCL_PLUGIN_ABI_V4, t.caps,
                                   t.coll_mask & MNCL_COLL_MASK_ALL_V4);
}

}  // namespace mncl::kit

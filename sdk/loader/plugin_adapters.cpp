// Plugin ABI v1..v5 -> the core's table (v5). Every version so far keeps v1's fields in v1's
// order (v2 adds a capability bit, v3 two collective kinds, v4 one more, v5 two more), so each
// adapter is a checked copy that keeps only the capability bits and kinds its version defines:
// a v1 table cannot promise MNCL_CAP_CONCURRENT_P2P, a v2 table no v3 kind, a v3 table no v4
// kind, a v4 table no v5 kind.
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

static_assert(offsetof(mncl_plugin_v2_t, test) == offsetof(mncl_plugin_v1_t, test) &&
                  sizeof(mncl_plugin_v2_t) == sizeof(mncl_plugin_v1_t),
              "v2 keeps v1's layout");
static_assert(offsetof(mncl_plugin_v3_t, test) == offsetof(mncl_plugin_v2_t, test) &&
                  sizeof(mncl_plugin_v3_t) == sizeof(mncl_plugin_v2_t),
              "v3 keeps v2's layout");
static_assert(offsetof(mncl_plugin_v4_t, test) == offsetof(mncl_plugin_v3_t, test) &&
                  sizeof(mncl_plugin_v4_t) == sizeof(mncl_plugin_v3_t),
              "v4 keeps v3's layout");
static_assert(offsetof(mncl_plugin_v5_t, test) == offsetof(mncl_plugin_v4_t, test) &&
                  sizeof(mncl_plugin_v5_t) == sizeof(mncl_plugin_v4_t),
              "v5 keeps v4's layout");

namespace {

// What each version's table may carry.
constexpr TableFacts kV1 = facts_of<mncl_plugin_v1_t>(MNCL_PLUGIN_ABI_V1, MNCL_PLUGIN_V1_SYMBOL,
                                                      "mncl_plugin_v1_t", kCapsV1, kCollsV1);
constexpr TableFacts kV2 = facts_of<mncl_plugin_v2_t>(MNCL_PLUGIN_ABI_V2, MNCL_PLUGIN_V2_SYMBOL,
                                                      "mncl_plugin_v2_t", kCapsV2, kCollsV1);
constexpr TableFacts kV3 = facts_of<mncl_plugin_v3_t>(
    MNCL_PLUGIN_ABI_V3, MNCL_PLUGIN_V3_SYMBOL, "mncl_plugin_v3_t", kCapsV2, MNCL_COLL_MASK_ALL_V3);
constexpr TableFacts kV4 = facts_of<mncl_plugin_v4_t>(
    MNCL_PLUGIN_ABI_V4, MNCL_PLUGIN_V4_SYMBOL, "mncl_plugin_v4_t", kCapsV2, MNCL_COLL_MASK_ALL_V4);
constexpr TableFacts kV5 = facts_of<mncl_plugin_v5_t>(
    MNCL_PLUGIN_ABI_V5, MNCL_PLUGIN_V5_SYMBOL, "mncl_plugin_v5_t", kCapsV2, MNCL_COLL_MASK_ALL_V5);

}  // namespace

std::string adapt_v1(const void *exported, Table *out) {
  return adapt_same_layout(exported, kV1, out);
}
std::string adapt_v2(const void *exported, Table *out) {
  return adapt_same_layout(exported, kV2, out);
}
std::string adapt_v3(const void *exported, Table *out) {
  return adapt_same_layout(exported, kV3, out);
}
std::string adapt_v4(const void *exported, Table *out) {
  return adapt_same_layout(exported, kV4, out);
}
std::string adapt_v5(const void *exported, Table *out) {
  return adapt_same_layout(exported, kV5, out);
}

}  // namespace mncl::loader::abi

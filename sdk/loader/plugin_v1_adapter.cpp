// Plugin ABI v1 -> the core's table (v4). v2..v4 have v1's fields in v1's order; v2 adds one
// capability bit, v3 two collective kinds and v4 one more, so this is a checked copy that clears
// the bits v1 does not define (a v1 table cannot promise MNCL_CAP_CONCURRENT_P2P or a later kind).
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

std::string adapt_v1(const void *exported, Table *out) {
  static constexpr TableFacts kV1 = facts_of<mncl_plugin_v1_t>(
      MNCL_PLUGIN_ABI_V1, MNCL_PLUGIN_V1_SYMBOL, "mncl_plugin_v1_t", kCapsV1, kCollsV1);
  return adapt_same_layout(exported, kV1, out);
}

}  // namespace mncl::loader::abi

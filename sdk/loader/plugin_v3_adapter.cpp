// Plugin ABI v3 -> the core's table (v4, laid out as v3): a checked copy that keeps v3's
// capability bits (v2's) and v3's collective kinds only.
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

std::string adapt_v3(const void *exported, Table *out) {
  static constexpr TableFacts kV3 =
      facts_of<mncl_plugin_v3_t>(MNCL_PLUGIN_ABI_V3, MNCL_PLUGIN_V3_SYMBOL, "mncl_plugin_v3_t",
                                 kCapsV2, MNCL_COLL_MASK_ALL_V3);
  return adapt_same_layout(exported, kV3, out);
}

}  // namespace mncl::loader::abi

// Plugin ABI v2 -> the core's table (v4, laid out as v2): a checked copy that keeps v2's
// capability bits and v2's collective kinds only.
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

std::string adapt_v2(const void *exported, Table *out) {
  static constexpr TableFacts kV2 = facts_of<mncl_plugin_v2_t>(
      MNCL_PLUGIN_ABI_V2, MNCL_PLUGIN_V2_SYMBOL, "mncl_plugin_v2_t", kCapsV2, kCollsV1);
  return adapt_same_layout(exported, kV2, out);
}

}  // namespace mncl::loader::abi

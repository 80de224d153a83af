// Plugin ABI v4 -> the core's table. v4 is the newest ABI today, so this is a checked copy
// that keeps v4's capability bits (v2's) and v4's collective kinds only.
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

std::string adapt_v4(const void *exported, Table *out) {
  static constexpr TableFacts kV4 =
      facts_of<mncl_plugin_v4_t>(MNCL_PLUGIN_ABI_V4, MNCL_PLUGIN_V4_SYMBOL, "mncl_plugin_v4_t",
                                 kCapsV2, MNCL_COLL_MASK_ALL_V4);
  return adapt_same_layout(exported, kV4, out);
}

}  // namespace mncl::loader::abi

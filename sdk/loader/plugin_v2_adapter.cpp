// Plugin ABI v2 -> the core's table (v3, laid out as v2): a checked copy that keeps v2's
// capability bits and v2's collective kinds only.
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

std::string adapt_v2(const void *exported, Table *out) {
  static constexpr TableFacts kV2 = {
      MNCL_PLUGIN_ABI_V2,
      MNCL_PLUGIN_V2_SYMBOL,
      "mncl_plugin_v2_t",
      offsetof(mncl_plugin_v2_t, test) + sizeof(mncl_plugin_v2_t::test),
      sizeof(mncl_plugin_v2_t),
      MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY | MNCL_CAP_NATIVE_ASYNC |
          MNCL_CAP_STREAM_ORDERED | MNCL_CAP_CONCURRENT_P2P,
      kCollsV1};
  return adapt_same_layout(exported, kV2, out);
}

}  // namespace mncl::loader::abi

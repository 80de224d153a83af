// Plugin ABI v1 -> the core's table (v2). v2 has v1's fields in v1's order and adds one
// capability bit, so this is a checked copy that clears the bits v1 does not define (a v1
// table cannot promise MNCL_CAP_CONCURRENT_P2P).
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

static_assert(offsetof(mncl_plugin_v2_t, test) == offsetof(mncl_plugin_v1_t, test) &&
                  sizeof(mncl_plugin_v2_t) == sizeof(mncl_plugin_v1_t),
              "v2 keeps v1's layout");

std::string adapt_v1(const void *exported, Table *out) {
  static constexpr TableFacts kV1 = {
      MNCL_PLUGIN_ABI_V1,
      MNCL_PLUGIN_V1_SYMBOL,
      "mncl_plugin_v1_t",
      offsetof(mncl_plugin_v1_t, test) + sizeof(mncl_plugin_v1_t::test),
      sizeof(mncl_plugin_v1_t),
      MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY | MNCL_CAP_NATIVE_ASYNC |
          MNCL_CAP_STREAM_ORDERED};
  return adapt_same_layout(exported, kV1, out);
}

}  // namespace mncl::loader::abi

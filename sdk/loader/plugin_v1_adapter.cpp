// Plugin ABI v1 -> the core's table (v2). v2 has v1's fields in v1's order and adds one
// capability bit, so this is a checked copy that clears the bits v1 does not define.
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

namespace {
// End of the last v1 field this core reads: a v1 table must be at least this large.
constexpr size_t kV1MinSize = offsetof(mncl_plugin_v1_t, test) + sizeof(mncl_plugin_v1_t::test);
// The capabilities v1 defines; anything else a v1 table sets is meaningless to it.
constexpr uint64_t kV1Caps =
    MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY | MNCL_CAP_NATIVE_ASYNC | MNCL_CAP_STREAM_ORDERED;

static_assert(offsetof(mncl_plugin_v2_t, test) == offsetof(mncl_plugin_v1_t, test) &&
                  sizeof(mncl_plugin_v2_t) == sizeof(mncl_plugin_v1_t),
              "v2 keeps v1's layout");
}  // namespace

std::string adapt_v1(const void *exported, Table *out) {
  std::string reason = check_header(exported, MNCL_PLUGIN_ABI_V1, MNCL_PLUGIN_V1_SYMBOL,
                                    "mncl_plugin_v1_t", kV1MinSize);
  if (!reason.empty()) return reason;
  // Copy what both sides know; anything this core knows but the plugin lacks stays zero.
  copy_table(exported, sizeof(mncl_plugin_v1_t), out);
  out->caps &= kV1Caps;  // e.g. MNCL_CAP_CONCURRENT_P2P is a v2 promise
  return {};
}

}  // namespace mncl::loader::abi

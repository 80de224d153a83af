// Plugin ABI v2 -> the core's table. v2 is the newest ABI today, so this is a checked copy.
#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

namespace {
// End of the last v2 field this core reads: a v2 table must be at least this large.
constexpr size_t kV2MinSize = offsetof(mncl_plugin_v2_t, test) + sizeof(mncl_plugin_v2_t::test);
// The capabilities v2 defines; later bits mean nothing in a v2 table.
constexpr uint64_t kV2Caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY | MNCL_CAP_NATIVE_ASYNC |
                             MNCL_CAP_STREAM_ORDERED | MNCL_CAP_CONCURRENT_P2P;
}  // namespace

std::string adapt_v2(const void *exported, Table *out) {
  std::string reason = check_header(exported, MNCL_PLUGIN_ABI_V2, MNCL_PLUGIN_V2_SYMBOL,
                                    "mncl_plugin_v2_t", kV2MinSize);
  if (!reason.empty()) return reason;
  // Copy what both sides know; anything this core knows but the plugin lacks stays zero.
  copy_table(exported, sizeof(mncl_plugin_v2_t), out);
  out->caps &= kV2Caps;
  return {};
}

}  // namespace mncl::loader::abi

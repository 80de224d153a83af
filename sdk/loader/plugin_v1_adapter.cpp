// Plugin ABI v1 -> the core's table. v1 is also the newest ABI today, so this is a checked copy.
#include <cstring>

#include "loader/plugin_abi.h"

namespace mncl::loader::abi {

namespace {
// End of the last v1 field this core reads: a v1 table must be at least this large.
constexpr size_t kV1MinSize = offsetof(mncl_plugin_v1_t, test) + sizeof(mncl_plugin_v1_t::test);
}  // namespace

std::string adapt_v1(const void *exported, Table *out) {
  std::string reason = check_header(exported, MNCL_PLUGIN_ABI_V1, MNCL_PLUGIN_V1_SYMBOL,
                                    "mncl_plugin_v1_t", kV1MinSize);
  if (!reason.empty()) return reason;
  size_t size = 0;
  std::memcpy(&size, exported, sizeof size);
  // Copy what both sides know; anything this core knows but the plugin lacks stays zero.
  std::memset(out, 0, sizeof *out);
  std::memcpy(out, exported, size < sizeof *out ? size : sizeof *out);
  out->struct_size = sizeof *out;
  return {};
}

}  // namespace mncl::loader::abi

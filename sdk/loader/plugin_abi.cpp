// Checks shared by every ABI adapter: the fixed header every plugin table starts with.
#include "loader/plugin_abi.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace mncl::loader::abi {

std::string symbol_for(uint32_t version) {
  return "mncl_plugin_v" + std::to_string(version);
}

std::string check_header(const void *exported, uint32_t version, const char *symbol,
                         const char *type_name, size_t min_size) {
  // memcpy: the plugin's table carries no alignment promise beyond its own compiler's.
  TableHeader h;
  std::memcpy(&h, exported, sizeof h);
  if (h.magic != MNCL_PLUGIN_MAGIC) {
    return format("%s has magic 0x%08x, expected 0x%08x: not an MNCL plugin table", symbol, h.magic,
                  MNCL_PLUGIN_MAGIC);
  }
  if (h.abi_version != version) {
    return format("%s declares abi_version %u but the symbol name promises %u", symbol,
                  h.abi_version, version);
  }
  if (h.struct_size < min_size) {
    return format("%s struct_size %zu is smaller than %s (%zu bytes): truncated table", symbol,
                  h.struct_size, type_name, min_size);
  }
  return {};
}

std::string adapt_same_layout(const void *exported, const TableFacts &facts, Table *out) {
  std::string reason =
      check_header(exported, facts.version, facts.symbol, facts.type_name, facts.min_size);
  if (!reason.empty()) return reason;
  size_t size = 0;
  std::memcpy(&size, exported, sizeof size);
  // Copy what both sides know; anything this core knows but the plugin lacks stays zero.
  std::memset(out, 0, sizeof *out);
  std::memcpy(out, exported, std::min({size, facts.known_size, sizeof *out}));
  out->struct_size = sizeof *out;
  out->caps &= facts.caps;
  out->coll_mask &= facts.colls;
  return {};
}

}  // namespace mncl::loader::abi

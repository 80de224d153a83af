// Private to the loader: the plugin-ABI versions this core understands and the adapters that
// turn each exported table into the newest layout, so nothing past the loader sees old tables.
//
// Adding ABI vN: add its facts and adapt_vN to plugin_adapters.cpp (a table laid out like the
// last one) or an adapter of its own (one that is not), change `Table` and kNewest to vN, make
// the older adapters fill a vN table (new fields zeroed, new capability bits cleared), and add
// one line to kAdapters below.
#pragma once

#include <mncl/mncl_plugin.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mncl::loader::abi {

// The newest table: what Plugin::table() returns.
using Table = mncl_plugin_v5_t;

// Versions this core loads, and how far beyond them it looks to explain a refusal.
inline constexpr uint32_t kOldest = MNCL_PLUGIN_ABI_OLDEST;
inline constexpr uint32_t kNewest = MNCL_PLUGIN_ABI_CURRENT;
inline constexpr uint32_t kMaxProbed = 16;

// Fills *out from the table a plugin exports under the adapter's symbol. Returns "" on success,
// else why the table is unusable. The rest of *out is zeroed.
using AdaptFn = std::string (*)(const void *exported, Table *out);

struct Adapter {
  uint32_t version;
  const char *symbol;
  AdaptFn adapt;
};

std::string adapt_v1(const void *exported, Table *out);
std::string adapt_v2(const void *exported, Table *out);
std::string adapt_v3(const void *exported, Table *out);
std::string adapt_v4(const void *exported, Table *out);
std::string adapt_v5(const void *exported, Table *out);

// Newest first: the loader takes the first symbol a plugin exports.
inline constexpr Adapter kAdapters[] = {
    {MNCL_PLUGIN_ABI_V5, MNCL_PLUGIN_V5_SYMBOL, &adapt_v5},
    {MNCL_PLUGIN_ABI_V4, MNCL_PLUGIN_V4_SYMBOL, &adapt_v4},
    {MNCL_PLUGIN_ABI_V3, MNCL_PLUGIN_V3_SYMBOL, &adapt_v3},
    {MNCL_PLUGIN_ABI_V2, MNCL_PLUGIN_V2_SYMBOL, &adapt_v2},
    {MNCL_PLUGIN_ABI_V1, MNCL_PLUGIN_V1_SYMBOL, &adapt_v1},
};

// Every table starts with these fields, whatever its version.
struct TableHeader {
  size_t struct_size;
  uint32_t magic;
  uint32_t abi_version;
};

// Checks magic, abi_version == version and struct_size >= min_size (the end of the last field
// the adapter reads). Returns "" or the reason, naming the symbol.
std::string check_header(const void *exported, uint32_t version, const char *symbol,
                         const char *type_name, size_t min_size);

// What the adapter of a version whose table is laid out like the core's (v1..v5 so far)
// needs to know about it.
struct TableFacts {
  uint32_t version;
  const char *symbol;     // "mncl_plugin_v1"
  const char *type_name;  // "mncl_plugin_v1_t", for messages
  size_t min_size;        // end of the last field this core reads
  size_t known_size;      // sizeof the version's table: bytes beyond it are not ours to read
  uint64_t caps;          // the capability bits the version defines; others are cleared
  uint32_t colls;         // the collective kinds the version defines; other coll_mask bits too
};

// The kinds of v1 and v2 (0..11, the coalesced allreduce included).
inline constexpr uint32_t kCollsV1 =
    MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED);
// The capability bits v1 defines, and those of v2 (which v3, v4 and v5 keep).
inline constexpr uint64_t kCapsV1 =
    MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY | MNCL_CAP_NATIVE_ASYNC | MNCL_CAP_STREAM_ORDERED;
inline constexpr uint64_t kCapsV2 = kCapsV1 | MNCL_CAP_CONCURRENT_P2P;

// The facts of version table type T, whose last field is test (true of v1..v5).
template <typename T>
constexpr TableFacts facts_of(uint32_t version, const char *symbol, const char *type_name,
                              uint64_t caps, uint32_t colls) {
  return {version, symbol, type_name, offsetof(T, test) + sizeof(T::test), sizeof(T), caps, colls};
}

// check_header, then: zeroes *out, copies the first min(the table's struct_size, known_size)
// bytes (the fields both sides know), sets out->struct_size to sizeof(Table) and keeps only
// facts.caps in out->caps and facts.colls in out->coll_mask.
std::string adapt_same_layout(const void *exported, const TableFacts &facts, Table *out);

// "mncl_plugin_v7"
std::string symbol_for(uint32_t version);

}  // namespace mncl::loader::abi

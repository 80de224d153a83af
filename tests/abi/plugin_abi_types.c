/*
 * plugin_abi_types.c — one plugin ABI version (mncl_plugin_v<N>.h) as a tiny shared object, so
 * abidw can describe it: the headers themselves define no symbol, so nothing else would carry
 * their types. Built once per version, MNCL_ABI_TYPES_VERSION=<N> (libmncl_plugin_abi_v<N>.so),
 * each object with its own baseline abi/baseline/mncl_plugin_v<N>.abi: every released version is
 * frozen, so adding v2 must leave v1's object, and its description, exactly as they were.
 *
 * It exports what a v<N> plugin exports, the table `mncl_plugin_v<N>` (which reaches every
 * struct of the ABI through the table's function pointers: host, store, bootstrap, probe,
 * coll), plus one function taking the enums that no struct field names by type. It is never
 * loaded as a plugin (its file name is not libmncl-<name>.so) and its table is empty.
 */
#include <mncl/mncl_plugin.h>

#ifndef MNCL_ABI_TYPES_VERSION
#error "MNCL_ABI_TYPES_VERSION must be defined (the plugin ABI version to describe)"
#endif

#if MNCL_ABI_TYPES_VERSION == 1
#define ABI_TABLE_T mncl_plugin_v1_t
#define ABI_TABLE mncl_plugin_v1
#define ABI_VERSION MNCL_PLUGIN_ABI_V1
#define ABI_ENUMS mncl_plugin_abi_v1_enums
#elif MNCL_ABI_TYPES_VERSION == 2
#define ABI_TABLE_T mncl_plugin_v2_t
#define ABI_TABLE mncl_plugin_v2
#define ABI_VERSION MNCL_PLUGIN_ABI_V2
#define ABI_ENUMS mncl_plugin_abi_v2_enums
#elif MNCL_ABI_TYPES_VERSION == 3
#define ABI_TABLE_T mncl_plugin_v3_t
#define ABI_TABLE mncl_plugin_v3
#define ABI_VERSION MNCL_PLUGIN_ABI_V3
#define ABI_ENUMS mncl_plugin_abi_v3_enums
/* v3's kinds are an enum of their own (mncl_coll_kind_v3_t), which v1 and v2 do not have. */
#define ABI_KIND_V3_PARAM , mncl_coll_kind_v3_t kind3
#define ABI_KIND_V3_ARG +(int)kind3
#elif MNCL_ABI_TYPES_VERSION == 4
#define ABI_TABLE_T mncl_plugin_v4_t
#define ABI_TABLE mncl_plugin_v4
#define ABI_VERSION MNCL_PLUGIN_ABI_V4
#define ABI_ENUMS mncl_plugin_abi_v4_enums
/* v4 adds a kind (mncl_coll_kind_v4_t) and the batch op, which only a void * points to. */
#define ABI_KIND_V3_PARAM \
  , mncl_coll_kind_v3_t kind3, mncl_coll_kind_v4_t kind4, const mncl_p2p_v4_t *p2p
#define ABI_KIND_V3_ARG +(int)kind3 + (int)kind4 + (p2p ? p2p->kind : 0)
#elif MNCL_ABI_TYPES_VERSION == 5
#define ABI_TABLE_T mncl_plugin_v5_t
#define ABI_TABLE mncl_plugin_v5
#define ABI_VERSION MNCL_PLUGIN_ABI_V5
#define ABI_ENUMS mncl_plugin_abi_v5_enums
/* v5 adds two kinds (mncl_coll_kind_v5_t). */
#define ABI_KIND_V3_PARAM                                                           \
  , mncl_coll_kind_v3_t kind3, mncl_coll_kind_v4_t kind4, const mncl_p2p_v4_t *p2p, \
      mncl_coll_kind_v5_t kind5
#define ABI_KIND_V3_ARG +(int)kind3 + (int)kind4 + (p2p ? p2p->kind : 0) + (int)kind5
#else
#error "unknown MNCL_ABI_TYPES_VERSION"
#endif

MNCL_PLUGIN_EXPORT const ABI_TABLE_T ABI_TABLE = {.struct_size = sizeof(ABI_TABLE_T),
                                                  .magic = MNCL_PLUGIN_MAGIC,
                                                  .abi_version = ABI_VERSION,
                                                  .name = "abi-types",
                                                  .version = "0"};

#ifndef ABI_KIND_V3_PARAM
#define ABI_KIND_V3_PARAM
#define ABI_KIND_V3_ARG
#endif

/* The enums a plugin sees as plain int32_t fields (kind, dtype, op, log levels); v2 uses v1's,
 * v3 adds its kinds (mncl_coll_kind_v3_t), v4 its kind and the batch op (mncl_p2p_v4_t), v5
 * its kinds (mncl_coll_kind_v5_t). */
MNCL_PLUGIN_EXPORT int ABI_ENUMS(mncl_log_level_v1_t level, mncl_coll_kind_v1_t kind,
                                 mncl_dtype_t dtype, mncl_op_t op,
                                 mncl_status_t status ABI_KIND_V3_PARAM);
MNCL_PLUGIN_EXPORT int ABI_ENUMS(mncl_log_level_v1_t level, mncl_coll_kind_v1_t kind,
                                 mncl_dtype_t dtype, mncl_op_t op,
                                 mncl_status_t status ABI_KIND_V3_PARAM) {
  return (int)level + (int)kind + (int)dtype + (int)op + (int)status ABI_KIND_V3_ARG;
}

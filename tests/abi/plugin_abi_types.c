/*
 * plugin_abi_types.c — the plugin ABI (mncl_plugin_v1.h) as a tiny shared object, so abidw can
 * describe it: the header itself defines no symbol, so nothing else would carry its types.
 *
 * It exports what a v1 plugin exports, the table `mncl_plugin_v1` (which reaches every struct
 * of the ABI through the table's function pointers: host, store, bootstrap, probe, coll), plus
 * one function taking the enums that no struct field names by type. It is never loaded as a
 * plugin (its file name is not libmncl-<name>.so) and its table is empty.
 */
#include <mncl/mncl_plugin.h>

MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = {sizeof(mncl_plugin_v1_t),
                                                            MNCL_PLUGIN_MAGIC,
                                                            MNCL_PLUGIN_ABI_V1,
                                                            "abi-types",
                                                            "0",
                                                            0,
                                                            0,
                                                            0,
                                                            0,
                                                            0,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL};

/* The enums a plugin sees as plain int32_t fields (kind, dtype, op, log levels). */
MNCL_PLUGIN_EXPORT int mncl_plugin_abi_v1_enums(mncl_log_level_v1_t level, mncl_coll_kind_v1_t kind,
                                                mncl_dtype_t dtype, mncl_op_t op,
                                                mncl_status_t status);
MNCL_PLUGIN_EXPORT int mncl_plugin_abi_v1_enums(mncl_log_level_v1_t level, mncl_coll_kind_v1_t kind,
                                                mncl_dtype_t dtype, mncl_op_t op,
                                                mncl_status_t status) {
  return (int)level + (int)kind + (int)dtype + (int)op + (int)status;
}

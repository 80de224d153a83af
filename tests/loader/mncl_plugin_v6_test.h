/*
 * mncl_plugin_v6_test.h — a HYPOTHETICAL plugin ABI v6, for tests only: what a future
 * mncl_plugin_v6.h could look like (every v5 field, in order, then new fields appended). The
 * core does not know it, so a plugin exporting only this table must be refused with both
 * version ranges named, and a plugin exporting it beside an older table is served the older one.
 */
#ifndef MNCL_PLUGIN_V6_TEST_H
#define MNCL_PLUGIN_V6_TEST_H

#include <mncl/mncl_plugin_v5.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_PLUGIN_ABI_V6_TEST 6u
#define MNCL_PLUGIN_V6_TEST_SYMBOL "mncl_plugin_v6"

typedef struct mncl_plugin_v6_test {
  /* v5's table (which is v4's, v3's, v2's and v1's), unchanged, first: a core that knows only v5
   * can read it as one. base.abi_version is 6 and base.struct_size the size of this whole table. */
  mncl_plugin_v5_t base;
  /* v6 additions */
  /* Shrinks a communicator by excluding failed ranks (fault tolerance). May be NULL. */
  mncl_status_t (*comm_shrink)(void *comm, const int32_t *excluded, size_t nexcluded,
                               const mncl_bootstrap_v1_t *bs, void **newcomm);
  uint64_t caps2; /* room for more capability bits */
} mncl_plugin_v6_test_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_PLUGIN_V6_TEST_H */

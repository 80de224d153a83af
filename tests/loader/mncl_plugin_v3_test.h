/*
 * mncl_plugin_v3_test.h — a HYPOTHETICAL plugin ABI v3, for tests only: what a future
 * mncl_plugin_v3.h could look like (every v2 field, in order, then new fields appended). The
 * core does not know it, so a plugin exporting only this table must be refused with both
 * version ranges named, and a plugin exporting it beside an older table is served the older one.
 */
#ifndef MNCL_PLUGIN_V3_TEST_H
#define MNCL_PLUGIN_V3_TEST_H

#include <mncl/mncl_plugin_v2.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_PLUGIN_ABI_V3_TEST 3u
#define MNCL_PLUGIN_V3_TEST_SYMBOL "mncl_plugin_v3"

typedef struct mncl_plugin_v3_test {
  /* v2 fields (which are v1's), unchanged */
  size_t struct_size;
  uint32_t magic;
  uint32_t abi_version; /* 3 */
  const char *name;
  const char *version;
  uint64_t caps;
  uint32_t coll_mask;
  uint32_t dtype_mask;
  uint32_t op_mask;
  uint32_t reserved0;
  mncl_status_t (*init)(const mncl_host_v1_t *host);
  void (*finalize)(void);
  mncl_status_t (*probe)(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                         size_t reason_len);
  mncl_status_t (*comm_create)(const mncl_bootstrap_v1_t *bs, void **comm);
  mncl_status_t (*comm_destroy)(void *comm);
  mncl_status_t (*comm_abort)(void *comm);
  mncl_status_t (*comm_split)(void *comm, int32_t color, int32_t key, const mncl_bootstrap_v1_t *bs,
                              void **newcomm);
  mncl_status_t (*execute)(void *comm, const mncl_coll_v1_t *coll);
  mncl_status_t (*post)(void *comm, const mncl_coll_v1_t *coll, void **handle);
  mncl_status_t (*test)(void *comm, void *handle, int32_t *done);
  /* v3 additions */
  /* Shrinks a communicator by excluding failed ranks (fault tolerance). May be NULL. */
  mncl_status_t (*comm_shrink)(void *comm, const int32_t *excluded, size_t nexcluded,
                               const mncl_bootstrap_v1_t *bs, void **newcomm);
  uint64_t caps2; /* room for more capability bits */
} mncl_plugin_v3_test_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_PLUGIN_V3_TEST_H */

/*
 * mncl_plugin_v5.h — plugin ABI version 5. FROZEN: never edit a released version of this file;
 * a change is a new header (mncl_plugin_v6.h) plus an adapter for v5 in the core.
 *
 * What v5 adds to v4: two optional collective kinds, GATHERV and SCATTERV, for mncl_gatherv and
 * mncl_scatterv (mncl.h, MNCL_1.3), carried by v1's collective descriptor, whose layout does
 * not change. The table has exactly v4's fields in v4's order; every other type (host services,
 * store, bootstrap, probe, descriptor, batch op) keeps its meaning, and the threading contract
 * is v2's. A plugin implementing v5 exports
 *
 *     extern const mncl_plugin_v5_t mncl_plugin_v5;
 *
 * and, to stay loadable by older cores, may export mncl_plugin_v4 (v3, v2, v1) too: the same
 * functions, without the v5 kinds in coll_mask. A core takes the newest table it knows and
 * clears coll_mask bits the table's version does not define.
 *
 * The kinds are optional. For a plugin without them, the core runs a gatherv or scatterv as an
 * ALLTOALLV (mncl_plugin_v3.h) in which only the pairs with the root carry data: correct, but
 * every rank takes part in an all-to-all and in its counts check. A plugin sets the bits when it
 * can move the root's blocks alone (MPI_Gatherv, NCCL's grouped send/recv to the root).
 *
 * GATHERV in mncl_coll_v1_t:
 *   root      the root, in [0, size).
 *   sendbuf   this rank's block: count elements (count may be 0; sendbuf is NULL only then).
 *             In place at the root: sendbuf == recvbuf + displs[root] elements (the block is
 *             already where it belongs).
 *   recvbuf   the root: rank i's block lands at recvbuf + displs[i] elements. Receive blocks
 *             never overlap; elements of recvbuf outside every block must be left untouched.
 *             Other ranks: unused (any value; never read or written).
 *   counts    the root: 2 * size entries, recvcounts[0..size) then displs[0..size), the core's
 *             own copy (valid until the operation completes; the plugin must not write to it).
 *             Other ranks: NULL (only the root passes the arrays to mncl_gatherv).
 * SCATTERV in mncl_coll_v1_t:
 *   root      the root, in [0, size).
 *   sendbuf   the root: the block for rank i is sendcounts[i] elements at sendbuf + displs[i]
 *             elements (send blocks may overlap). Other ranks: unused.
 *   recvbuf   this rank's block: count elements (recvbuf is NULL only when count is 0). In
 *             place at the root: recvbuf == sendbuf + displs[root] elements.
 *   counts    the root: 2 * size entries, sendcounts[0..size) then displs[0..size) (as for
 *             GATHERV). Other ranks: NULL.
 * For both: nbufs is the communicator's size, sendbufs, recvbufs NULL, op -1, and seq numbers
 * them among the collectives.
 *
 * The core has checked every local fact: root and dtype (in dtype_mask), counts and the
 * displacements of non-empty blocks without overflow (an empty block's displacement is never
 * checked: do not compute a pointer from it), the root's receive blocks not overlapping (gatherv),
 * NULL buffers, count == counts[root] on the root, and no overlap of this rank's buffers other than
 * the in-place form. What no rank can check alone, rank i's count against the root's counts[i],
 * a plugin must not trust: a disagreement must end in an error (MNCL_ERR_REMOTE or
 * MNCL_ERR_TIMEOUT) at least on the rank that receives the block (the root for GATHERV, rank i
 * for SCATTERV), never in a crash, a write outside a block or a hang; the sending side may
 * complete. Where a backend's transport cannot tell (NCCL's), a stream-ordered plugin reports
 * what its library reports. MNCL_DEBUG_CHECKS=1 makes the core compare kind, dtype, root and
 * then these counts across ranks before the call; off by default, so a plugin cannot rely on it.
 */
#ifndef MNCL_PLUGIN_V5_H
#define MNCL_PLUGIN_V5_H

#include "mncl_plugin_v4.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_PLUGIN_ABI_V5 5u

/* The kinds added by v5 (v1..v4 keep 0..14). */
typedef enum mncl_coll_kind_v5 {
  MNCL_COLL_GATHERV = 15,
  MNCL_COLL_SCATTERV = 16
} mncl_coll_kind_v5_t;
#define MNCL_NUM_COLL_KINDS_V5 17
/* Every kind v5 defines. */
#define MNCL_COLL_MASK_ALL_V5 ((1u << MNCL_NUM_COLL_KINDS_V5) - 1u)

/* v4's table, field for field; abi_version is MNCL_PLUGIN_ABI_V5 and coll_mask may carry
 * MNCL_COLL_BIT(MNCL_COLL_GATHERV) and MNCL_COLL_BIT(MNCL_COLL_SCATTERV). Fields keep the
 * meanings documented in mncl_plugin_v1.h and mncl_plugin_v2.h. */
typedef struct mncl_plugin_v5 {
  size_t struct_size;   /* sizeof(mncl_plugin_v5_t) */
  uint32_t magic;       /* MNCL_PLUGIN_MAGIC */
  uint32_t abi_version; /* MNCL_PLUGIN_ABI_V5 */
  const char *name;
  const char *version;
  uint64_t caps; /* MNCL_CAP_* (v1's and v2's bits) */
  uint32_t coll_mask;
  uint32_t dtype_mask;
  uint32_t op_mask;
  uint32_t reserved0; /* zero */

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
} mncl_plugin_v5_t;

/* The symbol name a v5 plugin exports. */
#define MNCL_PLUGIN_V5_SYMBOL "mncl_plugin_v5"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_PLUGIN_V5_H */

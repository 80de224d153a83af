/*
 * mncl_plugin_v3.h — plugin ABI version 3. FROZEN: never edit a released version of this file;
 * a change is a new header (mncl_plugin_v4.h) plus an adapter for v3 in the core.
 *
 * What v3 adds to v2: two collective kinds with a count per rank, ALLGATHERV and ALLTOALLV
 * (mncl_allgatherv and mncl_alltoallv in mncl.h, with MPI's meaning), carried by v1's
 * collective descriptor, whose layout does not change. The table has exactly v2's fields in
 * v2's order; every other type (host services, store, bootstrap, probe, descriptor) is v1's
 * and keeps v1's meaning, and the threading contract is v2's. A plugin implementing v3 exports
 *
 *     extern const mncl_plugin_v3_t mncl_plugin_v3;
 *
 * and, to stay loadable by older cores, may export mncl_plugin_v2 (and mncl_plugin_v1) too:
 * the same functions, without the v3 kinds in coll_mask. A core takes the newest table it
 * knows; it clears coll_mask bits a table's version does not define, so a v1 or v2 plugin is
 * never handed a v3 kind (the core answers MNCL_ERR_NOT_SUPPORTED, naming the backend).
 *
 * The v3 kinds in mncl_coll_v1_t. Counts and displacements are in elements of `dtype`, one
 * entry per rank of the communicator, and `counts` points to the core's own copy of them (valid
 * until the operation completes; the plugin must not write to it):
 *
 *   ALLGATHERV: sendbuf/count  this rank's block (count == recvcounts[rank]);
 *               recvbuf        rank i's block lands at recvbuf + displs[i] elements;
 *               nbufs          the communicator's size;
 *               counts         2 * size entries: recvcounts[0..size), then displs[0..size).
 *               In place: sendbuf == recvbuf + displs[rank] elements (the block is already
 *               there). Receive blocks never overlap; elements of recvbuf outside every block
 *               must be left untouched.
 *   ALLTOALLV:  sendbuf        the block for rank j is sendcounts[j] elements at
 *                              sendbuf + sdispls[j] elements;
 *               recvbuf        the block from rank i lands at recvbuf + rdispls[i] elements;
 *               count          0 (unused);
 *               nbufs          the communicator's size;
 *               counts         4 * size entries: sendcounts, sdispls, recvcounts, rdispls,
 *                              each [0..size).
 *               Never in place (the core refuses overlapping send and receive extents).
 *               Receive blocks never overlap; send blocks may. Elements of recvbuf outside
 *               every block must be left untouched.
 *   For both, sendbufs, recvbufs and op are unused (NULL / -1), root is -1, and seq numbers
 *   them among the collectives. The core has checked every local fact (arrays present, no
 *   overflow, sendcount == recvcounts[rank], sendcounts[rank] == recvcounts[rank], no
 *   overlaps); what no rank can check alone (rank i's sendcounts[j] against rank j's
 *   recvcounts[i], or equal recvcounts everywhere) a plugin must not trust: a disagreement
 *   must end in an error (MNCL_ERR_REMOTE or MNCL_ERR_TIMEOUT), never in a crash, a write
 *   outside a block or a hang, where the backend's transport can tell (NCCL's cannot: a
 *   stream-ordered plugin reports what its library reports).
 */
#ifndef MNCL_PLUGIN_V3_H
#define MNCL_PLUGIN_V3_H

#include "mncl_plugin_v2.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_PLUGIN_ABI_V3 3u

/* Kinds added by v3 (v1's mncl_coll_kind_v1_t keeps 0..11). */
typedef enum mncl_coll_kind_v3 {
  MNCL_COLL_ALLGATHERV = 12,
  MNCL_COLL_ALLTOALLV = 13
} mncl_coll_kind_v3_t;
#define MNCL_NUM_COLL_KINDS_V3 14
/* Every kind v3 defines (the coalesced allreduce included). */
#define MNCL_COLL_MASK_ALL_V3 ((1u << MNCL_NUM_COLL_KINDS_V3) - 1u)

/* v2's table, field for field; abi_version is MNCL_PLUGIN_ABI_V3 and coll_mask may carry
 * MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) and MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV). Fields keep the
 * meanings documented in mncl_plugin_v1.h and mncl_plugin_v2.h. */
typedef struct mncl_plugin_v3 {
  size_t struct_size;   /* sizeof(mncl_plugin_v3_t) */
  uint32_t magic;       /* MNCL_PLUGIN_MAGIC */
  uint32_t abi_version; /* MNCL_PLUGIN_ABI_V3 */
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
} mncl_plugin_v3_t;

/* The symbol name a v3 plugin exports. */
#define MNCL_PLUGIN_V3_SYMBOL "mncl_plugin_v3"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_PLUGIN_V3_H */

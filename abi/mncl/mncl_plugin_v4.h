/*
 * mncl_plugin_v4.h — plugin ABI version 4. FROZEN: never edit a released version of this file;
 * a change is a new header (mncl_plugin_v5.h) plus an adapter for v4 in the core.
 *
 * What v4 adds to v3: one collective kind, SENDRECV_BATCH, for mncl_sendrecv_batch and
 * mncl_sendrecv (mncl.h): several sends and receives that must progress together. It is
 * carried by v1's collective descriptor, whose layout does not change; its ops are an array of
 * mncl_p2p_v4_t, defined here. The table has exactly v3's fields in v3's order; every other type
 * (host services, store, bootstrap, probe, descriptor) is v1's and keeps v1's meaning, and the
 * threading contract is v2's. A plugin implementing v4 exports
 *
 *     extern const mncl_plugin_v4_t mncl_plugin_v4;
 *
 * and, to stay loadable by older cores, may export mncl_plugin_v3 (v2, v1) too: the same
 * functions, without the v4 kind in coll_mask. A core takes the newest table it knows and
 * clears coll_mask bits the table's version does not define.
 *
 * The kind is optional. For a plugin without it, the core runs a batch as one mncl_send /
 * mncl_recv per op, all started before any is waited for: correct on every backend whose sends
 * and receives progress independently (MNCL_CAP_CONCURRENT_P2P lanes, or MNCL_CAP_NATIVE_ASYNC
 * posts that do not block). A plugin sets the bit when that is not enough: when separately
 * started operations run one after the other (MNCL_CAP_STREAM_ORDERED: NCCL needs the sends and
 * receives of an exchange in one group), or when it can do better as a whole.
 *
 * SENDRECV_BATCH in mncl_coll_v1_t:
 *   sendbuf   points to nbufs mncl_p2p_v4_t, the core's own copy (valid until the operation
 *             completes; the plugin must not write to it). NULL when nbufs is 0.
 *   nbufs     the number of ops (0: nothing to do; complete at once).
 *   recvbuf, count, sendbufs, recvbufs, counts: unused (NULL / 0). dtype, op, root: -1.
 *   seq       unused (0): every op carries its own.
 *   stream, timeout_ms: as for every kind; the timeout bounds the whole batch.
 * The core has checked every local fact: kinds, peers in range and not the rank itself, dtypes
 * in the plugin's dtype_mask, counts without overflow, buf non-NULL when count > 0, receive
 * buffers overlapping neither each other nor a send buffer. All ops must progress together:
 * none may wait for another of the same batch to finish first. Each op matches its peer's
 * operation like a single SEND/RECV with the same seq would; what the peer disagrees on (count,
 * dtype) is reported as for single SEND/RECV.
 */
#ifndef MNCL_PLUGIN_V4_H
#define MNCL_PLUGIN_V4_H

#include "mncl_plugin_v3.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_PLUGIN_ABI_V4 4u

/* The kind added by v4 (v1..v3 keep 0..13). */
typedef enum mncl_coll_kind_v4 { MNCL_COLL_SENDRECV_BATCH = 14 } mncl_coll_kind_v4_t;
#define MNCL_NUM_COLL_KINDS_V4 15
/* Every kind v4 defines. */
#define MNCL_COLL_MASK_ALL_V4 ((1u << MNCL_NUM_COLL_KINDS_V4) - 1u)

/* One op of a SENDRECV_BATCH. */
typedef struct mncl_p2p_v4 {
  int32_t kind;      /* MNCL_COLL_SEND or MNCL_COLL_RECV */
  int32_t peer;      /* the other rank: in [0, size), never this rank */
  int32_t dtype;     /* mncl_dtype_t */
  int32_t reserved0; /* zero */
  void *buf;         /* SEND: read only; may be NULL only when count is 0 */
  size_t count;      /* elements; 0 is an empty message, which still matches its peer's */
  /* 0, 1, 2... per (communicator, peer, direction), shared with single SEND/RECV: a send and
   * the receive that matches it carry the same seq, whether either is in a batch or not. */
  uint64_t seq;
} mncl_p2p_v4_t;

/* v3's table, field for field; abi_version is MNCL_PLUGIN_ABI_V4 and coll_mask may carry
 * MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH). Fields keep the meanings documented in
 * mncl_plugin_v1.h and mncl_plugin_v2.h. */
typedef struct mncl_plugin_v4 {
  size_t struct_size;   /* sizeof(mncl_plugin_v4_t) */
  uint32_t magic;       /* MNCL_PLUGIN_MAGIC */
  uint32_t abi_version; /* MNCL_PLUGIN_ABI_V4 */
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
} mncl_plugin_v4_t;

/* The symbol name a v4 plugin exports. */
#define MNCL_PLUGIN_V4_SYMBOL "mncl_plugin_v4"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_PLUGIN_V4_H */

/*
 * mncl_plugin_v2.h — plugin ABI version 2. FROZEN: never edit a released version of this file;
 * a change is a new header (mncl_plugin_v3.h) plus an adapter for v2 in the core.
 *
 * What v2 adds to v1: one capability, MNCL_CAP_CONCURRENT_P2P, and the threading contract that
 * goes with it. The table has exactly v1's fields in v1's order; every other type (host
 * services, store, bootstrap, probe, collective descriptor) is v1's and keeps v1's meaning.
 * A plugin implementing v2 exports
 *
 *     extern const mncl_plugin_v2_t mncl_plugin_v2;
 *
 * and, to stay loadable by cores that only know v1, may export mncl_plugin_v1 as well (the same
 * functions, abi_version 1, without MNCL_CAP_CONCURRENT_P2P). A core takes the newest table it
 * knows.
 *
 * Why: a core serving a backend whose execute() blocks must run non-blocking operations on
 * threads of its own. With v1's rule (one thread per communicator at a time) they run in issue
 * order on one thread, so a rank that posts irecv(peer) before isend(peer) while its peer does
 * the same waits for a message that is queued behind its own receive: MPI programs that are
 * correct everywhere else hang until the timeout. MNCL_CAP_CONCURRENT_P2P lets the core run
 * point-to-point operations on their own lanes, beside the collectives.
 *
 * Threading, with MNCL_CAP_CONCURRENT_P2P (without it: exactly v1's rule):
 *   - execute() may be called on one communicator by several threads at once, provided that at
 *     any moment at most one of the running calls is a collective (any kind but SEND and RECV),
 *     at most one is a SEND to a given peer and at most one is a RECV from a given peer.
 *   - SENDs to one peer are executed in seq order, one after the other; so are RECVs from one
 *     peer; collectives in seq order, as in v1. Nothing orders a SEND against a RECV or a
 *     collective: a plugin must not assume that an earlier-issued operation has completed.
 *   - A blocked call must never keep another running call from progressing: a RECV waiting for
 *     its message, a SEND waiting for its receiver and a collective waiting for its peers each
 *     make progress on their own (separate channels, or locks never held across a wait).
 *   - comm_create, comm_split and comm_destroy are never concurrent with any other call on that
 *     communicator; comm_abort may come from any thread at any time, as in v1, and must make
 *     every running call return MNCL_ERR_ABORTED soon.
 *   - host->set_error sets the calling thread's message, so concurrent calls keep theirs apart;
 *     the store table was already thread-safe in v1.
 * The capability is ignored with MNCL_CAP_NATIVE_ASYNC (post/test: the plugin orders its own
 * operations) and with MNCL_CAP_STREAM_ORDERED (execute enqueues on the caller's stream).
 */
#ifndef MNCL_PLUGIN_V2_H
#define MNCL_PLUGIN_V2_H

#include "mncl_plugin_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_PLUGIN_ABI_V2 2u

/* Capability added by v2 (the v1 bits, MNCL_CAP_HOST_MEMORY..MNCL_CAP_STREAM_ORDERED, keep their
 * values and meanings). A v1 table's bit 4 means nothing: the core clears it. */
#define MNCL_CAP_CONCURRENT_P2P (1ull << 4) /* execute() follows the concurrent rule above */

/* v1's table, field for field; abi_version is MNCL_PLUGIN_ABI_V2 and caps may carry
 * MNCL_CAP_CONCURRENT_P2P. Fields keep the meanings documented in mncl_plugin_v1.h. */
typedef struct mncl_plugin_v2 {
  size_t struct_size;   /* sizeof(mncl_plugin_v2_t) */
  uint32_t magic;       /* MNCL_PLUGIN_MAGIC */
  uint32_t abi_version; /* MNCL_PLUGIN_ABI_V2 */
  const char *name;
  const char *version;
  uint64_t caps; /* MNCL_CAP_* */
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
} mncl_plugin_v2_t;

/* The symbol name a v2 plugin exports. */
#define MNCL_PLUGIN_V2_SYMBOL "mncl_plugin_v2"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_PLUGIN_V2_H */

/*
 * mncl_plugin_v1.h — plugin ABI version 1. FROZEN: never edit a released version of this file;
 * a change is a new header (mncl_plugin_v2.h) plus an adapter for v1 in the core.
 *
 * A backend plugin is a shared library named libmncl-<name>.so that exports, with default
 * visibility and C linkage, one constant table per plugin-ABI version it implements:
 *
 *     extern const mncl_plugin_v1_t mncl_plugin_v1;
 *
 * and nothing else (build with -fvisibility=hidden). The core looks for mncl_plugin_vN from the
 * newest N it knows down to 1, checks magic / abi_version / struct_size, and refuses a plugin it
 * cannot use with a logged reason naming the file and both version ranges.
 *
 * Threading: init/finalize are called once per load, serialized. comm_* and execute for one
 * plugin communicator are called by one thread at a time, except comm_abort, which may come
 * from any thread while another call on the same communicator is blocked; it must make that call
 * return MNCL_ERR_ABORTED soon (the store callbacks below also return MNCL_ERR_ABORTED after an
 * abort, so a plugin that only waits on the store gets this for free).
 *
 * Errors: return a status; describe the failure with host->set_error() before returning. The
 * core validates every argument before calling in (handles, enums, buffers, counts, roots,
 * overlaps), so plugins may trust descriptors. No C++ exception may leave a plugin function.
 */
#ifndef MNCL_PLUGIN_V1_H
#define MNCL_PLUGIN_V1_H

#include <stddef.h>
#include <stdint.h>

#include "mncl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_PLUGIN_ABI_V1 1u
#define MNCL_PLUGIN_MAGIC 0x504c4e4du /* "MNLP" */

/* ---------------------------------------------------------------------------------------------
 * Log levels and the host services a plugin receives at init.
 * ------------------------------------------------------------------------------------------- */

typedef enum mncl_log_level_v1 {
  MNCL_LOG_NONE = 0,
  MNCL_LOG_ERROR = 1,
  MNCL_LOG_WARN = 2,
  MNCL_LOG_INFO = 3,
  MNCL_LOG_TRACE = 4
} mncl_log_level_v1_t;

typedef struct mncl_host_v1 {
  size_t struct_size; /* sizeof(mncl_host_v1_t) as compiled by the core */
  int32_t version;    /* the core's MNCL_VERSION */
  int32_t log_level;  /* messages above this level are dropped; test it before formatting */
  /* printf-style logging into the core's log, tagged with the plugin's name. */
  void (*log)(int32_t level, const char *file, int32_t line, const char *fmt, ...);
  /* Sets the calling thread's error message, returned to the application with the status. */
  void (*set_error)(const char *fmt, ...);
  /* Reads a configuration variable (MNCL_GLOO_IFACE...) through the core, which logs it and
   * hides it from setuid programs. NULL if unset. The string lives until the next call. */
  const char *(*get_env)(const char *name);
} mncl_host_v1_t;

/* ---------------------------------------------------------------------------------------------
 * The bootstrap key-value store, one per communicator: keys are already prefixed by the core
 * with the communicator's unique namespace, so plugins use short names ("seq12/r3"). Every
 * call is thread-safe. A plugin must delete the keys it creates once every reader has them.
 * ------------------------------------------------------------------------------------------- */

typedef struct mncl_store_v1 {
  size_t struct_size; /* sizeof(mncl_store_v1_t) */
  void *ctx;          /* pass back as the first argument */
  /* Creates or overwrites key. */
  mncl_status_t (*set)(void *ctx, const char *key, const void *value, size_t len);
  /* Waits up to timeout_ms for key, then returns a copy in *value (release with release()).
   * MNCL_ERR_TIMEOUT with a message naming the key if it never appears. get and wait end
   * early with MNCL_ERR_ABORTED once this rank aborted the communicator, and with
   * MNCL_ERR_REMOTE once the core knows another rank exited or aborted (the message names it;
   * pass it on). */
  mncl_status_t (*get)(void *ctx, const char *key, void **value, size_t *len, int64_t timeout_ms);
  void (*release)(void *ctx, void *value);
  /* Atomically adds delta to the integer stored at key (absent: 0); *result = the new value. */
  mncl_status_t (*add)(void *ctx, const char *key, int64_t delta, int64_t *result);
  /* Waits up to timeout_ms until every key exists. */
  mncl_status_t (*wait)(void *ctx, const char *const *keys, size_t nkeys, int64_t timeout_ms);
  /* Deletes key (absent is not an error). */
  mncl_status_t (*del)(void *ctx, const char *key);
} mncl_store_v1_t;

/* ---------------------------------------------------------------------------------------------
 * What comm_create receives.
 * ------------------------------------------------------------------------------------------- */

typedef struct mncl_bootstrap_v1 {
  size_t struct_size; /* sizeof(mncl_bootstrap_v1_t) */
  int32_t rank;       /* 0 <= rank < size */
  int32_t size;
  int32_t local_rank;           /* rank among the ranks on this host (-1 unknown) */
  int32_t local_size;           /* ranks on this host (-1 unknown) */
  int32_t num_hosts;            /* distinct hosts in the communicator (-1 unknown) */
  int32_t device;               /* accelerator ordinal chosen by the core (-1: none) */
  int64_t timeout_ms;           /* default bound on every blocking step */
  const char *comm_id;          /* unique name of this communicator in the job ("w", "w.s1.0") */
  const mncl_store_v1_t *store; /* valid until comm_destroy returns */
} mncl_bootstrap_v1_t;

/* ---------------------------------------------------------------------------------------------
 * What probe receives: facts about the job and the machine. Fields may be -1 when unknown.
 * ------------------------------------------------------------------------------------------- */

typedef struct mncl_probe_v1 {
  size_t struct_size; /* sizeof(mncl_probe_v1_t) */
  int32_t size;       /* ranks in the job */
  int32_t local_size; /* ranks on this host */
  int32_t num_hosts;
  int32_t num_gpus;        /* NVIDIA GPUs visible on this host */
  int32_t has_infiniband;  /* 1 if an InfiniBand/RoCE device is present */
  int32_t launched_by_mpi; /* 1 if mpirun/srun-with-PMI launched this process */
} mncl_probe_v1_t;

/* ---------------------------------------------------------------------------------------------
 * Capabilities (mncl_plugin_v1_t.caps)
 * ------------------------------------------------------------------------------------------- */

#define MNCL_CAP_HOST_MEMORY (1ull << 0)    /* buffers in host memory */
#define MNCL_CAP_CUDA_MEMORY (1ull << 1)    /* CUDA device pointers, passed through unchanged */
#define MNCL_CAP_NATIVE_ASYNC (1ull << 2)   /* post/test implemented */
#define MNCL_CAP_STREAM_ORDERED (1ull << 3) /* execute() enqueues on the stream and returns */

/* ---------------------------------------------------------------------------------------------
 * Collective descriptors
 * ------------------------------------------------------------------------------------------- */

typedef enum mncl_coll_kind_v1 {
  MNCL_COLL_ALLREDUCE = 0,
  MNCL_COLL_REDUCE = 1,
  MNCL_COLL_BCAST = 2,
  MNCL_COLL_SCATTER = 3,
  MNCL_COLL_GATHER = 4,
  MNCL_COLL_ALLGATHER = 5,
  MNCL_COLL_REDUCE_SCATTER = 6,
  MNCL_COLL_ALLTOALL = 7,
  MNCL_COLL_BARRIER = 8,
  MNCL_COLL_SEND = 9,
  MNCL_COLL_RECV = 10,
  MNCL_COLL_ALLREDUCE_COALESCED = 11
} mncl_coll_kind_v1_t;
#define MNCL_NUM_COLL_KINDS_V1 12
/* coll_mask bit for a kind */
#define MNCL_COLL_BIT(kind) (1u << (kind))
/* Everything but the coalesced allreduce, which the core emulates by looping when absent. */
#define MNCL_COLL_MASK_ALL_V1 (MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED) - 1u)

typedef struct mncl_coll_v1 {
  size_t struct_size; /* sizeof(mncl_coll_v1_t) */
  int32_t kind;       /* mncl_coll_kind_v1_t */
  int32_t dtype;      /* mncl_dtype_t */
  int32_t op;         /* mncl_op_t; reductions only */
  int32_t root;       /* rooted kinds: the root; SEND/RECV: the peer; otherwise -1 */
  /* Buffers and count with the meaning of the public function of the same name (mncl.h),
   * in-place forms included. BCAST uses recvbuf only (sendbuf == recvbuf). */
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  /* ALLREDUCE_COALESCED only: nbufs buffers of counts[i] elements each. */
  size_t nbufs;
  const void *const *sendbufs;
  void *const *recvbufs;
  const size_t *counts;
  void *stream; /* caller's stream or NULL */
  /* Collectives: 0, 1, 2... per communicator, counting collectives only (not send/recv), so the
   * same call has the same seq on every rank. SEND/RECV: 0, 1, 2... per (communicator, peer,
   * direction), so a send and the receive that matches it carry the same seq. */
  uint64_t seq;
  int64_t timeout_ms; /* bound for this operation */
} mncl_coll_v1_t;

/* ---------------------------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------------------------- */

typedef struct mncl_plugin_v1 {
  size_t struct_size;   /* sizeof(mncl_plugin_v1_t) */
  uint32_t magic;       /* MNCL_PLUGIN_MAGIC */
  uint32_t abi_version; /* MNCL_PLUGIN_ABI_V1 */
  const char *name;     /* "naive": matches libmncl-<name>.so and MNCL_BACKEND */
  const char *version;  /* the plugin's own version, free form ("0.1.0 (gloo 2022-05)") */
  uint64_t caps;        /* MNCL_CAP_* */
  uint32_t coll_mask;   /* MNCL_COLL_BIT(kind) for each kind execute() handles */
  uint32_t dtype_mask;  /* 1u << dtype for each dtype supported */
  uint32_t op_mask;     /* 1u << op for each reduction operator supported */
  uint32_t reserved0;   /* zero */

  /* Called once after loading, before anything else. May refuse (e.g. missing driver). */
  mncl_status_t (*init)(const mncl_host_v1_t *host);
  /* Called once before unloading, after every communicator is destroyed. May be NULL. */
  void (*finalize)(void);
  /* Local and cheap: can this plugin serve this job here? *score: higher is better, 0 means
   * unusable and `reason` (a NUL-terminated string of at most reason_len bytes) says why. */
  mncl_status_t (*probe)(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                         size_t reason_len);

  /* Collective over bs->size ranks. *comm is the plugin's own handle. */
  mncl_status_t (*comm_create)(const mncl_bootstrap_v1_t *bs, void **comm);
  mncl_status_t (*comm_destroy)(void *comm);
  mncl_status_t (*comm_abort)(void *comm);
  /* Optional (NULL: the core gathers colors and keys through the store and calls comm_create
   * on the members with a new bootstrap). When present it is called on every rank of the
   * parent, like MPI_Comm_split: bs describes the new communicator, or is NULL on a rank that
   * passed color MNCL_SPLIT_NONE, which must then set *newcomm = NULL. */
  mncl_status_t (*comm_split)(void *comm, int32_t color, int32_t key, const mncl_bootstrap_v1_t *bs,
                              void **newcomm);

  /* Runs one collective to completion (or, with MNCL_CAP_STREAM_ORDERED, until it is enqueued
   * on coll->stream). */
  mncl_status_t (*execute)(void *comm, const mncl_coll_v1_t *coll);
  /* Optional, with MNCL_CAP_NATIVE_ASYNC: start a collective, then poll it. test() sets
   * *done = 1 exactly once, releasing the handle, and returns the operation's status. */
  mncl_status_t (*post)(void *comm, const mncl_coll_v1_t *coll, void **handle);
  mncl_status_t (*test)(void *comm, void *handle, int32_t *done);
} mncl_plugin_v1_t;

/* The symbol name a v1 plugin exports. */
#define MNCL_PLUGIN_V1_SYMBOL "mncl_plugin_v1"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_PLUGIN_V1_H */

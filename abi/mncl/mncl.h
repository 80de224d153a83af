/*
 * mncl.h — the MNCL application API (C99, stable ABI).
 *
 * Contract, in short:
 *  - Every function returns an mncl_status_t (except the few pure queries noted) and never lets
 *    an exception, a signal or an abort() escape. On failure the calling thread's
 *    mncl_last_error() names what was wrong ("mncl_allreduce: root 5 is out of range for a
 *    communicator of size 4").
 *  - Handles are opaque pointers. Structs that cross the boundary start with their size; callers
 *    fill them with the *_INIT macro, and the library reads min(caller size, own size) bytes,
 *    defaulting anything newer, so old callers keep working and new callers can run on an old
 *    library as long as their extra fields are zero.
 *  - Enumerators are never renumbered or removed; new ones are appended.
 *  - Every blocking call is bounded by the communicator's timeout (config.timeout_ms, else
 *    MNCL_TIMEOUT, else 300 s): a dead or silent peer yields MNCL_ERR_TIMEOUT or
 *    MNCL_ERR_REMOTE naming the peer, never a hang. After an operation failed with
 *    MNCL_ERR_TIMEOUT, MNCL_ERR_REMOTE or MNCL_ERR_ABORTED, what the communicator can still do
 *    depends on the backend (gloo, shm and flat refuse every later call as unusable after the
 *    failure; naive goes on, the failed operation's message number used up): portable code
 *    destroys it and makes a new one (a split of a healthy parent, or a new job).
 *  - Collectives are issued by one thread per communicator at a time, in the same order on every
 *    rank (as in MPI and NCCL). mncl_comm_abort() may be called from any thread at any time.
 */
#ifndef MNCL_MNCL_H
#define MNCL_MNCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MNCL_API
#elif defined(__GNUC__)
#define MNCL_API __attribute__((visibility("default")))
#else
#define MNCL_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

#define MNCL_VERSION_MAJOR 0
#define MNCL_VERSION_MINOR 1
#define MNCL_VERSION_PATCH 0
/* Encoded as major * 10000 + minor * 100 + patch. */
#define MNCL_VERSION_CODE(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))
#define MNCL_VERSION MNCL_VERSION_CODE(MNCL_VERSION_MAJOR, MNCL_VERSION_MINOR, MNCL_VERSION_PATCH)
/* The ABI major: part of the SONAME (libmncl.so.1). Bumped only by an incompatible change. */
#define MNCL_ABI_MAJOR 1

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */

typedef enum mncl_status {
  MNCL_OK = 0,
  MNCL_ERR_INVALID_ARGUMENT = 1, /* a caller error: bad handle, pointer, enum, count, root... */
  MNCL_ERR_NOT_SUPPORTED = 2,    /* valid, but this backend or build cannot do it */
  MNCL_ERR_TIMEOUT = 3,          /* a blocking step did not finish within the timeout */
  MNCL_ERR_REMOTE = 4,           /* a peer failed, disconnected or disagreed */
  MNCL_ERR_ABORTED = 5,          /* the communicator was aborted (mncl_comm_abort) */
  MNCL_ERR_PLUGIN = 6,           /* no usable plugin: missing, refused, wrong ABI, init failed */
  MNCL_ERR_BOOTSTRAP = 7,        /* rendezvous failed: store unreachable, bad address */
  MNCL_ERR_SYSTEM = 8,           /* an OS call failed (out of memory, sockets, files) */
  MNCL_ERR_INTERNAL = 9,         /* a bug in MNCL or a plugin: please report it */
  MNCL_IN_PROGRESS = 10          /* not an error: a non-blocking operation is still running */
} mncl_status_t;

/* ---------------------------------------------------------------------------------------------
 * Data types and reduction operators
 * ------------------------------------------------------------------------------------------- */

typedef enum mncl_dtype {
  MNCL_INT8 = 0,
  MNCL_UINT8 = 1,
  MNCL_INT32 = 2,
  MNCL_UINT32 = 3,
  MNCL_INT64 = 4,
  MNCL_UINT64 = 5,
  MNCL_FLOAT16 = 6,  /* IEEE 754 binary16 */
  MNCL_BFLOAT16 = 7, /* bfloat16: the upper half of a binary32 */
  MNCL_FLOAT32 = 8,
  MNCL_FLOAT64 = 9
} mncl_dtype_t;
/* One past the last dtype of this header version (grows when dtypes are appended). */
#define MNCL_NUM_DTYPES 10

/*
 * Reductions. Integer SUM and PROD wrap modulo 2^bits (two's complement); AVG is the SUM divided
 * by the communicator size (integer division truncating toward zero for integer types).
 * FLOAT16 and BFLOAT16 may be accumulated in float32 and rounded once at the end; results of
 * floating-point reductions may differ in the last bits between backends (summation order).
 * Floating-point MIN and MAX propagate NaN (a NaN on any rank gives NaN), as torch.min/max do,
 * on every bundled host backend; on nccl, NCCL's own rules apply.
 */
typedef enum mncl_op {
  MNCL_SUM = 0,
  MNCL_PROD = 1,
  MNCL_MIN = 2,
  MNCL_MAX = 3,
  MNCL_AVG = 4
} mncl_op_t;
#define MNCL_NUM_OPS 5

/* ---------------------------------------------------------------------------------------------
 * Handles
 * ------------------------------------------------------------------------------------------- */

typedef struct mncl_comm *mncl_comm_t;       /* a communicator: a group of ranks */
typedef struct mncl_request *mncl_request_t; /* one non-blocking operation in flight */

/* ---------------------------------------------------------------------------------------------
 * Communicator configuration
 * ------------------------------------------------------------------------------------------- */

#define MNCL_CONFIG_MAGIC 0x4d4e434cu /* "MNCL" */
/* A value of -1 (or NULL) in a field means "take it from the environment, else the default". */
#define MNCL_FROM_ENV (-1)

typedef struct mncl_config {
  size_t struct_size;    /* sizeof(mncl_config_t) as compiled by the caller */
  uint32_t magic;        /* MNCL_CONFIG_MAGIC */
  uint32_t version;      /* MNCL_VERSION the caller compiled against */
  const char *backend;   /* "naive", "gloo", a path to a plugin .so, a comma list of
                            fallbacks, or "auto"; NULL: MNCL_BACKEND, else "auto" */
  int32_t rank;          /* this process's rank; -1: MNCL_RANK if set, else the rank of the
                            first launcher that sets both its rank and its size, looked at in
                            the order RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/
                            OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS
                            (Slurm's only inside an srun step: SLURM_STEP_ID set). Another
                            launcher that sets both to other values is an error
                            (MNCL_ERR_INVALID_ARGUMENT naming both pairs; exceptions, such as
                            Slurm's around mpirun: README.md). A lone variable of another
                            launcher is ignored (a stale RANK under mpirun), with a warning for
                            one looked at earlier whose value differs; else, when no launcher
                            sets both, the first of those rank variables that is set (a lone
                            RANK is used only then); else 0 */
  int32_t size;          /* number of ranks; -1: MNCL_SIZE if set, else the same lookup over
                            the size variables (WORLD_SIZE, ...), else 1 */
  const char *bootstrap; /* "tcp://host:port" (rank 0 hosts the store there) or "file:///dir";
                            NULL: MNCL_STORE, else MASTER_ADDR/MASTER_PORT; needed if size > 1 */
  int64_t timeout_ms;    /* bound on every blocking step, at most one week (604800000 ms);
                          * -1: MNCL_TIMEOUT (seconds), else 300 s */
  int32_t device;        /* accelerator ordinal; -1: MNCL_DEVICE, else the local rank */
  int32_t reserved0;     /* must be zero */
} mncl_config_t;

#define MNCL_CONFIG_INIT                                                                        \
  {                                                                                             \
    sizeof(mncl_config_t), MNCL_CONFIG_MAGIC, MNCL_VERSION, NULL, MNCL_FROM_ENV, MNCL_FROM_ENV, \
        NULL, MNCL_FROM_ENV, MNCL_FROM_ENV, 0                                                   \
  }

/* ---------------------------------------------------------------------------------------------
 * Library queries
 * ------------------------------------------------------------------------------------------- */

/* The library's MNCL_VERSION (which may be newer than the header the caller compiled with). */
MNCL_API int mncl_get_version(void);
/* A static, human-readable name for a status ("MNCL_ERR_TIMEOUT: operation timed out"). */
MNCL_API const char *mncl_status_string(mncl_status_t status);
/* The message of the last failed call on this thread ("" if none), as errno: a call that
 * succeeds leaves it as it was. Valid until the next MNCL call on this thread. */
MNCL_API const char *mncl_last_error(void);
/* Element size in bytes, or 0 for an unknown dtype. */
MNCL_API size_t mncl_dtype_size(mncl_dtype_t dtype);
/* Static names ("float32", "sum"), or "unknown". */
MNCL_API const char *mncl_dtype_name(mncl_dtype_t dtype);
MNCL_API const char *mncl_op_name(mncl_op_t op);

/* ---------------------------------------------------------------------------------------------
 * Communicators
 * ------------------------------------------------------------------------------------------- */

/*
 * Collective over all `size` ranks: rendezvous through the bootstrap store, agree on one backend
 * (a disagreement fails on every rank, naming each rank's choice), and create it.
 * `config` may be NULL (everything from the environment).
 */
MNCL_API mncl_status_t mncl_comm_create(const mncl_config_t *config, mncl_comm_t *comm);
/* Collective: waits (bounded by the timeout) for in-flight operations, then frees everything.
 * Requests still pending keep their operation's result for mncl_test / mncl_wait; one that
 * destroy had to cut short (past its timeout) reports MNCL_ERR_TIMEOUT or MNCL_ERR_ABORTED.
 * Calls on `comm` by other threads (misuse, but never a crash): destroy first waits for those
 * already inside (each ends by its own timeout, or at once after mncl_comm_abort); one that
 * starts once destroy has begun, and any later call with the handle, fails with
 * MNCL_ERR_INVALID_ARGUMENT. If those inside outlast the timeout + 30 s, destroy returns
 * MNCL_ERR_TIMEOUT and leaves the communicator to the process's exit. The handle itself (about
 * 200 bytes) is never freed, so that a stale handle is always refused, never taken for a newer
 * communicator's. Posted requests are waited for too, each up to its own timeout: to tear a
 * group down at once, mncl_comm_abort it first.
 * Communicators may be destroyed in any order that is the same on every rank (destroy is
 * collective; a parent before its children: they keep working, and may be split further). On
 * a TCP store (tcp://, mncl-run's and torchrun-style launches), the process of world rank 0
 * serves the store: its last mncl_comm_destroy of the job returns
 * once every other process has destroyed all of its own (or ended), since their communicators,
 * even those rank 0 is no member of, use that store; bounded by the timeout, past which it
 * warns and the store goes without them (their later calls that need the store fail with
 * MNCL_ERR_REMOTE: creations, splits, destroys, and every operation of a backend that moves
 * its data through the store, as naive; those of gloo, shm and flat may still work), and
 * cut short by mncl_comm_abort (MNCL_ERR_ABORTED). When that last communicator was aborted
 * before its destroy, the store stays up about 1.5 s at most, as for mncl_comm_abort. The other
 * processes' destroys do not wait for rank 0's; a world they create again on the address
 * reaches the next server once rank 0 has made it. */
MNCL_API mncl_status_t mncl_comm_destroy(mncl_comm_t comm);
/* Local, any thread: every blocked or later operation on `comm` fails with MNCL_ERR_ABORTED.
 * The other ranks' operations waiting on this one fail too, naming it, rather than time out:
 * MNCL_ERR_ABORTED (gloo: MNCL_ERR_REMOTE, its connections closed), on every backend (limits:
 * README.md). They learn of it from a note this call leaves in the communicator's store
 * (waited for at most 0.2 s), read while an operation has waited 0.2 s or more, and then fail
 * every such operation of the communicator, not only those on this rank. On the job's TCP
 * store host, a later mncl_comm_destroy of the aborted communicator keeps the store up for
 * about 1.5 s at most, until the other ranks have left or exited, so that they can read it.
 * An operation that had returned on this rank before its abort is not failed on the ranks
 * still finishing it where they already have what they need from this one (naive, shm; gloo's
 * closed connections may still end it there with MNCL_ERR_REMOTE).
 * The handle stays valid until mncl_comm_destroy returns. Calling it twice is harmless. During
 * a mncl_comm_destroy on another thread it cuts short destroy's waits for the other ranks to
 * leave (a peer that died); that destroy then returns MNCL_ERR_ABORTED, and the communicator is
 * freed. A backend's own teardown (gloo's final exchange, NCCL's finalize) is bounded by the
 * timeout instead. */
MNCL_API mncl_status_t mncl_comm_abort(mncl_comm_t comm);
/* Collective: ranks passing the same color form a new communicator, ordered by (key, old rank).
 * color MNCL_SPLIT_NONE: this rank joins none and *newcomm is set to NULL. */
#define MNCL_SPLIT_NONE (-1)
MNCL_API mncl_status_t mncl_comm_split(mncl_comm_t comm, int color, int key, mncl_comm_t *newcomm);
/*
 * (MNCL_1.4) mncl_comm_split with settings for the new communicator. `config` may be NULL (then
 * it is mncl_comm_split). In a split, MNCL_FROM_ENV / NULL fields mean "as the parent", not the
 * environment:
 *   backend     the new communicator's backend: a name, a path, a comma list or "auto" (chosen
 *               for the group's own ranks and hosts, e.g. shm for the ranks of one host); the
 *               ranks of one group must pass the same string, else every rank of that group
 *               fails with MNCL_ERR_INVALID_ARGUMENT naming two ranks that differ. NULL: the
 *               parent's backend (a native split where the backend has one, as flat's).
 *   timeout_ms  the new communicator's timeout, the same on every rank of a group (else
 *               MNCL_ERR_INVALID_ARGUMENT there, as for backend); -1: the parent's. The
 *               values passed are compared, not their effect: -1 on one rank and the
 *               parent's timeout spelt out on another differ.
 *   device      its accelerator ordinal; -1: the parent's.
 *   rank, size, bootstrap   must be -1 / NULL: ranks come from (color, key), the store from the
 *               parent (MNCL_ERR_INVALID_ARGUMENT naming the field otherwise).
 * A backend that can only start on every process of the job (flat: MPI_Init, MPI_COMM_WORLD)
 * refuses a smaller group of a parent on another backend with MNCL_ERR_PLUGIN, at once (a
 * group of one rank is allowed, for one flat communicator per process, and then needs every
 * process to make one); split from a flat parent instead (flat splits natively, and other
 * groups may go to other backends).
 */
MNCL_API mncl_status_t mncl_comm_split_config(mncl_comm_t comm, int color, int key,
                                              const mncl_config_t *config, mncl_comm_t *newcomm);
/* (MNCL_1.4) Splits by where the ranks run, as MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) does
 * and as ChainerMN's intra/inter communicators are made. Hosts are told apart by MNCL_HOSTID
 * (default: the host name). */
typedef enum mncl_split_type {
  /* One group per host: the ranks on this rank's host (ChainerMN's intra_rank/intra_size). */
  MNCL_SPLIT_TYPE_HOST = 0,
  /* One group per local rank: the ranks whose position among the ranks of their host equals
   * this rank's, one per host (ChainerMN's inter communicator; group 0 is every host's first
   * rank). A host with fewer ranks has no member in the higher groups. */
  MNCL_SPLIT_TYPE_CROSS_HOST = 1
} mncl_split_type_t;
/* Collective over `comm`: every rank passes the same `type` (else every rank fails with
 * MNCL_ERR_INVALID_ARGUMENT naming the ranks that differ). Ranks of a group are ordered by
 * (key, rank in comm). `config` as in mncl_comm_split_config (NULL: as the parent). */
MNCL_API mncl_status_t mncl_comm_split_type(mncl_comm_t comm, mncl_split_type_t type, int key,
                                            const mncl_config_t *config, mncl_comm_t *newcomm);
MNCL_API mncl_status_t mncl_comm_rank(mncl_comm_t comm, int *rank);
MNCL_API mncl_status_t mncl_comm_size(mncl_comm_t comm, int *size);
/* (MNCL_1.5) Where this rank runs among the communicator's ranks, by the hosts
 * MNCL_SPLIT_TYPE_HOST groups by, without a collective call: *local_rank is its place among the
 * ranks of its host (in rank order: its rank in the MNCL_SPLIT_TYPE_HOST communicator with equal
 * keys), *local_size how many ranks share that host, *host_index its host's number (hosts in the
 * order of their first rank: the color MNCL_SPLIT_TYPE_HOST gives it) and *num_hosts how many
 * hosts the communicator spans. ChainerMN's intra_rank, intra_size, inter_rank and inter_size.
 * Hosts are told apart by MNCL_HOSTID, as by the split; the default device follows the
 * launcher's local rank where one is given (LOCAL_RANK...), which may differ. Any pointer may be
 * NULL. */
MNCL_API mncl_status_t mncl_comm_host_info(mncl_comm_t comm, int *local_rank, int *local_size,
                                           int *host_index, int *num_hosts);
/* The backend's name ("naive"); the string lives as long as the process. */
MNCL_API mncl_status_t mncl_comm_backend(mncl_comm_t comm, const char **name);

/* ---------------------------------------------------------------------------------------------
 * Collectives
 *
 * Buffers are host memory unless the backend advertises device memory (CUDA pointers then).
 * `stream` is optional (NULL): a cudaStream_t for CUDA memory; host-only backends ignore it.
 * A stream that is capturing a CUDA graph: a stream-ordered backend (nccl) records the
 * collective into the graph, where it runs on every launch (mncl_test / mncl_wait report it
 * done at once; host buffers are refused); any other backend refuses the call with
 * MNCL_ERR_NOT_SUPPORTED and leaves the capture intact.
 * `count` is in elements. In-place forms (no extra copy) are selected by pointer equality:
 *   allreduce:       sendbuf == recvbuf
 *   reduce:          sendbuf == recvbuf at the root (recvbuf is ignored on other ranks)
 *   scatter:         recvbuf == sendbuf + rank*count at the root (sendbuf ignored elsewhere)
 *   gather:          sendbuf == recvbuf + rank*count at the root (recvbuf ignored elsewhere)
 *   allgather:       sendbuf == recvbuf + rank*count
 *   reduce_scatter:  recvbuf == sendbuf + rank*recvcount
 *   alltoall:        sendbuf == recvbuf
 * Any other overlap between send and receive buffers is MNCL_ERR_INVALID_ARGUMENT.
 * ------------------------------------------------------------------------------------------- */

/* recvbuf[i] = op over ranks of sendbuf[i], on every rank. */
MNCL_API mncl_status_t mncl_allreduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t count, mncl_dtype_t dtype, mncl_op_t op, void *stream);
/* Like allreduce, but the result only lands on `root`. */
MNCL_API mncl_status_t mncl_reduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                   size_t count, mncl_dtype_t dtype, mncl_op_t op, int root,
                                   void *stream);
/* buf on every rank = buf on root. */
MNCL_API mncl_status_t mncl_bcast(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                  int root, void *stream);
/* Rank r receives elements [r*count, (r+1)*count) of root's sendbuf (size*count elements). */
MNCL_API mncl_status_t mncl_scatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                    size_t count, mncl_dtype_t dtype, int root, void *stream);
/* Root's recvbuf (size*count elements) holds rank r's sendbuf at [r*count, (r+1)*count). */
MNCL_API mncl_status_t mncl_gather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                   size_t count, mncl_dtype_t dtype, int root, void *stream);
/* Like gather, onto every rank. */
MNCL_API mncl_status_t mncl_allgather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t count, mncl_dtype_t dtype, void *stream);
/* sendbuf has size*recvcount elements; rank r receives the reduction of block r. */
MNCL_API mncl_status_t mncl_reduce_scatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                           size_t recvcount, mncl_dtype_t dtype, mncl_op_t op,
                                           void *stream);
/* Block j (count elements) of rank i's sendbuf lands in block i of rank j's recvbuf. */
MNCL_API mncl_status_t mncl_alltoall(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                     size_t count, mncl_dtype_t dtype, void *stream);
MNCL_API mncl_status_t mncl_barrier(mncl_comm_t comm, void *stream);
/* Point to point: messages between a pair of ranks match in issue order; peer != own rank. */
MNCL_API mncl_status_t mncl_send(mncl_comm_t comm, const void *buf, size_t count,
                                 mncl_dtype_t dtype, int peer, void *stream);
MNCL_API mncl_status_t mncl_recv(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                 int peer, void *stream);
/*
 * Coalesced allreduce: nbufs independent allreduces of one dtype and op in one call
 * (recvbufs[i] = op over ranks of sendbufs[i], counts[i] elements). Backends may pack them into
 * one message (the "flat" communicator of ChainerMN); the result equals nbufs single calls.
 * In place per buffer: sendbufs[i] == recvbufs[i]. A receive buffer overlaps no other buffer of
 * the call (send buffers may share memory); else MNCL_ERR_INVALID_ARGUMENT naming both.
 */
MNCL_API mncl_status_t mncl_allreduce_coalesced(mncl_comm_t comm, const void *const *sendbufs,
                                                void *const *recvbufs, const size_t *counts,
                                                size_t nbufs, mncl_dtype_t dtype, mncl_op_t op,
                                                void *stream);

/*
 * Collectives with a count per rank (symbol version MNCL_1.1; MPI's MPI_Allgatherv and
 * MPI_Alltoallv, with size_t counts). Counts and displacements are in elements, one entry per rank;
 * the arrays are read during the call only. Receive blocks must not overlap; elements of recvbuf
 * outside every block are left untouched. What one rank cannot check (that its counts agree with
 * its peers') fails with MNCL_ERR_REMOTE or MNCL_ERR_TIMEOUT, never with a wrong result; except
 * on nccl, where, as for every other mismatched call, NCCL checks nothing (MNCL_DEBUG_CHECKS=1
 * compares allgatherv's recvcounts, and alltoallv's sendcounts with the peers' recvcounts, first).
 *
 * allgatherv: rank i's sendcount elements land at recvbuf + displs[i] on every rank;
 *   sendcount == recvcounts[rank], and recvcounts/displs are the same on every rank.
 *   In place: sendbuf == recvbuf + displs[rank] (elements).
 * alltoallv: sendcounts[j] elements at sendbuf + sdispls[j] of rank i land at
 *   recvbuf + rdispls[i] of rank j, which expects recvcounts[i] == that count. Not in place.
 */
MNCL_API mncl_status_t mncl_allgatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *displs, mncl_dtype_t dtype, void *stream);
MNCL_API mncl_status_t mncl_alltoallv(mncl_comm_t comm, const void *sendbuf,
                                      const size_t *sendcounts, const size_t *sdispls,
                                      void *recvbuf, const size_t *recvcounts,
                                      const size_t *rdispls, mncl_dtype_t dtype, void *stream);

/*
 * Rooted collectives with a count per rank (symbol version MNCL_1.3; MPI's MPI_Gatherv and
 * MPI_Scatterv, with size_t counts): uneven shards of a dataset, per-rank results of different
 * lengths. The root's arrays (one entry per rank, in elements) are read during the call only.
 * Other ranks ignore the arrays and the blocks' buffer (gatherv's recvbuf, scatterv's sendbuf):
 * they may pass NULL. Blocks on the root follow allgatherv's rules: receive blocks must not
 * overlap, elements outside every block are left untouched. A backend of plugin ABI v5 may run
 * them itself (only the root's blocks move); on any other backend with alltoallv they run as
 * an alltoallv in which only the pairs with the root carry data, and errors raised inside say
 * "(run as an alltoallv)" (a plugin of ABI v1 or v2 refuses them with MNCL_ERR_NOT_SUPPORTED).
 * Counts that disagree between a rank and the root fail with MNCL_ERR_REMOTE or
 * MNCL_ERR_TIMEOUT at least on the rank that receives the block (the root for gatherv, the rank
 * for scatterv; the sending side may complete), never with a wrong result (nccl excepted: NCCL
 * checks nothing; MNCL_DEBUG_CHECKS=1 compares each rank's count with the root's first).
 *
 * gatherv: rank i's sendcount elements land at recvbuf + displs[i] on the root, which expects
 *   recvcounts[i] == that count. In place at the root: sendbuf == recvbuf + displs[root].
 * scatterv: sendcounts[i] elements at sendbuf + displs[i] on the root land in rank i's recvbuf,
 *   where recvcount == sendcounts[i]. Send blocks may overlap (they are only read). In place at
 *   the root: recvbuf == sendbuf + displs[root].
 */
MNCL_API mncl_status_t mncl_gatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                    void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                    mncl_dtype_t dtype, int root, void *stream);
MNCL_API mncl_status_t mncl_scatterv(mncl_comm_t comm, const void *sendbuf,
                                     const size_t *sendcounts, const size_t *displs, void *recvbuf,
                                     size_t recvcount, mncl_dtype_t dtype, int root, void *stream);

/* ---------------------------------------------------------------------------------------------
 * Batched point to point (symbol version MNCL_1.2)
 *
 * Sends and receives to and from any peers, started together and finished together: what NCCL
 * does with ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd, PyTorch with
 * batch_isend_irecv and MPI with MPI_Sendrecv. Every backend progresses all ops of a batch at
 * once, so exchanges that would deadlock as a sequence of calls cannot deadlock here: a ring
 * shift (each rank sends to rank+1 and receives from rank-1), a halo exchange, a pipeline stage
 * sending activations forward while receiving gradients back. On a stream-ordered backend
 * (nccl) this is the only way to run such an exchange at all: there, separate mncl_isend and
 * mncl_irecv calls on one stream run one after the other, as separate NCCL launches do.
 *
 * Not collective: a rank's batch names only its own ops, and ranks with nothing to exchange
 * call nothing. Each op matches one mncl_send/mncl_recv (or batch op) of its peer exactly as
 * mncl_send/mncl_recv do: messages between a pair match in issue order per direction, and a
 * batch issues its ops in array order, after everything issued before it. Counts and dtypes of
 * matching ops must agree (checked where the backend can tell, as for mncl_send/mncl_recv).
 * Rules, checked before anything starts (MNCL_ERR_INVALID_ARGUMENT naming the op's index):
 * peer in [0, size) and not this rank; buf may be NULL only with count 0 (an empty message,
 * which still matches one); receive buffers overlap neither each other nor any send buffer of
 * the batch (send buffers may overlap: one tensor may go to several peers). nops == 0 is a
 * valid batch that does nothing. Buffers must stay untouched until the batch completes.
 * On failure the call (or mncl_wait) returns the status of the first failed op in array order,
 * and mncl_last_error() names that op; every other op has ended too (bounded by the
 * communicator's timeout) before it returns, so no buffer is still in use.
 * ------------------------------------------------------------------------------------------- */

typedef enum mncl_p2p_kind {
  MNCL_P2P_SEND = 0, /* send count elements of buf to peer */
  MNCL_P2P_RECV = 1  /* receive count elements from peer into buf */
} mncl_p2p_kind_t;

/* One op of a batch. The array's elements all carry the same struct_size, which is also the
 * array's stride: a newer caller with a longer struct keeps working as long as its new fields
 * are zero (MNCL_ERR_NOT_SUPPORTED otherwise). This is the struct's first version: a shorter
 * struct_size is refused (MNCL_ERR_INVALID_ARGUMENT). */
typedef struct mncl_p2p_op {
  size_t struct_size; /* sizeof(mncl_p2p_op_t) as compiled by the caller */
  int32_t kind;       /* mncl_p2p_kind_t */
  int32_t peer;       /* the rank sent to or received from */
  void *buf;          /* MNCL_P2P_SEND: read only */
  size_t count;       /* elements */
  int32_t dtype;      /* mncl_dtype_t: each op has its own */
  int32_t reserved0;  /* must be zero */
} mncl_p2p_op_t;

/* One op, struct_size filled in (an inline helper: no exported symbol, C and C++ alike):
 *   mncl_p2p_op_t ops[] = {mncl_p2p_op(MNCL_P2P_SEND, x, n, MNCL_FLOAT32, right), ...}; */
static inline mncl_p2p_op_t mncl_p2p_op(mncl_p2p_kind_t kind, const void *buf, size_t count,
                                        mncl_dtype_t dtype, int peer) {
  mncl_p2p_op_t op;
  op.struct_size = sizeof(mncl_p2p_op_t);
  op.kind = (int32_t)kind;
  op.peer = (int32_t)peer;
  op.buf = (void *)buf; /* a send's buffer is only read */
  op.count = count;
  op.dtype = (int32_t)dtype;
  op.reserved0 = 0;
  return op;
}

/* Runs nops ops (ops may be NULL when nops is 0) and returns when all have completed. */
MNCL_API mncl_status_t mncl_sendrecv_batch(mncl_comm_t comm, const mncl_p2p_op_t *ops, size_t nops,
                                           void *stream);
/* MPI_Sendrecv: a batch of one send of sendcount elements to dest and one receive of recvcount
 * elements from source: op 0 and op 1 in messages. dest and source may be the same peer (a
 * pairwise exchange); neither may be this rank. */
MNCL_API mncl_status_t mncl_sendrecv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                     int dest, void *recvbuf, size_t recvcount, int source,
                                     mncl_dtype_t dtype, void *stream);

/* ---------------------------------------------------------------------------------------------
 * Non-blocking collectives
 *
 * Same arguments as above plus *request. Collectives run in issue order, interleaved correctly
 * with blocking collectives on the same communicator. Point-to-point operations progress
 * independently of collectives and of each other, as in MPI: a rank may post mncl_irecv before
 * the mncl_isend its peer waits for, or before a collective (messages of one pair still match in
 * issue order). Exception: on a backend whose operations are ordered on the caller's CUDA stream
 * (nccl), everything on one stream runs in stream order, as in NCCL. Buffers must stay
 * untouched until completion. A request is completed and freed by mncl_wait, or by mncl_test
 * when it reports done.
 * ------------------------------------------------------------------------------------------- */

MNCL_API mncl_status_t mncl_iallreduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                       size_t count, mncl_dtype_t dtype, mncl_op_t op, void *stream,
                                       mncl_request_t *request);
MNCL_API mncl_status_t mncl_ireduce(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                    size_t count, mncl_dtype_t dtype, mncl_op_t op, int root,
                                    void *stream, mncl_request_t *request);
MNCL_API mncl_status_t mncl_ibcast(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                   int root, void *stream, mncl_request_t *request);
MNCL_API mncl_status_t mncl_iscatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                     size_t count, mncl_dtype_t dtype, int root, void *stream,
                                     mncl_request_t *request);
MNCL_API mncl_status_t mncl_igather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                    size_t count, mncl_dtype_t dtype, int root, void *stream,
                                    mncl_request_t *request);
MNCL_API mncl_status_t mncl_iallgather(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                       size_t count, mncl_dtype_t dtype, void *stream,
                                       mncl_request_t *request);
MNCL_API mncl_status_t mncl_ireduce_scatter(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                            size_t recvcount, mncl_dtype_t dtype, mncl_op_t op,
                                            void *stream, mncl_request_t *request);
MNCL_API mncl_status_t mncl_ialltoall(mncl_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t count, mncl_dtype_t dtype, void *stream,
                                      mncl_request_t *request);
MNCL_API mncl_status_t mncl_ibarrier(mncl_comm_t comm, void *stream, mncl_request_t *request);
MNCL_API mncl_status_t mncl_isend(mncl_comm_t comm, const void *buf, size_t count,
                                  mncl_dtype_t dtype, int peer, void *stream,
                                  mncl_request_t *request);
MNCL_API mncl_status_t mncl_irecv(mncl_comm_t comm, void *buf, size_t count, mncl_dtype_t dtype,
                                  int peer, void *stream, mncl_request_t *request);
MNCL_API mncl_status_t mncl_iallreduce_coalesced(mncl_comm_t comm, const void *const *sendbufs,
                                                 void *const *recvbufs, const size_t *counts,
                                                 size_t nbufs, mncl_dtype_t dtype, mncl_op_t op,
                                                 void *stream, mncl_request_t *request);
MNCL_API mncl_status_t mncl_iallgatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                        void *recvbuf, const size_t *recvcounts,
                                        const size_t *displs, mncl_dtype_t dtype, void *stream,
                                        mncl_request_t *request);
MNCL_API mncl_status_t mncl_ialltoallv(mncl_comm_t comm, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls, mncl_dtype_t dtype, void *stream,
                                       mncl_request_t *request);

/* Non-blocking gatherv and scatterv (MNCL_1.3); the root's arrays are read during the call only. */
MNCL_API mncl_status_t mncl_igatherv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                     void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                     mncl_dtype_t dtype, int root, void *stream,
                                     mncl_request_t *request);
MNCL_API mncl_status_t mncl_iscatterv(mncl_comm_t comm, const void *sendbuf,
                                      const size_t *sendcounts, const size_t *displs, void *recvbuf,
                                      size_t recvcount, mncl_dtype_t dtype, int root, void *stream,
                                      mncl_request_t *request);

/* Non-blocking batch and sendrecv (MNCL_1.2): one request for the whole batch. The ops array
 * is read during the call only; the buffers are in use until the request completes. */
MNCL_API mncl_status_t mncl_isendrecv_batch(mncl_comm_t comm, const mncl_p2p_op_t *ops, size_t nops,
                                            void *stream, mncl_request_t *request);
MNCL_API mncl_status_t mncl_isendrecv(mncl_comm_t comm, const void *sendbuf, size_t sendcount,
                                      int dest, void *recvbuf, size_t recvcount, int source,
                                      mncl_dtype_t dtype, void *stream, mncl_request_t *request);

/* Requests: a handle is never reused, so a completed (freed) one is refused for good with
 * MNCL_ERR_INVALID_ARGUMENT ("not pending"). One thread at a time may test or wait on a request;
 * another thread's call meanwhile is refused with MNCL_ERR_INVALID_ARGUMENT too ("being tested
 * or waited on by another thread").
 *
 * *done = 1 when finished: the request is then freed and the operation's status returned.
 * *done = 0: still running, MNCL_OK returned. */
MNCL_API mncl_status_t mncl_test(mncl_request_t request, int *done);
/* Waits up to timeout_ms (-1, or more than 2^40 ms: until the operation ends, itself bounded
 * by the communicator's timeout counted from the call that issued it). Finished: frees the
 * request and returns the operation's status. Not finished in time: returns MNCL_ERR_TIMEOUT
 * and the request stays valid (wait again, or abort the comm). To tell that from an operation
 * that itself failed with MNCL_ERR_TIMEOUT (freed), call mncl_test: it refuses a freed request. */
MNCL_API mncl_status_t mncl_wait(mncl_request_t request, int64_t timeout_ms);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MNCL_MNCL_H */

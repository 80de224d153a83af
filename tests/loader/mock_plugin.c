/*
 * mock_plugin.c — ONE source built into many test plugins (see CMakeLists.txt), each variant
 * selected by compile definitions, Vulkan-loader style:
 *
 *   MOCK_NAME="mock"        file name part (libmncl-<MOCK_NAME>.so); also the table name unless
 *   MOCK_TABLE_NAME="x"     overrides it (name-mismatch variant)
 *   MOCK_EXPORT_V1=0        do not export mncl_plugin_v1          (default 1)
 *   MOCK_EXPORT_V2=1        export the real v2 table mncl_plugin_v2 (default 0)
 *   MOCK_EXPORT_V3=1        export the real v3 table mncl_plugin_v3 (default 0)
 *   MOCK_EXPORT_V4=1        export the real v4 table mncl_plugin_v4 (default 0)
 *   MOCK_EXPORT_V5=1        export the real v5 table mncl_plugin_v5 (default 0)
 *   MOCK_EXPORT_V6=1        export the hypothetical mncl_plugin_v6 (mncl_plugin_v6_test.h,
 *                           default 0)
 *   MOCK_MAGIC, MOCK_ABI_VERSION                     header fields of the v1 table
 *   MOCK_V2_ABI_VERSION     abi_version of the v2 table (default MNCL_PLUGIN_ABI_V2)
 *   MOCK_SMALL_TABLE=1      struct_size ends before execute (a truncated v1 table)
 *   MOCK_PADDED_TABLE=1     struct_size larger than the v1 table the core knows
 *   MOCK_CAPS, MOCK_COLL_MASK                        capabilities of the v1 table (coll_mask
 *                           default: every v1 kind but send/recv)
 *   MOCK_V2_CAPS            capabilities of the v2..v6 tables (default MOCK_CAPS plus
 *                           MNCL_CAP_CONCURRENT_P2P; like the plugin kit, the v1 copy of a v2
 *                           plugin's table leaves that bit out)
 *   MOCK_V2_COLL_MASK       coll_mask of the v2 table (default MOCK_COLL_MASK)
 *   MOCK_V3_COLL_MASK       coll_mask of the v3 table (default MOCK_COLL_MASK plus v3's
 *                           ALLGATHERV and ALLTOALLV, which execute() serves for one rank)
 *   MOCK_V4_COLL_MASK       coll_mask of the v4 table (default MOCK_V3_COLL_MASK's default
 *                           plus v4's SENDRECV_BATCH: see mock_batch)
 *   MOCK_V5_COLL_MASK       coll_mask of the v5 and v6 tables (default MOCK_V4_COLL_MASK's
 *                           default plus v5's GATHERV and SCATTERV: see mock_rooted_v)
 *   MOCK_ANY_SIZE=1         probe and comm_create accept any size (default: one rank only); at
 *                           more than one rank only batches are meaningful (see mock_batch):
 *                           every other collective still returns this rank's own contribution
 *   MOCK_INIT_FAILS=1       init() refuses with a message
 *   MOCK_INIT_CHECKS_SETTING=1  init() refuses with MNCL_ERR_INVALID_ARGUMENT, naming it, an
 *                           MNCL_MOCK_SETTING other than "ok" (a plugin's bad setting of its own)
 *   MOCK_PROBE_THROWS=1     probe() throws std::runtime_error("probe of <name> threw"); =2: it
 *                           throws an int (not a std::exception). Built with mock_throw.cpp, the
 *                           C++ that throws, and -fexceptions (CMakeLists.txt)
 *   MOCK_PROBE_FAILS_SILENTLY=1  probe() returns MNCL_ERR_INTERNAL without host->set_error
 *   MOCK_MISBEHAVES=1       breaks the ABI as $MNCL_MOCK_MISBEHAVE says (read at each call):
 *                           init_throws (init throws std::runtime_error), throws / throws_int
 *                           (execute throws a std::exception / an int), minus_one /
 *                           in_progress (execute returns -1 / MNCL_IN_PROGRESS), silent (execute
 *                           fails with MNCL_ERR_REMOTE without host->set_error),
 *                           ignores_abort (execute blocks until comm_abort, then 3 s more); only
 *                           collectives other than barrier. With MOCK_ASYNC_STUCK too:
 *                           test_throws (test throws std::runtime_error). Built with
 *                           mock_throw.cpp, as MOCK_PROBE_THROWS
 *   MOCK_UNDEFINED_SYMBOL=1 references a function no library defines (linked without
 *                           --no-undefined): dlopen refuses the file
 *   MOCK_CTOR_EXITS=1       a static initializer prints a line to stderr and _exit(97)s: loading
 *                           the file kills the process
 *   MOCK_NO_EXECUTE=1       execute is NULL
 *   MOCK_POST_ONLY=1        post without test
 *   MOCK_NOOP=1             every collective returns MNCL_OK at once, any size (dispatch cost)
 *   MOCK_HANG=1             any size; every collective but barrier blocks until comm_abort
 *                           (then MNCL_ERR_ABORTED): a plugin that ignores its timeout, for the
 *                           core's watchdog (tests/fault); comm_create first creates the file
 *                           $MNCL_MOCK_CREATE_MARKER and takes $MNCL_MOCK_CREATE_DELAY_MS ms,
 *                           where set (an abort during a split, tests/split), or less, until
 *                           the file $MNCL_MOCK_CREATE_RELEASE exists, where that is set too.
 *                           Each call that blocks first appends
 *                           "<name> blocked rank <r> kind <k> #<seq>" to MNCL_MOCK_EVENTS, so a
 *                           test knows it is in the backend before it issues the next one.
 *                           With MOCK_EXPORT_V2 and SEND/RECV in
 *                           MOCK_V2_COLL_MASK, sends and receives block too, each on its own
 *                           p2p lane beside the collectives (tests/unit/op_history_test)
 *   MOCK_P2P_LANES=1        with MOCK_ANY_SIZE, v4's batch kind and SEND/RECV in the v4 mask:
 *                           sends, receives and batches move no data but take 100 ms, and
 *                           check the v2 rule the core must keep (mncl_plugin_v2.h): at most
 *                           one SEND to a peer at a time (one RECV from it), in seq order, a
 *                           batch's ops counting too. Each appends "<name> <kind> <peer> #<seq>"
 *                           when it starts (kind send, recv, "batch send", "batch recv"), and
 *                           "<name> overlap ..." / "<name> out of order ..." on a breach
 *                           (tests/unit/op_history_test)
 *   MOCK_ASYNC_STUCK=1      with MNCL_CAP_NATIVE_ASYNC in MOCK_CAPS: posted operations never end
 *                           on their own (a plugin that ignores their timeout): test() reports
 *                           one done (MNCL_ERR_ABORTED) only after comm_abort, and never when
 *                           MNCL_MOCK_IGNORE_ABORT=1; comm_destroy fails while one is pending
 *                           (its buffers would still be in use), unless aborts are ignored
 *                           (tests/unit/native_async_destroy_test)
 *
 * The default variant serves single-rank jobs: every collective is a local copy.
 * If MNCL_MOCK_EVENTS names a file, init and finalize append "<name> init"/"<name> finalize"
 * lines to it, so tests can count loads without the plugin exporting anything but its table,
 * MOCK_HANG's blocking calls append "<name> blocked ..." lines (see above),
 * every SENDRECV_BATCH appends "<name> batch rank <r>: <ops>" (see mock_batch), and every
 * GATHERV or SCATTERV "<name> gatherv rank <r> root <R> count <n>" (or scatterv; see
 * mock_rooted_v), so a test can tell the native kind from the core's alltoallv form.
 */
#include <mncl/mncl_plugin.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mncl_plugin_v6_test.h"

#ifndef MOCK_NAME
#error "MOCK_NAME must be defined"
#endif
#ifndef MOCK_TABLE_NAME
#define MOCK_TABLE_NAME MOCK_NAME
#endif
#ifndef MOCK_EXPORT_V1
#define MOCK_EXPORT_V1 1
#endif
#ifndef MOCK_EXPORT_V2
#define MOCK_EXPORT_V2 0
#endif
#ifndef MOCK_EXPORT_V3
#define MOCK_EXPORT_V3 0
#endif
#ifndef MOCK_EXPORT_V4
#define MOCK_EXPORT_V4 0
#endif
#ifndef MOCK_EXPORT_V5
#define MOCK_EXPORT_V5 0
#endif
#ifndef MOCK_EXPORT_V6
#define MOCK_EXPORT_V6 0
#endif
#ifndef MOCK_MAGIC
#define MOCK_MAGIC MNCL_PLUGIN_MAGIC
#endif
#ifndef MOCK_ABI_VERSION
#define MOCK_ABI_VERSION MNCL_PLUGIN_ABI_V1
#endif
#ifndef MOCK_V2_ABI_VERSION
#define MOCK_V2_ABI_VERSION MNCL_PLUGIN_ABI_V2
#endif
#if defined(MOCK_SMALL_TABLE) && MOCK_SMALL_TABLE
#define MOCK_STRUCT_SIZE offsetof(mncl_plugin_v1_t, execute)
#elif defined(MOCK_PADDED_TABLE) && MOCK_PADDED_TABLE
#define MOCK_STRUCT_SIZE (sizeof(mncl_plugin_v1_t) + 64)
#else
#define MOCK_STRUCT_SIZE sizeof(mncl_plugin_v1_t)
#endif
#ifndef MOCK_CAPS
#define MOCK_CAPS MNCL_CAP_HOST_MEMORY
#endif
#ifndef MOCK_V2_CAPS
/* execute() here works on its own arguments only, so concurrent calls cannot disturb each other:
 * the mock keeps v2's concurrent point-to-point promise. */
#define MOCK_V2_CAPS ((MOCK_CAPS) | MNCL_CAP_CONCURRENT_P2P)
#endif
#ifndef MOCK_COLL_MASK
#define MOCK_COLL_MASK \
  (MNCL_COLL_MASK_ALL_V1 & ~(MNCL_COLL_BIT(MNCL_COLL_SEND) | MNCL_COLL_BIT(MNCL_COLL_RECV)))
#endif
#ifndef MOCK_V2_COLL_MASK
#define MOCK_V2_COLL_MASK MOCK_COLL_MASK
#endif
#ifndef MOCK_V3_COLL_MASK
#define MOCK_V3_COLL_MASK \
  ((MOCK_COLL_MASK) | MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV))
#endif
#ifndef MOCK_V4_COLL_MASK
/* Not in terms of MOCK_V3_COLL_MASK, which a variant may define as this (a v3 table claiming
 * v4's kind). */
#define MOCK_V4_COLL_MASK                                                                        \
  ((MOCK_COLL_MASK) | MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV) | \
   MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH))
#endif
#ifndef MOCK_V5_COLL_MASK
/* Not in terms of MOCK_V4_COLL_MASK either, which a variant may define as this (a v4 table
 * claiming v5's kinds). */
#define MOCK_V5_COLL_MASK                                                                        \
  ((MOCK_COLL_MASK) | MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV) | \
   MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH) | MNCL_COLL_BIT(MNCL_COLL_GATHERV) |                  \
   MNCL_COLL_BIT(MNCL_COLL_SCATTERV))
#endif
#if (defined(MOCK_NOOP) && MOCK_NOOP) || (defined(MOCK_HANG) && MOCK_HANG) || \
    (defined(MOCK_ANY_SIZE) && MOCK_ANY_SIZE)
#define MOCK_SIZES_ANY 1
#else
#define MOCK_SIZES_ANY 0
#endif

static const mncl_host_v1_t *g_host;

#if (defined(MOCK_PROBE_THROWS) && MOCK_PROBE_THROWS) || \
    (defined(MOCK_MISBEHAVES) && MOCK_MISBEHAVES)
/* mock_throw.cpp: throws std::runtime_error(what), or an int when what is NULL. */
void mock_throw(const char *what);
#endif
#if defined(MOCK_MISBEHAVES) && MOCK_MISBEHAVES
static int misbehaves(const char *how) {
  const char *said = getenv("MNCL_MOCK_MISBEHAVE");
  return said != NULL && strcmp(said, how) == 0;
}
#endif
#if defined(MOCK_UNDEFINED_SYMBOL) && MOCK_UNDEFINED_SYMBOL
int mncl_mock_missing_symbol(void);
/* Taken at load time (a data relocation), so even lazy binding cannot defer the failure. */
int (*volatile mock_missing_symbol_ref)(void) = &mncl_mock_missing_symbol;
#endif
#if defined(MOCK_CTOR_EXITS) && MOCK_CTOR_EXITS
__attribute__((constructor)) static void mock_ctor_exits(void) {
  static const char line[] = MOCK_NAME ": static initializer exits the process (MOCK_CTOR_EXITS)\n";
  if (write(2, line, sizeof line - 1) < 0) _exit(98);
  _exit(97);
}
#endif

/* Appends "<MOCK_NAME> <event>" to MNCL_MOCK_EVENTS, if set (one write: ranks in several
 * processes may share the file). */
static void record(const char *format, ...) {
  const char *path = getenv("MNCL_MOCK_EVENTS");
  char line[1024];
  int n;
  va_list args;
  FILE *f;
  if (path == NULL || *path == '\0') return;
  n = snprintf(line, sizeof line, "%s ", MOCK_NAME);
  va_start(args, format);
  vsnprintf(line + n, sizeof line - (size_t)n, format, args);
  va_end(args);
  f = fopen(path, "a");
  if (f == NULL) return;
  fprintf(f, "%s\n", line);
  fclose(f);
}

static mncl_status_t mock_init(const mncl_host_v1_t *host) {
  g_host = host;
  record("init");
#if defined(MOCK_MISBEHAVES) && MOCK_MISBEHAVES
  if (misbehaves("init_throws")) mock_throw("device 3 not found");
#endif
#if defined(MOCK_INIT_FAILS) && MOCK_INIT_FAILS
  host->set_error("mock driver missing (built with MOCK_INIT_FAILS)");
  return MNCL_ERR_NOT_SUPPORTED;
#else
#if defined(MOCK_INIT_CHECKS_SETTING) && MOCK_INIT_CHECKS_SETTING
  const char *setting = host->get_env("MNCL_MOCK_SETTING");
  if (setting != NULL && strcmp(setting, "ok") != 0) {
    char message[256];
    snprintf(message, sizeof message, "MNCL_MOCK_SETTING='%s' is not ok", setting);
    host->set_error(message);
    return MNCL_ERR_INVALID_ARGUMENT;
  }
#endif
  if (host->log_level >= MNCL_LOG_INFO) {
    host->log(MNCL_LOG_INFO, __FILE__, __LINE__, "initialized (MNCL_TIMEOUT=%s)",
              host->get_env("MNCL_TIMEOUT") ? host->get_env("MNCL_TIMEOUT") : "unset");
  }
  return MNCL_OK;
#endif
}

static void mock_finalize(void) {
  record("finalize");
  g_host = NULL;
}

static mncl_status_t mock_probe(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                                size_t reason_len) {
#if defined(MOCK_PROBE_THROWS) && MOCK_PROBE_THROWS
  (void)info;
  *score = 10;
  snprintf(reason, reason_len, "never returned");
  mock_throw(MOCK_PROBE_THROWS == 1 ? "probe of " MOCK_NAME " threw" : NULL);
#elif defined(MOCK_PROBE_FAILS_SILENTLY) && MOCK_PROBE_FAILS_SILENTLY
  (void)info;
  (void)score;
  (void)reason;
  (void)reason_len;
  return MNCL_ERR_INTERNAL;
#elif defined(MOCK_HANG) && MOCK_HANG
  (void)info;
  *score = 1;
  snprintf(reason, reason_len, "hang: blocks in every collective until aborted");
#elif defined(MOCK_NOOP) && MOCK_NOOP
  (void)info;
  *score = 1;
  snprintf(reason, reason_len, "noop: completes every collective without moving data");
#elif defined(MOCK_ANY_SIZE) && MOCK_ANY_SIZE
  *score = info->size == 1 ? 10 : 1;
  snprintf(reason, reason_len, "%s",
           info->size == 1 ? "single rank: local copies"
                           : "any size: batches are recorded, other collectives are local copies");
#else
  *score = info->size == 1 ? 10 : 0;
  snprintf(reason, reason_len, "%s",
           info->size == 1 ? "single rank: local copies" : "mock serves single-rank jobs only");
#endif
  return MNCL_OK;
}

typedef struct mock_comm {
  int32_t rank;
  int32_t size;
  volatile int aborted;
  int posted; /* MOCK_ASYNC_STUCK: operations posted and not yet reported done */
  /* MOCK_P2P_LANES, per direction (0 send, 1 recv) and peer (< 64): operations running, and
   * the seq the next one must have. */
  int p2p_running[2][64];
  unsigned long long p2p_next_seq[2][64];
} mock_comm_t;

#if defined(MOCK_ASYNC_STUCK) && MOCK_ASYNC_STUCK
static int stuck_ignores_abort(void) {
  const char *v = getenv("MNCL_MOCK_IGNORE_ABORT");
  return v != NULL && strcmp(v, "1") == 0;
}
#endif

static mncl_status_t mock_comm_create(const mncl_bootstrap_v1_t *bs, void **comm) {
#if !MOCK_SIZES_ANY
  if (bs->size != 1) {
    g_host->set_error("mock: communicator of size %d requested; only size 1 is supported",
                      (int)bs->size);
    return MNCL_ERR_NOT_SUPPORTED;
  }
#endif
#if defined(MOCK_HANG) && MOCK_HANG
  {
    const char *marker = getenv("MNCL_MOCK_CREATE_MARKER");
    const char *delay = getenv("MNCL_MOCK_CREATE_DELAY_MS");
    if (marker != NULL) {
      FILE *f = fopen(marker, "w");
      if (f != NULL) fclose(f);
    }
    const char *release = getenv("MNCL_MOCK_CREATE_RELEASE");
    if (delay != NULL && release != NULL) {
      /* Until the file exists (the test's abort has come), at most the delay. */
      const struct timespec tick = {0, 1000 * 1000};
      for (long ms = atol(delay); ms > 0 && access(release, F_OK) != 0; --ms) {
        nanosleep(&tick, NULL);
      }
    } else if (delay != NULL) {
      const long ms = atol(delay);
      struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
      nanosleep(&pause, NULL);
    }
  }
#endif
  mock_comm_t *c = (mock_comm_t *)calloc(1, sizeof *c);
  if (c == NULL) return MNCL_ERR_SYSTEM;
  c->rank = bs->rank;
  c->size = bs->size;
  *comm = c;
  return MNCL_OK;
}

static mncl_status_t mock_comm_destroy(void *comm) {
#if defined(MOCK_ASYNC_STUCK) && MOCK_ASYNC_STUCK
  const int pending = ((mock_comm_t *)comm)->posted;
  free(comm);
  if (pending > 0 && !stuck_ignores_abort()) {
    g_host->set_error(
        "stuck: comm_destroy with %d posted operation(s) pending, whose buffers "
        "would still be in use",
        pending);
    return MNCL_ERR_INTERNAL;
  }
#else
  free(comm);
#endif
  return MNCL_OK;
}

static mncl_status_t mock_comm_abort(void *comm) {
#if (defined(MOCK_HANG) && MOCK_HANG) || (defined(MOCK_ASYNC_STUCK) && MOCK_ASYNC_STUCK) || \
    (defined(MOCK_MISBEHAVES) && MOCK_MISBEHAVES)
  __atomic_store_n(&((mock_comm_t *)comm)->aborted, 1, __ATOMIC_SEQ_CST);
#else
  ((mock_comm_t *)comm)->aborted = 1;
#endif
  return MNCL_OK;
}

#if !(defined(MOCK_NO_EXECUTE) && MOCK_NO_EXECUTE)
#if !(defined(MOCK_NOOP) && MOCK_NOOP)
static size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case MNCL_INT8:
    case MNCL_UINT8:
      return 1;
    case MNCL_FLOAT16:
    case MNCL_BFLOAT16:
      return 2;
    case MNCL_INT32:
    case MNCL_UINT32:
    case MNCL_FLOAT32:
      return 4;
    case MNCL_INT64:
    case MNCL_UINT64:
    case MNCL_FLOAT64:
      return 8;
  }
  return 0;
}

static void copy(void *dst, const void *src, size_t bytes) {
  if (dst != src && bytes > 0) memmove(dst, src, bytes);
}

/* v4's SENDRECV_BATCH (mncl_plugin_v4.h). Checks the descriptor as the header lays it out and
 * every op against what the core promises to have checked, then records the batch as
 * "batch rank <r>: empty" or "batch rank <r>: send 1 #0 x3, recv 1 #0 x3" (kind, peer, seq,
 * count per op). No data moves: with one rank the core can only hand over an empty batch
 * (every peer must differ from the rank), and with more (MOCK_ANY_SIZE) the peers are other
 * processes; the batch completes as recorded. */
static mncl_status_t mock_batch(const mock_comm_t *comm, const mncl_coll_v1_t *coll) {
  const mncl_p2p_v4_t *ops = (const mncl_p2p_v4_t *)coll->sendbuf;
  char line[768];
  size_t used, i;
  if ((coll->nbufs == 0) != (ops == NULL) || coll->recvbuf != NULL || coll->count != 0 ||
      coll->sendbufs != NULL || coll->recvbufs != NULL || coll->counts != NULL ||
      coll->dtype != -1 || coll->op != -1 || coll->root != -1 || coll->seq != 0) {
    g_host->set_error("mock: SENDRECV_BATCH descriptor not laid out as mncl_plugin_v4.h says");
    return MNCL_ERR_INTERNAL;
  }
  used = (size_t)snprintf(line, sizeof line, "rank %d:%s", (int)comm->rank,
                          coll->nbufs == 0 ? " empty" : "");
  for (i = 0; i < coll->nbufs; ++i) {
    const mncl_p2p_v4_t *op = &ops[i];
    if ((op->kind != MNCL_COLL_SEND && op->kind != MNCL_COLL_RECV) || op->peer < 0 ||
        op->peer >= comm->size || op->peer == comm->rank || dtype_size(op->dtype) == 0 ||
        op->reserved0 != 0 || (op->buf == NULL && op->count > 0)) {
      g_host->set_error("mock: batch op %zu breaks what the core promises", i);
      return MNCL_ERR_INTERNAL;
    }
    if (used < sizeof line) {
      used += (size_t)snprintf(line + used, sizeof line - used, "%s %s %d #%llu x%zu",
                               i == 0 ? "" : ",", op->kind == MNCL_COLL_SEND ? "send" : "recv",
                               (int)op->peer, (unsigned long long)op->seq, op->count);
    }
  }
  record("batch %s", line);
  return MNCL_OK;
}

/* v5's GATHERV and SCATTERV (mncl_plugin_v5.h). Checks the descriptor as the header lays it out
 * (nbufs the size, root in range, the root's 2 * size entries of counts then displs with
 * counts[rank] == count, NULL counts elsewhere, no sendbufs/recvbufs, op -1), records
 * "gatherv rank <r> root <R> count <n>" (" in place" appended for the in-place form) and moves
 * the root's own block: at one rank that is the whole collective. With more ranks
 * (MOCK_ANY_SIZE) nothing else moves. */
static mncl_status_t mock_rooted_v(const mock_comm_t *comm, const mncl_coll_v1_t *coll) {
  const int gather = coll->kind == MNCL_COLL_GATHERV;
  const char *what = gather ? "gatherv" : "scatterv";
  const int is_root = coll->root == comm->rank;
  const size_t elem = dtype_size(coll->dtype);
  const void *own = gather ? coll->sendbuf : coll->recvbuf;
  const char *blocks = gather ? (const char *)coll->recvbuf : (const char *)coll->sendbuf;
  size_t displ = 0; /* the root's own block in `blocks` */
  int in_place = 0;
  if (coll->nbufs != (size_t)comm->size || coll->root < 0 || coll->root >= comm->size ||
      coll->sendbufs != NULL || coll->recvbufs != NULL || coll->op != -1 || elem == 0 ||
      (own == NULL && coll->count > 0) || (coll->counts != NULL) != is_root ||
      (is_root && coll->counts[comm->rank] != coll->count)) {
    g_host->set_error("mock: %s descriptor not laid out as mncl_plugin_v5.h says",
                      gather ? "GATHERV" : "SCATTERV");
    return MNCL_ERR_INTERNAL;
  }
  if (is_root) {
    displ = coll->counts[(size_t)comm->size + (size_t)comm->rank];
    if (blocks == NULL && coll->count > 0) {
      g_host->set_error("mock: %s with a NULL block buffer on the root", what);
      return MNCL_ERR_INTERNAL;
    }
    in_place = coll->count > 0 && own == (const void *)(blocks + displ * elem);
  }
  record("%s rank %d root %d count %zu%s", what, (int)comm->rank, (int)coll->root, coll->count,
         in_place ? " in place" : "");
  if (is_root && !in_place && coll->count > 0) {
    if (gather) {
      copy((char *)coll->recvbuf + displ * elem, coll->sendbuf, coll->count * elem);
    } else {
      copy(coll->recvbuf, blocks + displ * elem, coll->count * elem);
    }
  }
  return MNCL_OK;
}
#endif

#if defined(MOCK_P2P_LANES) && MOCK_P2P_LANES
/* One op of a send, receive or batch starting (begin != 0) or ending, checked against the v2
 * rule (see MOCK_P2P_LANES above). */
static void p2p_lane_step(mock_comm_t *comm, int32_t kind, int32_t peer, unsigned long long seq,
                          const char *prefix, int begin) {
  const int dir = kind == MNCL_COLL_RECV;
  const char *what = dir ? "recv" : "send";
  if (peer < 0 || peer >= 64) return;
  if (!begin) {
    __atomic_sub_fetch(&comm->p2p_running[dir][peer], 1, __ATOMIC_SEQ_CST);
    return;
  }
  if (__atomic_add_fetch(&comm->p2p_running[dir][peer], 1, __ATOMIC_SEQ_CST) > 1) {
    record("overlap %s %d #%llu", what, (int)peer, seq);
  }
  if (seq != comm->p2p_next_seq[dir][peer]) {
    record("out of order %s %d #%llu, expected #%llu", what, (int)peer, seq,
           comm->p2p_next_seq[dir][peer]);
  }
  comm->p2p_next_seq[dir][peer] = seq + 1;
  record("%s%s %d #%llu", prefix, what, (int)peer, seq);
}

static mncl_status_t mock_p2p_lanes(mock_comm_t *comm, const mncl_coll_v1_t *coll) {
  const struct timespec pause = {0, 100 * 1000 * 1000};
  const mncl_p2p_v4_t *ops = (const mncl_p2p_v4_t *)coll->sendbuf;
  size_t i;
  if (coll->kind != MNCL_COLL_SENDRECV_BATCH) {
    p2p_lane_step(comm, coll->kind, coll->root, coll->seq, "", 1);
    nanosleep(&pause, NULL);
    p2p_lane_step(comm, coll->kind, coll->root, coll->seq, "", 0);
    return MNCL_OK;
  }
  for (i = 0; i < coll->nbufs; ++i) {
    p2p_lane_step(comm, ops[i].kind, ops[i].peer, ops[i].seq, "batch ", 1);
  }
  nanosleep(&pause, NULL);
  for (i = 0; i < coll->nbufs; ++i) {
    p2p_lane_step(comm, ops[i].kind, ops[i].peer, ops[i].seq, "batch ", 0);
  }
  return MNCL_OK;
}
#endif

static mncl_status_t mock_execute(void *comm, const mncl_coll_v1_t *coll) {
#if defined(MOCK_NOOP) && MOCK_NOOP
  (void)comm;
  (void)coll;
  return MNCL_OK;
#else
#if defined(MOCK_HANG) && MOCK_HANG
  /* Blocks (polling, as a plugin stuck on a dead peer would) until comm_abort; barrier passes
   * so that the job can line up before the hang. */
  if (coll->kind != MNCL_COLL_BARRIER) {
    const struct timespec pause = {0, 5 * 1000 * 1000};
    record("blocked rank %d kind %d #%llu", (int)((mock_comm_t *)comm)->rank, (int)coll->kind,
           (unsigned long long)coll->seq);
    while (!__atomic_load_n(&((mock_comm_t *)comm)->aborted, __ATOMIC_SEQ_CST)) {
      nanosleep(&pause, NULL);
    }
    g_host->set_error("hang: aborted while blocked in collective #%llu",
                      (unsigned long long)coll->seq);
    return MNCL_ERR_ABORTED;
  }
#endif
  if (((mock_comm_t *)comm)->aborted) return MNCL_ERR_ABORTED;
#if defined(MOCK_MISBEHAVES) && MOCK_MISBEHAVES
  if (coll->kind != MNCL_COLL_BARRIER) {
    if (misbehaves("throws")) mock_throw("vector::_M_range_check");
    if (misbehaves("throws_int")) mock_throw(NULL);
    if (misbehaves("minus_one")) return (mncl_status_t)-1;
    if (misbehaves("in_progress")) return MNCL_IN_PROGRESS;
    if (misbehaves("silent")) return MNCL_ERR_REMOTE;
    if (misbehaves("ignores_abort")) {
      /* Waits for the watchdog's abort, then goes on 3 s as if it had not come. */
      const struct timespec pause = {0, 5 * 1000 * 1000}, after = {3, 0};
      while (!__atomic_load_n(&((mock_comm_t *)comm)->aborted, __ATOMIC_SEQ_CST)) {
        nanosleep(&pause, NULL);
      }
      nanosleep(&after, NULL);
      g_host->set_error("misbehave: ended 3 s after comm_abort");
      return MNCL_ERR_ABORTED;
    }
  }
#endif
#if defined(MOCK_P2P_LANES) && MOCK_P2P_LANES
  if (coll->kind == MNCL_COLL_SEND || coll->kind == MNCL_COLL_RECV ||
      coll->kind == MNCL_COLL_SENDRECV_BATCH) {
    return mock_p2p_lanes((mock_comm_t *)comm, coll);
  }
#endif
  const size_t elem = dtype_size(coll->dtype);
  size_t i;
  /* With one rank every collective reduces to "my contribution is the result". */
  switch (coll->kind) {
    case MNCL_COLL_BARRIER:
      return MNCL_OK;
    case MNCL_COLL_BCAST:
      return MNCL_OK;
    case MNCL_COLL_ALLREDUCE_COALESCED:
      for (i = 0; i < coll->nbufs; ++i) {
        copy(coll->recvbufs[i], coll->sendbufs[i], coll->counts[i] * elem);
      }
      return MNCL_OK;
    case MNCL_COLL_ALLREDUCE:
    case MNCL_COLL_REDUCE:
    case MNCL_COLL_SCATTER:
    case MNCL_COLL_GATHER:
    case MNCL_COLL_ALLGATHER:
    case MNCL_COLL_REDUCE_SCATTER:
    case MNCL_COLL_ALLTOALL:
      copy(coll->recvbuf, coll->sendbuf, coll->count * elem);
      return MNCL_OK;
    /* v3's kinds (mncl_plugin_v3.h), one rank: counts = {recvcounts[0], displs[0]} and
     * {sendcounts[0], sdispls[0], recvcounts[0], rdispls[0]}. */
    case MNCL_COLL_ALLGATHERV:
      copy((char *)coll->recvbuf + coll->counts[1] * elem, coll->sendbuf, coll->count * elem);
      return MNCL_OK;
    case MNCL_COLL_ALLTOALLV:
      copy((char *)coll->recvbuf + coll->counts[3] * elem,
           (const char *)coll->sendbuf + coll->counts[1] * elem, coll->counts[0] * elem);
      return MNCL_OK;
    case MNCL_COLL_SENDRECV_BATCH:
      return mock_batch((const mock_comm_t *)comm, coll);
    case MNCL_COLL_GATHERV:
    case MNCL_COLL_SCATTERV:
      return mock_rooted_v((const mock_comm_t *)comm, coll);
  }
  g_host->set_error("mock: collective kind %d not supported", (int)coll->kind);
  return MNCL_ERR_NOT_SUPPORTED;
#endif
}
#define MOCK_EXECUTE mock_execute
#else
#define MOCK_EXECUTE NULL
#endif

#if defined(MOCK_POST_ONLY) && MOCK_POST_ONLY
static mncl_status_t mock_post(void *comm, const mncl_coll_v1_t *coll, void **handle) {
  (void)handle;
  return mock_execute(comm, coll);
}
#define MOCK_POST mock_post
#define MOCK_TEST NULL
#elif defined(MOCK_ASYNC_STUCK) && MOCK_ASYNC_STUCK
/* Handles point in here: nothing to free, so nothing leaks when the core gives up on one. */
static char g_stuck_handles[64];

static mncl_status_t mock_post(void *comm, const mncl_coll_v1_t *coll, void **handle) {
  mock_comm_t *c = (mock_comm_t *)comm;
  (void)coll;
  *handle = &g_stuck_handles[c->posted % (int)sizeof g_stuck_handles];
  ++c->posted;
  return MNCL_OK;
}

static mncl_status_t mock_test(void *comm, void *handle, int32_t *done) {
  mock_comm_t *c = (mock_comm_t *)comm;
  (void)handle;
  *done = 0;
#if defined(MOCK_MISBEHAVES) && MOCK_MISBEHAVES
  if (misbehaves("test_throws")) mock_throw("handle table corrupted");
#endif
  if (!__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST) || stuck_ignores_abort()) return MNCL_OK;
  *done = 1;
  --c->posted;
  g_host->set_error("stuck: the communicator was aborted with the operation pending");
  return MNCL_ERR_ABORTED;
}
#define MOCK_POST mock_post
#define MOCK_TEST mock_test
#else
#define MOCK_POST NULL
#define MOCK_TEST NULL
#endif

/* Everything but the header, the capabilities and coll_mask, shared by the tables of every
 * version. */
#define MOCK_TABLE_FIELDS                                                                        \
  .name = MOCK_TABLE_NAME, .version = "0.0.1-test (" MOCK_NAME ")",                              \
  .dtype_mask = (1u << MNCL_NUM_DTYPES) - 1u, .op_mask = (1u << MNCL_NUM_OPS) - 1u,              \
  .init = mock_init, .finalize = mock_finalize, .probe = mock_probe,                             \
  .comm_create = mock_comm_create, .comm_destroy = mock_comm_destroy,                            \
  .comm_abort = mock_comm_abort, .comm_split = NULL, .execute = MOCK_EXECUTE, .post = MOCK_POST, \
  .test = MOCK_TEST

#if MOCK_EXPORT_V1
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = {.struct_size = (MOCK_STRUCT_SIZE),
                                                            .magic = (MOCK_MAGIC),
                                                            .abi_version = (MOCK_ABI_VERSION),
                                                            .caps = (MOCK_CAPS),
                                                            .coll_mask = (MOCK_COLL_MASK),
                                                            MOCK_TABLE_FIELDS};
#endif

/* A v2..v5 table (their layout is v1's): p2p lanes, and the kinds of `coll_mask`. */
#define MOCK_LATER_TABLE(v, abi_version_, coll_mask_)                \
  MNCL_PLUGIN_EXPORT const mncl_plugin_v##v##_t mncl_plugin_v##v = { \
      .struct_size = sizeof(mncl_plugin_v##v##_t),                   \
      .magic = MNCL_PLUGIN_MAGIC,                                    \
      .abi_version = abi_version_,                                   \
      .caps = (MOCK_V2_CAPS),                                        \
      .coll_mask = coll_mask_,                                       \
      MOCK_TABLE_FIELDS}

#if MOCK_EXPORT_V2
MOCK_LATER_TABLE(2, (MOCK_V2_ABI_VERSION), (MOCK_V2_COLL_MASK));
#endif

#if MOCK_EXPORT_V3
MOCK_LATER_TABLE(3, MNCL_PLUGIN_ABI_V3, (MOCK_V3_COLL_MASK));
#endif

#if MOCK_EXPORT_V4
MOCK_LATER_TABLE(4, MNCL_PLUGIN_ABI_V4, (MOCK_V4_COLL_MASK));
#endif

#if MOCK_EXPORT_V5
MOCK_LATER_TABLE(5, MNCL_PLUGIN_ABI_V5, (MOCK_V5_COLL_MASK));
#endif

#if MOCK_EXPORT_V6
MNCL_PLUGIN_EXPORT const mncl_plugin_v6_test_t mncl_plugin_v6 = {
    .base = {.struct_size = sizeof(mncl_plugin_v6_test_t),
             .magic = MNCL_PLUGIN_MAGIC,
             .abi_version = MNCL_PLUGIN_ABI_V6_TEST,
             .caps = (MOCK_V2_CAPS),
             .coll_mask = (MOCK_V5_COLL_MASK),
             MOCK_TABLE_FIELDS},
    .comm_shrink = NULL,
    .caps2 = 0};
#endif

#if !MOCK_EXPORT_V1 && !MOCK_EXPORT_V2 && !MOCK_EXPORT_V3 && !MOCK_EXPORT_V4 && !MOCK_EXPORT_V5 && \
    !MOCK_EXPORT_V6
/* A complete table under a name the loader does not look for (a typo'd export). */
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_table = {
    .struct_size = sizeof(mncl_plugin_v1_t),
    .magic = MNCL_PLUGIN_MAGIC,
    .abi_version = MNCL_PLUGIN_ABI_V1,
    .caps = (MOCK_CAPS),
    .coll_mask = (MOCK_COLL_MASK),
    MOCK_TABLE_FIELDS};
#endif

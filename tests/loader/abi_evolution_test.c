/*
 * abi_evolution_test.c — ABI evolution through the PUBLIC API only (mncl.h + libmncl), as an
 * application built against an older or newer header would see it:
 *
 *   plugins: a v1 plugin loads through the core's v1 adapter and runs a collective, and so does
 *   a v2-only plugin (mncl_plugin_v2.h) through the v2 adapter, a v3-only one (mncl_plugin_v3.h)
 *   through the v3 adapter, a v4-only one (mncl_plugin_v4.h) through the v4 adapter, a v5-only
 *   one (mncl_plugin_v5.h) through the v5 adapter, a plugin exporting v1 and v2, one exporting v2
 *   and v3, one exporting v3 and v4, a v3 table claiming v4's batch kind, a v4 table claiming
 *   v5's gatherv/scatterv kinds, one exporting v5 and the hypothetical v6
 *   (mncl_plugin_v6_test.h), and one exporting v1 and v6; a plugin that only offers v6 is refused
 *   with MNCL_ERR_PLUGIN and a message naming the file and both version ranges, and a v2 symbol
 *   whose table says abi_version 1 is refused. (Which table the core picked is not visible
 *   through mncl.h; loader_test checks that.)
 *
 *   v3's collective kinds (mncl_allgatherv, mncl_alltoallv and their non-blocking twins, symbol
 *   version MNCL_1.1): a plugin served as v3, v4 or v5 runs them; a v1 or v2 plugin is never
 *   handed one, even when its table sets their coll_mask bits: MNCL_ERR_NOT_SUPPORTED naming the
 *   backend.
 *
 *   v4's batch kind (mncl_sendrecv_batch, mncl_sendrecv and their non-blocking twins, symbol
 *   version MNCL_1.2), seen through the mocks' MNCL_MOCK_EVENTS lines: at one rank, where only an
 *   empty batch is valid, a plugin served as v4 is handed it and every other plugin (a v3 table
 *   claiming the kind included) is not, and the call completes either way; an op to the rank
 *   itself is MNCL_ERR_INVALID_ARGUMENT on every backend. At two ranks (this program run twice
 *   more as rank processes over a file:// store), a v4 plugin is handed mncl_sendrecv's send and
 *   receive as one batch, numbered per peer and direction, and a v3 table claiming the kind,
 *   whose plugin has no send/recv either, is refused with MNCL_ERR_NOT_SUPPORTED naming the
 *   backend before anything reaches it.
 *
 *   v5's rooted kinds (mncl_gatherv, mncl_scatterv and their non-blocking twins, symbol version
 *   MNCL_1.3), one rank, out of place and in place, seen through the results (a gap in the
 *   root's buffer left untouched) and the mocks' MNCL_MOCK_EVENTS lines: a plugin served as v5
 *   is handed GATHERV and SCATTERV descriptors; a plugin served as v3 or v4 (a v4 table claiming
 *   v5's kinds included) runs them as an alltoallv, with the same results and no such event; a
 *   v1 or v2 plugin refuses them with MNCL_ERR_NOT_SUPPORTED naming the backend.
 *
 *   config struct-size handshake: an older caller's smaller mncl_config_t (only the first
 *   fields) gets defaults for the rest; a newer caller's larger one is accepted when its unknown
 *   tail is zero and refused with MNCL_ERR_NOT_SUPPORTED when not; a bad magic or an impossible
 *   size is MNCL_ERR_INVALID_ARGUMENT.
 *
 * Single rank but for the two-rank batch checks above; MNCL_PLUGIN_PATH points at the mock plugins
 * (ctest).
 */
#define _POSIX_C_SOURCE 200809L
#include <mncl/mncl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MNCL_ABI_EVOLUTION_TMP
#error "MNCL_ABI_EVOLUTION_TMP must name a folder for the test's files"
#endif

static int g_failures = 0;

#define EXPECT(cond, ...)                                             \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fputc('\n', stderr);                                            \
      ++g_failures;                                                   \
    }                                                                 \
  } while (0)

/* Creates a communicator from `config`, expects `want`; on success checks the backend name and
 * runs a single-rank allreduce, then destroys it. Returns the last error text (copied). */
static const char *create_expect(const void *config, mncl_status_t want, const char *backend,
                                 const char *what) {
  static char message[1024];
  mncl_comm_t comm = NULL;
  const mncl_status_t st = mncl_comm_create((const mncl_config_t *)config, &comm);
  snprintf(message, sizeof message, "%s", st == MNCL_OK ? "" : mncl_last_error());
  EXPECT(st == want, "%s: got %s (%s), expected %s", what, mncl_status_string(st), message,
         mncl_status_string(want));
  if (st == MNCL_OK) {
    const char *name = NULL;
    int64_t x[3] = {1, 2, 3}, y[3] = {0, 0, 0};
    EXPECT(mncl_comm_backend(comm, &name) == MNCL_OK && strcmp(name, backend) == 0,
           "%s: backend '%s', expected '%s'", what, name ? name : "(null)", backend);
    EXPECT(mncl_allreduce(comm, x, y, 3, MNCL_INT64, MNCL_SUM, NULL) == MNCL_OK && y[0] == 1 &&
               y[1] == 2 && y[2] == 3,
           "%s: allreduce: %s", what, mncl_last_error());
    EXPECT(mncl_comm_destroy(comm) == MNCL_OK, "%s: destroy: %s", what, mncl_last_error());
    printf("ok   %-58s backend %s\n", what, backend);
  } else {
    printf("ok   %-58s %s: %s\n", what, mncl_status_string(st), message);
  }
  return message;
}

static mncl_config_t config_for(const char *backend) {
  mncl_config_t c = MNCL_CONFIG_INIT;
  c.backend = backend;
  c.size = 1;
  c.rank = 0;
  return c;
}

/* Checks one v3 collective's status against `want` (a refusal names the collective, `kind`,
 * and the backend) and, on success, that `got` holds `expected`. */
static void check_vcoll(mncl_status_t st, mncl_status_t want, const char *backend, const char *what,
                        const char *fn, const char *kind, const int32_t *got,
                        const int32_t *expected, size_t n) {
  char quoted[128];
  const char *msg = st == MNCL_OK ? "" : mncl_last_error();
  EXPECT(st == want, "%s: %s: got %s (%s), expected %s", what, fn, mncl_status_string(st), msg,
         mncl_status_string(want));
  if (st != want) return;
  if (st == MNCL_OK) {
    EXPECT(memcmp(got, expected, n * sizeof *got) == 0,
           "%s: %s: wrong result {%d, %d, %d, %d, %d, %d}", what, fn, (int)got[0], (int)got[1],
           (int)got[2], (int)got[3], (int)got[4], (int)got[5]);
  } else {
    snprintf(quoted, sizeof quoted, "backend '%s'", backend);
    EXPECT(strstr(msg, quoted) != NULL && strstr(msg, kind) != NULL,
           "%s: %s: the message names the collective and the backend: %s", what, fn, msg);
  }
}

/* On a single-rank communicator of `backend`: mncl_allgatherv, mncl_alltoallv and their
 * non-blocking twins end in `want` (MNCL_OK with the right blocks, elements outside them
 * untouched, or MNCL_ERR_NOT_SUPPORTED naming the backend). */
static void vcolls_expect(const char *backend, mncl_status_t want, const char *what) {
  const int32_t in[3] = {7, 8, 9};
  /* allgatherv: recvcounts {3}, displs {2}; alltoallv: sendcounts {2}, sdispls {1},
   * recvcounts {2}, rdispls {3}. */
  const int32_t gathered[6] = {-1, -1, 7, 8, 9, -1};
  const int32_t exchanged[6] = {-1, -1, -1, 8, 9, -1};
  const size_t three[1] = {3}, two[1] = {2}, one[1] = {1}, rdispls[1] = {3};
  int32_t out[6];
  mncl_config_t c = config_for(backend);
  mncl_comm_t comm = NULL;
  mncl_request_t req = NULL;
  mncl_status_t st = mncl_comm_create(&c, &comm);
  EXPECT(st == MNCL_OK, "%s: create: %s", what, mncl_last_error());
  if (st != MNCL_OK) return;

  memset(out, 0xff, sizeof out);
  st = mncl_allgatherv(comm, in, 3, out, three, two, MNCL_INT32, NULL);
  check_vcoll(st, want, backend, what, "mncl_allgatherv", "allgatherv", out, gathered, 6);

  memset(out, 0xff, sizeof out);
  st = mncl_alltoallv(comm, in, two, one, out, two, rdispls, MNCL_INT32, NULL);
  check_vcoll(st, want, backend, what, "mncl_alltoallv", "alltoallv", out, exchanged, 6);

  memset(out, 0xff, sizeof out);
  st = mncl_iallgatherv(comm, in, 3, out, three, two, MNCL_INT32, NULL, &req);
  if (st == MNCL_OK) st = mncl_wait(req, -1);
  check_vcoll(st, want, backend, what, "mncl_iallgatherv", "allgatherv", out, gathered, 6);

  memset(out, 0xff, sizeof out);
  st = mncl_ialltoallv(comm, in, two, one, out, two, rdispls, MNCL_INT32, NULL, &req);
  if (st == MNCL_OK) st = mncl_wait(req, -1);
  check_vcoll(st, want, backend, what, "mncl_ialltoallv", "alltoallv", out, exchanged, 6);

  EXPECT(mncl_comm_destroy(comm) == MNCL_OK, "%s: destroy: %s", what, mncl_last_error());
  printf("ok   %-58s %s\n", what, mncl_status_string(want));
}

/* --- batches -------------------------------------------------------------------------------- */

/* The file the mocks append their events to (MNCL_MOCK_EVENTS). */
static char g_events[512];

static void events_clear(void) {
  FILE *f = fopen(g_events, "w");
  if (f != NULL) fclose(f);
}

/* The lines of the events file that start with "<backend> <event> " for one of the nevents
 * `events`, in the file's order, joined with '\n' (each ending in one) into out; returns how
 * many. */
static int kind_events(const char *backend, const char *const *events, size_t nevents, char *out,
                       size_t len) {
  char line[1024], prefix[128];
  int n = 0;
  size_t used = 0, i;
  FILE *f = fopen(g_events, "r");
  out[0] = '\0';
  if (f == NULL) return 0;
  while (fgets(line, sizeof line, f) != NULL) {
    int match = 0;
    for (i = 0; i < nevents && !match; ++i) {
      snprintf(prefix, sizeof prefix, "%s %s ", backend, events[i]);
      match = strncmp(line, prefix, strlen(prefix)) == 0;
    }
    if (!match) continue;
    ++n;
    if (used < len) used += (size_t)snprintf(out + used, len - used, "%s", line);
  }
  fclose(f);
  return n;
}

/* The "<backend> batch ..." lines (see kind_events). */
static int batch_events(const char *backend, char *out, size_t len) {
  static const char *const events[1] = {"batch"};
  return kind_events(backend, events, 1, out, len);
}

/* On a single-rank communicator of `backend`: an empty mncl_sendrecv_batch and
 * mncl_isendrecv_batch complete, and reach the plugin (as an empty SENDRECV_BATCH) exactly when
 * `handed` says; a batch or mncl_sendrecv naming the rank itself is refused before anything
 * starts, whatever the backend. */
static void batches_expect(const char *backend, int handed, const char *what) {
  char got[1024], want[256];
  int32_t x[2] = {1, 2}, y[2] = {0, 0};
  mncl_p2p_op_t ops[2];
  mncl_config_t c = config_for(backend);
  mncl_comm_t comm = NULL;
  mncl_request_t req = NULL;
  const char *msg;
  int n;
  mncl_status_t st = mncl_comm_create(&c, &comm);
  EXPECT(st == MNCL_OK, "%s: create: %s", what, mncl_last_error());
  if (st != MNCL_OK) return;

  events_clear();
  st = mncl_sendrecv_batch(comm, NULL, 0, NULL);
  EXPECT(st == MNCL_OK, "%s: empty mncl_sendrecv_batch: %s", what, mncl_last_error());
  st = mncl_isendrecv_batch(comm, NULL, 0, NULL, &req);
  if (st == MNCL_OK) st = mncl_wait(req, -1);
  EXPECT(st == MNCL_OK, "%s: empty mncl_isendrecv_batch: %s", what, mncl_last_error());
  n = batch_events(backend, got, sizeof got);
  snprintf(want, sizeof want, "%s batch rank 0: empty\n%s batch rank 0: empty\n", backend, backend);
  EXPECT(handed ? strcmp(got, want) == 0 : n == 0, "%s: the plugin was %shanded: '%s'", what,
         handed ? "not " : "", got);

  ops[0] = mncl_p2p_op(MNCL_P2P_SEND, x, 2, MNCL_INT32, 0);
  ops[1] = mncl_p2p_op(MNCL_P2P_RECV, y, 2, MNCL_INT32, 0);
  st = mncl_sendrecv_batch(comm, ops, 2, NULL);
  msg = st == MNCL_OK ? "" : mncl_last_error();
  EXPECT(st == MNCL_ERR_INVALID_ARGUMENT && strstr(msg, "op 0 (send): peer 0 is this rank itself"),
         "%s: a batch to the rank itself: %s (%s)", what, mncl_status_string(st), msg);
  st = mncl_sendrecv(comm, x, 2, 0, y, 2, 0, MNCL_INT32, NULL);
  msg = st == MNCL_OK ? "" : mncl_last_error();
  EXPECT(st == MNCL_ERR_INVALID_ARGUMENT && strstr(msg, "mncl_sendrecv: op 0 (send): peer 0"),
         "%s: mncl_sendrecv to the rank itself: %s (%s)", what, mncl_status_string(st), msg);
  EXPECT(batch_events(backend, got, sizeof got) == n, "%s: a refused batch reached the plugin: %s",
         what, got);

  EXPECT(mncl_comm_destroy(comm) == MNCL_OK, "%s: destroy: %s", what, mncl_last_error());
  printf("ok   %-58s %s\n", what, handed ? "handed to the plugin" : "not handed to the plugin");
}

/* One rank process of two_ranks (this program with --rank): on a size-2 communicator of
 * `backend` over `store`, mncl_sendrecv and mncl_isendrecv with the other rank (3 elements each
 * way) end in `want` (a refusal must name the backend and the missing kinds), and an empty
 * batch completes. Returns the exit status: the number of failed checks. */
static int rank_main(int rank, const char *backend, const char *store, mncl_status_t want) {
  char quoted[128];
  int32_t x[3] = {1, 2, 3}, y[3] = {0, 0, 0};
  const char *msg;
  mncl_config_t c = config_for(backend);
  mncl_comm_t comm = NULL;
  mncl_request_t req = NULL;
  mncl_status_t st;
  c.rank = rank;
  c.size = 2;
  c.bootstrap = store;
  st = mncl_comm_create(&c, &comm);
  EXPECT(st == MNCL_OK, "rank %d: create: %s", rank, mncl_last_error());
  if (st != MNCL_OK) return 1;
  snprintf(quoted, sizeof quoted, "backend '%s' implements neither batches nor send", backend);

  st = mncl_sendrecv(comm, x, 3, 1 - rank, y, 3, 1 - rank, MNCL_INT32, NULL);
  msg = st == MNCL_OK ? "" : mncl_last_error();
  EXPECT(st == want && (st == MNCL_OK || strstr(msg, quoted) != NULL),
         "rank %d: mncl_sendrecv: %s (%s), expected %s", rank, mncl_status_string(st), msg,
         mncl_status_string(want));
  st = mncl_isendrecv(comm, x, 3, 1 - rank, y, 3, 1 - rank, MNCL_INT32, NULL, &req);
  if (st == MNCL_OK) st = mncl_wait(req, -1);
  msg = st == MNCL_OK ? "" : mncl_last_error();
  EXPECT(st == want && (st == MNCL_OK || strstr(msg, quoted) != NULL),
         "rank %d: mncl_isendrecv: %s (%s), expected %s", rank, mncl_status_string(st), msg,
         mncl_status_string(want));
  st = mncl_sendrecv_batch(comm, NULL, 0, NULL);
  EXPECT(st == MNCL_OK, "rank %d: empty batch: %s", rank, mncl_last_error());
  EXPECT(mncl_comm_destroy(comm) == MNCL_OK, "rank %d: destroy: %s", rank, mncl_last_error());
  return g_failures;
}

/* Runs rank_main for ranks 0 and 1 as two processes of this program over a fresh file://
 * store, then checks what the plugin recorded: each rank's mncl_sendrecv and mncl_isendrecv
 * as one batch (send and receive numbered 0, then 1) and its empty batch when `want` is MNCL_OK,
 * nothing at all when it is a refusal. */
static void two_ranks(const char *backend, mncl_status_t want, const char *what) {
  static int runs = 0;
  char dir[512], store[600], command[600], got[2048], line[256];
  pid_t pids[2];
  int r, ok = 1;
  snprintf(dir, sizeof dir, "%s/abi_evolution_store.%d.%d", MNCL_ABI_EVOLUTION_TMP, (int)getpid(),
           runs++);
  snprintf(store, sizeof store, "file://%s", dir);
  EXPECT(mkdir(dir, 0700) == 0, "%s: cannot create %s", what, dir);
  events_clear();
  fflush(NULL);
  for (r = 0; r < 2; ++r) {
    char rank[2] = {(char)('0' + r), '\0'};
    pids[r] = fork();
    if (pids[r] == 0) {
      execl("/proc/self/exe", "abi_evolution_test", "--rank", rank, backend, store,
            want == MNCL_OK ? "ok" : "refused", (char *)NULL);
      _exit(127);
    }
    EXPECT(pids[r] > 0, "%s: fork failed", what);
  }
  for (r = 0; r < 2; ++r) {
    int status = 0;
    if (pids[r] <= 0) continue;
    waitpid(pids[r], &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: rank %d failed (status 0x%x)", what,
           r, (unsigned)status);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (want == MNCL_OK) {
    EXPECT(batch_events(backend, got, sizeof got) == 6, "%s: 3 batches per rank, got:\n%s", what,
           got);
    for (r = 0; r < 2; ++r) {
      int seq;
      for (seq = 0; seq < 2; ++seq) {
        snprintf(line, sizeof line, "%s batch rank %d: send %d #%d x3, recv %d #%d x3\n", backend,
                 r, 1 - r, seq, 1 - r, seq);
        EXPECT(strstr(got, line) != NULL, "%s: missing '%.*s' in:\n%s", what, (int)strlen(line) - 1,
               line, got);
      }
      snprintf(line, sizeof line, "%s batch rank %d: empty\n", backend, r);
      EXPECT(strstr(got, line) != NULL, "%s: missing '%.*s' in:\n%s", what, (int)strlen(line) - 1,
             line, got);
    }
  } else {
    EXPECT(batch_events(backend, got, sizeof got) == 0, "%s: the plugin was handed:\n%s", what,
           got);
  }
  snprintf(command, sizeof command, "rm -rf '%s'", dir);
  EXPECT(system(command) == 0, "%s: cannot remove %s", what, dir);
  if (ok) printf("ok   %-58s %s\n", what, mncl_status_string(want));
}

/* --- gatherv and scatterv ------------------------------------------------------------------ */

/* How a backend serves mncl_gatherv and mncl_scatterv. */
typedef enum rooted_v_mode {
  ROOTED_V_NATIVE,    /* handed as v5's GATHERV and SCATTERV */
  ROOTED_V_ALLTOALLV, /* run by the core as an alltoallv */
  ROOTED_V_REFUSED    /* neither: MNCL_ERR_NOT_SUPPORTED naming the backend */
} rooted_v_mode_t;

/* The "<backend> gatherv ..." and "<backend> scatterv ..." lines (see kind_events). */
static int rooted_v_events(const char *backend, char *out, size_t len) {
  static const char *const events[2] = {"gatherv", "scatterv"};
  return kind_events(backend, events, 2, out, len);
}

/* Checks one gatherv/scatterv call: its status against what `mode` wants (a refusal names the
 * function and the backend, and leaves no request) and, on success, that buf holds expected. */
static int check_rooted_v(mncl_status_t st, rooted_v_mode_t mode, const char *backend,
                          const char *what, const char *fn, const mncl_request_t *req,
                          const int32_t *buf, const int32_t *expected, size_t n) {
  char quoted[128];
  const mncl_status_t want = mode == ROOTED_V_REFUSED ? MNCL_ERR_NOT_SUPPORTED : MNCL_OK;
  const char *msg = st == MNCL_OK ? "" : mncl_last_error();
  const int failures = g_failures;
  EXPECT(st == want, "%s: %s: got %s (%s), expected %s", what, fn, mncl_status_string(st), msg,
         mncl_status_string(want));
  if (st != want) return 0;
  if (st == MNCL_OK) {
    EXPECT(memcmp(buf, expected, n * sizeof *buf) == 0,
           "%s: %s: wrong result {%d, %d, %d, %d, %d, %d}", what, fn, (int)buf[0], (int)buf[1],
           (int)buf[2], (int)buf[3], (int)buf[4], (int)buf[5]);
  } else {
    snprintf(quoted, sizeof quoted, "backend '%s'", backend);
    EXPECT(strstr(msg, quoted) != NULL && strstr(msg, fn) != NULL,
           "%s: %s: the message names the function and the backend: %s", what, fn, msg);
    EXPECT(req == NULL || *req == NULL, "%s: %s: a refused call left a request", what, fn);
  }
  return g_failures == failures;
}

/* On a single-rank communicator of `backend` (root 0, blocks of 3 int32 at displacement 2):
 * mncl_gatherv, mncl_scatterv and their non-blocking twins, out of place and in place, end as
 * `mode` says, with the right blocks and the root's elements outside them untouched, and the
 * plugin was handed a native GATHERV or SCATTERV exactly when `mode` is ROOTED_V_NATIVE. */
static void rooted_v_expect(const char *backend, rooted_v_mode_t mode, const char *what) {
  const int32_t in[3] = {7, 8, 9};
  const int32_t gathered[6] = {-1, -1, 7, 8, 9, -1}; /* the root's recvbuf after a gatherv */
  const int32_t blocks[6] = {-2, -2, 4, 5, 6, -2};   /* the root's sendbuf of a scatterv */
  const int32_t scattered[6] = {4, 5, 6, -1, -1, -1};
  const size_t counts[1] = {3}, displs[1] = {2};
  char got[2048], want[2048];
  int32_t buf[6], send[6];
  int nonblocking, in_place;
  size_t used = 0;
  mncl_config_t c = config_for(backend);
  mncl_comm_t comm = NULL;
  mncl_status_t st = mncl_comm_create(&c, &comm);
  EXPECT(st == MNCL_OK, "%s: create: %s", what, mncl_last_error());
  if (st != MNCL_OK) return;

  events_clear();
  want[0] = '\0';
  for (nonblocking = 0; nonblocking < 2; ++nonblocking) {
    for (in_place = 0; in_place < 2; ++in_place) {
      const char *suffix = in_place ? " in place" : "";
      mncl_request_t req = NULL;
      const char *fn = nonblocking ? "mncl_igatherv" : "mncl_gatherv";
      /* gatherv: rank 0's block lands at recvbuf + 2; in place it is already there. */
      const int32_t *sendbuf = in;
      memset(buf, 0xff, sizeof buf);
      if (in_place) {
        memcpy(buf + 2, in, sizeof in);
        sendbuf = buf + 2;
      }
      st = nonblocking
               ? mncl_igatherv(comm, sendbuf, 3, buf, counts, displs, MNCL_INT32, 0, NULL, &req)
               : mncl_gatherv(comm, sendbuf, 3, buf, counts, displs, MNCL_INT32, 0, NULL);
      if (st == MNCL_OK && nonblocking) st = mncl_wait(req, -1);
      if (check_rooted_v(st, mode, backend, what, fn, nonblocking ? &req : NULL, buf, gathered,
                         6) &&
          st == MNCL_OK) {
        used += (size_t)snprintf(want + used, sizeof want - used,
                                 "%s gatherv rank 0 root 0 count 3%s\n", backend, suffix);
      }

      /* scatterv: the block at sendbuf + 2 lands in recvbuf; in place recvbuf is sendbuf + 2. */
      fn = nonblocking ? "mncl_iscatterv" : "mncl_scatterv";
      req = NULL;
      memcpy(send, blocks, sizeof blocks);
      memset(buf, 0xff, sizeof buf);
      st = nonblocking ? mncl_iscatterv(comm, send, counts, displs, in_place ? send + 2 : buf, 3,
                                        MNCL_INT32, 0, NULL, &req)
                       : mncl_scatterv(comm, send, counts, displs, in_place ? send + 2 : buf, 3,
                                       MNCL_INT32, 0, NULL);
      if (st == MNCL_OK && nonblocking) st = mncl_wait(req, -1);
      if (check_rooted_v(st, mode, backend, what, fn, nonblocking ? &req : NULL,
                         in_place ? send : buf, in_place ? blocks : scattered, 6) &&
          st == MNCL_OK) {
        EXPECT(memcmp(send, blocks, sizeof blocks) == 0, "%s: %s wrote to its sendbuf", what, fn);
        used += (size_t)snprintf(want + used, sizeof want - used,
                                 "%s scatterv rank 0 root 0 count 3%s\n", backend, suffix);
      }
    }
  }
  /* What the plugin was handed, in call order. */
  rooted_v_events(backend, got, sizeof got);
  if (mode == ROOTED_V_NATIVE) {
    EXPECT(strcmp(got, want) == 0, "%s: the plugin's events:\n%s\nexpected:\n%s", what, got, want);
  } else {
    EXPECT(got[0] == '\0', "%s: the plugin was handed a native gatherv/scatterv:\n%s", what, got);
  }
  EXPECT(mncl_comm_destroy(comm) == MNCL_OK, "%s: destroy: %s", what, mncl_last_error());
  printf("ok   %-58s %s\n", what,
         mode == ROOTED_V_NATIVE      ? "native gatherv/scatterv"
         : mode == ROOTED_V_ALLTOALLV ? "run as an alltoallv"
                                      : mncl_status_string(MNCL_ERR_NOT_SUPPORTED));
}

/* What an older header's mncl_config_t could have been: the first fields only. */
typedef struct old_config {
  size_t struct_size;
  uint32_t magic;
  uint32_t version;
  const char *backend;
  int32_t rank;
  int32_t size;
} old_config_t;

/* What a newer header's mncl_config_t could be: every current field, then appended ones. */
typedef struct new_config {
  mncl_config_t current;
  int64_t future_option;
  const char *future_name;
} new_config_t;

int main(int argc, char **argv) {
  const char *msg;

  if (argc == 6 && strcmp(argv[1], "--rank") == 0) { /* a rank process of two_ranks */
    return rank_main(atoi(argv[2]), argv[3], argv[4],
                     strcmp(argv[5], "ok") == 0 ? MNCL_OK : MNCL_ERR_NOT_SUPPORTED);
  }
  snprintf(g_events, sizeof g_events, "%s/abi_evolution_events.%d", MNCL_ABI_EVOLUTION_TMP,
           (int)getpid());
  setenv("MNCL_MOCK_EVENTS", g_events, 1);

  /* --- plugin ABI versions ------------------------------------------------------------------ */
  {
    /* Plugins that load, and the table each must be served as. */
    static const struct {
      const char *name, *what;
    } loads[] = {
        {"mock", "v1 plugin loads through the v1 adapter"},
        {"v2only", "v2 plugin loads through the v2 adapter"},
        {"v1v2", "v1+v2 plugin is served (as v2)"},
        {"v3only", "v3 plugin loads through the v3 adapter"},
        {"v2v3", "v2+v3 plugin is served (as v3)"},
        {"v4only", "v4 plugin loads through the v4 adapter"},
        {"v3v4", "v3+v4 plugin is served (as v4)"},
        {"v3batch", "v3 plugin claiming the v4 kind loads (as v3)"},
        {"v5only", "v5 plugin loads through the v5 adapter"},
        {"v4rootedv", "v4 plugin claiming the v5 kinds loads (as v4)"},
        {"v5v6", "v5+v6 plugin is served (as v5)"},
        {"v1v6", "v1+v6 plugin is served (as v1)"},
    };
    for (size_t i = 0; i < sizeof loads / sizeof loads[0]; ++i) {
      mncl_config_t c = config_for(loads[i].name);
      create_expect(&c, MNCL_OK, loads[i].name, loads[i].what);
    }
  }
  {
    mncl_config_t c = config_for("v6only");
    msg = create_expect(&c, MNCL_ERR_PLUGIN, "", "v6-only plugin is refused");
    EXPECT(strstr(msg, "libmncl-v6only.so") != NULL, "the message names the file: %s", msg);
    EXPECT(strstr(msg, "offers plugin ABI v6 only") != NULL, "the plugin's range: %s", msg);
    EXPECT(strstr(msg, "this core supports v1..v5") != NULL, "the core's range: %s", msg);
  }
  {
    mncl_config_t c = config_for("v2badabi");
    msg = create_expect(&c, MNCL_ERR_PLUGIN, "", "v2 symbol with a v1 abi_version is refused");
    EXPECT(
        strstr(msg, "mncl_plugin_v2 declares abi_version 1 but the symbol name promises 2") != NULL,
        "names the mismatch: %s", msg);
  }

  /* --- v3's collective kinds --------------------------------------------------------------- */
  vcolls_expect("v3only", MNCL_OK, "v3 plugin runs allgatherv/alltoallv (+ i*)");
  vcolls_expect("v2v3", MNCL_OK, "v2+v3 plugin (as v3) runs allgatherv/alltoallv");
  vcolls_expect("v4only", MNCL_OK, "v4 plugin runs allgatherv/alltoallv");
  vcolls_expect("v3v4", MNCL_OK, "v3+v4 plugin (as v4) runs allgatherv/alltoallv");
  vcolls_expect("v3batch", MNCL_OK, "v3 table claiming the v4 kind keeps v3's");
  vcolls_expect("v5only", MNCL_OK, "v5 plugin runs allgatherv/alltoallv");
  vcolls_expect("v4rootedv", MNCL_OK, "v4 table claiming the v5 kinds runs them too");
  vcolls_expect("v5v6", MNCL_OK, "v5+v6 plugin (as v5) runs allgatherv/alltoallv");
  vcolls_expect("mock", MNCL_ERR_NOT_SUPPORTED, "v1 plugin is never handed a v3 kind");
  vcolls_expect("v1v2", MNCL_ERR_NOT_SUPPORTED, "v1+v2 plugin (as v2) is never handed one");
  vcolls_expect("v2allv", MNCL_ERR_NOT_SUPPORTED, "v2 table claiming v3's kinds loses them");
  vcolls_expect("v1v6", MNCL_ERR_NOT_SUPPORTED, "v1+v6 plugin (as v1) is never handed one");

  /* --- v4's batch kind ------------------------------------------------------------------------ */
  batches_expect("v4only", 1, "v4 plugin is handed an empty batch");
  batches_expect("v3v4", 1, "v3+v4 plugin (as v4) is handed an empty batch");
  batches_expect("v5only", 1, "v5 plugin is handed an empty batch");
  batches_expect("v4rootedv", 1, "v4 table claiming the v5 kinds keeps v4's");
  batches_expect("v5v6", 1, "v5+v6 plugin (as v5) is handed an empty batch");
  batches_expect("v3batch", 0, "v3 table claiming the v4 kind: empty batch, core-only");
  batches_expect("v3only", 0, "v3 plugin: an empty batch completes in the core");
  batches_expect("mock", 0, "v1 plugin: an empty batch completes in the core");
  two_ranks("v4only", MNCL_OK, "2 ranks: v4 plugin is handed sendrecv as one batch");
  two_ranks("v3batch", MNCL_ERR_NOT_SUPPORTED, "2 ranks: v3 claiming the kind, no send/recv");

  /* --- v5's gatherv and scatterv ---------------------------------------------------------------
   */
  rooted_v_expect("v5only", ROOTED_V_NATIVE, "v5 plugin is handed gatherv/scatterv (+ i*)");
  rooted_v_expect("v5v6", ROOTED_V_NATIVE, "v5+v6 plugin (as v5) is handed them");
  rooted_v_expect("v4rootedv", ROOTED_V_ALLTOALLV, "v4 table claiming the v5 kinds: alltoallv");
  rooted_v_expect("v4only", ROOTED_V_ALLTOALLV, "v4 plugin runs them as an alltoallv");
  rooted_v_expect("v3only", ROOTED_V_ALLTOALLV, "v3 plugin runs them as an alltoallv");
  rooted_v_expect("mock", ROOTED_V_REFUSED, "v1 plugin (no alltoallv) refuses them");
  rooted_v_expect("v2only", ROOTED_V_REFUSED, "v2 plugin (no alltoallv) refuses them");
  rooted_v_expect("v2allv", ROOTED_V_REFUSED, "v2 table claiming v3's kinds refuses them");
  rooted_v_expect("v1v6", ROOTED_V_REFUSED, "v1+v6 plugin (as v1) refuses them");

  /* --- config struct-size handshake ---------------------------------------------------------- */
  {
    old_config_t c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.magic = MNCL_CONFIG_MAGIC;
    c.version = MNCL_VERSION_CODE(0, 0, 1);
    c.backend = "mock";
    c.rank = 0;
    c.size = 1;
    create_expect(&c, MNCL_OK, "mock", "older caller's smaller config (first fields)");
  }
  {
    new_config_t c;
    memset(&c, 0, sizeof c);
    c.current = config_for("mock");
    c.current.struct_size = sizeof c;
    c.current.version = MNCL_VERSION_CODE(MNCL_VERSION_MAJOR, MNCL_VERSION_MINOR + 1, 0);
    create_expect(&c, MNCL_OK, "mock", "newer caller's larger config, zero tail");
    c.future_option = 42;
    msg = create_expect(&c, MNCL_ERR_NOT_SUPPORTED, "", "newer caller's larger config, set tail");
    EXPECT(strstr(msg, "unknown to this library") != NULL, "names the problem: %s", msg);
  }
  {
    mncl_config_t c = config_for("mock");
    c.magic = 0x12345678u;
    msg = create_expect(&c, MNCL_ERR_INVALID_ARGUMENT, "", "bad magic");
    EXPECT(strstr(msg, "MNCL_CONFIG_MAGIC") != NULL, "names the magic: %s", msg);
  }
  {
    mncl_config_t c = config_for("mock");
    c.struct_size = sizeof(size_t);
    create_expect(&c, MNCL_ERR_INVALID_ARGUMENT, "", "struct_size smaller than any config");
  }

  remove(g_events);
  if (g_failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("all ABI evolution checks passed\n");
  return 0;
}

/*
 * abi_evolution_test.c — ABI evolution through the PUBLIC API only (mncl.h + libmncl), as an
 * application built against an older or newer header would see it:
 *
 *   plugins: a v1 plugin loads through the core's v1 adapter and runs a collective, and so does
 *   a v2-only plugin (mncl_plugin_v2.h) through the v2 adapter, a v3-only one (mncl_plugin_v3.h)
 *   through the v3 adapter, a plugin exporting v1 and v2, one exporting v2 and v3, one exporting
 *   v3 and the hypothetical v4 (mncl_plugin_v4_test.h), and one exporting v1 and v4; a plugin
 *   that only offers v4 is refused with MNCL_ERR_PLUGIN and a message naming the file and both
 *   version ranges, and a v2 symbol whose table says abi_version 1 is refused.
 *   (Which table the core picked is not visible through mncl.h; loader_test checks that.)
 *
 *   v3's collective kinds (mncl_allgatherv, mncl_alltoallv and their non-blocking twins, symbol
 *   version MNCL_1.1): a plugin served as v3 runs them; a v1 or v2 plugin is never handed one,
 *   even when its table sets their coll_mask bits: MNCL_ERR_NOT_SUPPORTED naming the backend.
 *
 *   config struct-size handshake: an older caller's smaller mncl_config_t (only the first
 *   fields) gets defaults for the rest; a newer caller's larger one is accepted when its unknown
 *   tail is zero and refused with MNCL_ERR_NOT_SUPPORTED when not; a bad magic or an impossible
 *   size is MNCL_ERR_INVALID_ARGUMENT.
 *
 * Single rank; MNCL_PLUGIN_PATH points at the mock plugins (ctest).
 */
#include <mncl/mncl.h>
#include <stdio.h>
#include <string.h>

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

int main(void) {
  const char *msg;

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
        {"v3v4", "v3+v4 plugin is served (as v3)"},
        {"v1v4", "v1+v4 plugin is served (as v1)"},
    };
    for (size_t i = 0; i < sizeof loads / sizeof loads[0]; ++i) {
      mncl_config_t c = config_for(loads[i].name);
      create_expect(&c, MNCL_OK, loads[i].name, loads[i].what);
    }
  }
  {
    mncl_config_t c = config_for("v4only");
    msg = create_expect(&c, MNCL_ERR_PLUGIN, "", "v4-only plugin is refused");
    EXPECT(strstr(msg, "libmncl-v4only.so") != NULL, "the message names the file: %s", msg);
    EXPECT(strstr(msg, "offers plugin ABI v4 only") != NULL, "the plugin's range: %s", msg);
    EXPECT(strstr(msg, "this core supports v1..v3") != NULL, "the core's range: %s", msg);
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
  vcolls_expect("v3v4", MNCL_OK, "v3+v4 plugin (as v3) runs allgatherv/alltoallv");
  vcolls_expect("mock", MNCL_ERR_NOT_SUPPORTED, "v1 plugin is never handed a v3 kind");
  vcolls_expect("v1v2", MNCL_ERR_NOT_SUPPORTED, "v1+v2 plugin (as v2) is never handed one");
  vcolls_expect("v2allv", MNCL_ERR_NOT_SUPPORTED, "v2 table claiming v3's kinds loses them");
  vcolls_expect("v1v4", MNCL_ERR_NOT_SUPPORTED, "v1+v4 plugin (as v1) is never handed one");

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

  if (g_failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("all ABI evolution checks passed\n");
  return 0;
}

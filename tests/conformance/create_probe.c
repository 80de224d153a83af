/*
 * create_probe: creates and destroys one communicator from the environment and checks the
 * outcome; the driver of the launch tests (wrong backend, missing rank, store kinds).
 *
 *   create_probe [--setenv NAME=VALUE]... [--expect STATUS] [--contains TEXT]...
 *                [--max-seconds S] [--allreduce] [--repeat N]
 *
 * --setenv     applied before mncl_comm_create (e.g. to claim a larger MNCL_SIZE than the
 *              launcher started)
 * --expect     the status mncl_comm_create must return: a name (MNCL_ERR_TIMEOUT) or a number;
 *              default MNCL_OK
 * --contains   mncl_last_error() must contain TEXT; "a|b" accepts either alternative
 * --max-seconds  mncl_comm_create must return within S seconds of wall-clock time
 * --allreduce  after a successful create, allreduce-sum (rank + 1) and check the result
 * --repeat     create (and check, and destroy) the communicator N times in this process
 *
 * Prints one line per rank and exits 0 if every expectation held, 1 otherwise, 2 on usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <mncl/mncl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const kStatusNames[] = {
    "MNCL_OK",         "MNCL_ERR_INVALID_ARGUMENT", "MNCL_ERR_NOT_SUPPORTED", "MNCL_ERR_TIMEOUT",
    "MNCL_ERR_REMOTE", "MNCL_ERR_ABORTED",          "MNCL_ERR_PLUGIN",        "MNCL_ERR_BOOTSTRAP",
    "MNCL_ERR_SYSTEM", "MNCL_ERR_INTERNAL",         "MNCL_IN_PROGRESS"};
#define NUM_STATUS_NAMES ((int)(sizeof(kStatusNames) / sizeof(kStatusNames[0])))

static const char *status_name(int s) {
  return s >= 0 && s < NUM_STATUS_NAMES ? kStatusNames[s] : "unknown status";
}

static int parse_status(const char *text) {
  char *end = NULL;
  long v = strtol(text, &end, 10);
  int i;
  if (*text && *end == '\0') return (int)v;
  for (i = 0; i < NUM_STATUS_NAMES; ++i)
    if (strcmp(text, kStatusNames[i]) == 0 || strcmp(text, kStatusNames[i] + 5) == 0) return i;
  fprintf(stderr, "create_probe: unknown status '%s'\n", text);
  exit(2);
}

/* Whether `message` contains one of the '|'-separated alternatives of `pattern`. */
static int contains_any(const char *message, const char *pattern) {
  char buf[512];
  char *alt, *save = NULL;
  strncpy(buf, pattern, sizeof(buf) - 1);
  buf[sizeof(buf) - 1] = '\0';
  for (alt = strtok_r(buf, "|", &save); alt; alt = strtok_r(NULL, "|", &save))
    if (strstr(message, alt)) return 1;
  return 0;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int expect = MNCL_OK, do_allreduce = 0, ok = 1, i, ncontains = 0, repeat = 1, round;
  const char *contains[16];
  double max_seconds = 0, t0, elapsed;
  const char *rank_env = getenv("MNCL_RANK");
  const char *rank = rank_env ? rank_env : "?";
  mncl_comm_t comm = NULL;
  mncl_status_t st;
  char message[4096];

  for (i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--allreduce") == 0) {
      do_allreduce = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "create_probe: unknown option or missing value: '%s'\n", a);
      return 2;
    }
    ++i;
    if (strcmp(a, "--setenv") == 0) {
      char name[256];
      const char *eq = strchr(v, '=');
      if (!eq || eq == v || (size_t)(eq - v) >= sizeof(name)) {
        fprintf(stderr, "create_probe: --setenv needs NAME=VALUE, got '%s'\n", v);
        return 2;
      }
      memcpy(name, v, (size_t)(eq - v));
      name[eq - v] = '\0';
      setenv(name, eq + 1, 1);
    } else if (strcmp(a, "--expect") == 0) {
      expect = parse_status(v);
    } else if (strcmp(a, "--contains") == 0 && ncontains < 16) {
      contains[ncontains++] = v;
    } else if (strcmp(a, "--max-seconds") == 0) {
      max_seconds = atof(v);
    } else if (strcmp(a, "--repeat") == 0) {
      repeat = atoi(v);
    } else {
      fprintf(stderr, "create_probe: unknown option '%s'\n", a);
      return 2;
    }
  }

  for (round = 0; round < repeat && ok; ++round) {
    t0 = now_seconds();
    st = mncl_comm_create(NULL, &comm);
    elapsed = now_seconds() - t0;
    /* Copied at once: the message is only valid until the next MNCL call. */
    snprintf(message, sizeof(message), "%s", st == MNCL_OK ? "" : mncl_last_error());
    printf("create_probe rank %s: mncl_comm_create returned %s (%d) after %.2f s: %s\n", rank,
           status_name((int)st), (int)st, elapsed, message);

    if ((int)st != expect) {
      printf("create_probe rank %s: FAIL: expected %s (%d)\n", rank, status_name(expect), expect);
      ok = 0;
    }
    for (i = 0; i < ncontains; ++i) {
      if (!contains_any(message, contains[i])) {
        printf("create_probe rank %s: FAIL: the message does not contain '%s'\n", rank,
               contains[i]);
        ok = 0;
      }
    }
    if (st != MNCL_OK && message[0] == '\0') {
      printf("create_probe rank %s: FAIL: an error without a message\n", rank);
      ok = 0;
    }
    if (max_seconds > 0 && elapsed > max_seconds) {
      printf("create_probe rank %s: FAIL: took %.2f s, more than %.2f s\n", rank, elapsed,
             max_seconds);
      ok = 0;
    }
    if (st == MNCL_OK) {
      if (do_allreduce) {
        int r = -1, n = -1;
        int64_t v, sum = -1;
        mncl_comm_rank(comm, &r);
        mncl_comm_size(comm, &n);
        v = r + 1;
        st = mncl_allreduce(comm, &v, &sum, 1, MNCL_INT64, MNCL_SUM, NULL);
        if (st != MNCL_OK || sum != (int64_t)n * (n + 1) / 2) {
          printf("create_probe rank %s: FAIL: allreduce returned %s, sum %lld, want %lld: %s\n",
                 rank, status_name((int)st), (long long)sum, (long long)n * (n + 1) / 2,
                 mncl_last_error());
          ok = 0;
        }
      }
      st = mncl_comm_destroy(comm);
      if (st != MNCL_OK) {
        printf("create_probe rank %s: FAIL: mncl_comm_destroy returned %s: %s\n", rank,
               status_name((int)st), mncl_last_error());
        ok = 0;
      }
    }
  }
  printf("create_probe rank %s: %s\n", rank, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

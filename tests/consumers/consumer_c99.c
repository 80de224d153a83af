/*
 * A plain C99 consumer of <mncl/mncl.h>, compiled with -std=c99 -pedantic -Werror: the public
 * header must stay valid strict C, and a C program must be able to run a collective with it.
 * Runs at any size (alone, or under mncl-run -n N).
 */
#include <mncl/mncl.h>
#include <stdio.h>

#define N 5

static int check(mncl_status_t st, const char *what) {
  if (st == MNCL_OK) return 1;
  fprintf(stderr, "consumer_c99: %s: %s: %s\n", what, mncl_status_string(st), mncl_last_error());
  return 0;
}

int main(void) {
  mncl_config_t config = MNCL_CONFIG_INIT; /* the initializer macro must be valid C99 */
  mncl_comm_t comm = NULL;
  const char *backend = NULL;
  int rank = -1, size = -1, i, ok = 1;
  float x[N], y[N];
  int32_t counts[N];

  if (!check(mncl_comm_create(&config, &comm), "mncl_comm_create")) return 1;
  if (!check(mncl_comm_rank(comm, &rank), "mncl_comm_rank") ||
      !check(mncl_comm_size(comm, &size), "mncl_comm_size") ||
      !check(mncl_comm_backend(comm, &backend), "mncl_comm_backend")) {
    mncl_comm_destroy(comm);
    return 1;
  }

  /* Out of place: x[i] = i + rank, so y[i] = i * size + size * (size - 1) / 2. */
  for (i = 0; i < N; ++i) x[i] = (float)(i + rank);
  if (!check(mncl_allreduce(comm, x, y, N, MNCL_FLOAT32, MNCL_SUM, NULL), "mncl_allreduce")) {
    ok = 0;
  } else {
    for (i = 0; i < N; ++i) {
      float want = (float)(i * size + size * (size - 1) / 2);
      if (y[i] != want) {
        fprintf(stderr, "consumer_c99: rank %d: y[%d] = %g, want %g\n", rank, i, y[i], want);
        ok = 0;
      }
    }
  }
  /* In place, int32 max: every element becomes size. */
  for (i = 0; i < N; ++i) counts[i] = rank + 1;
  if (!check(mncl_allreduce(comm, counts, counts, N, MNCL_INT32, MNCL_MAX, NULL),
             "mncl_allreduce in place")) {
    ok = 0;
  } else {
    for (i = 0; i < N; ++i) {
      if (counts[i] != size) {
        fprintf(stderr, "consumer_c99: rank %d: max[%d] = %d, want %d\n", rank, i, (int)counts[i],
                size);
        ok = 0;
      }
    }
  }
  if (!check(mncl_comm_destroy(comm), "mncl_comm_destroy")) ok = 0;
  printf("consumer_c99: rank %d of %d on backend %s (library %d): %s\n", rank, size, backend,
         mncl_get_version(), ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

/* The bootstrap store holds what live communicators need, not what ended ones left behind, so
 * that a job that splits and aborts groups for days does not grow its store host. Run under
 * `mncl-run --store file`, whose store is a folder with one file per key (MNCL_STORE):
 *
 *  1. 40 splits of the world, each child used and destroyed: the world keeps one split's
 *     records ("w/split<n>/<rank>", at most one per rank), where each split left one per rank
 *     until the world's destroy.
 *  2. A child on which rank 0 posts an allreduce that no other rank joins (naive: its data in
 *     the store), then aborted by every rank and destroyed: none of its keys stay (they stayed
 *     for the job's life).
 *  3. A child aborted by rank 0 only, which the others destroy in the leave protocol: none stay.
 *  (The children of 1 are destroyed after use: none of their keys stay either.)
 *
 * A communicator whose ranks all left erases its keys: rank 0 once every rank has left, the
 * last rank to leave where rank 0 aborted it; the latter after its destroy has returned, so the
 * count is polled (for at most 20 s) for the keys to go. Exit status 0 when all went well. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <mncl/mncl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/mp_checks.h"

static const char *g_dir = NULL;

/* Files of the store whose names begin with `prefix` (the file store's key names: "k_" and the
 * key with '/' as %2F). */
static int count_keys(const char *prefix) {
  DIR *dir = opendir(g_dir);
  if (dir == NULL) {
    fprintf(stderr, "rank %d: cannot list the store folder %s\n", g_rank, g_dir);
    g_failures++;
    return -1;
  }
  int count = 0;
  for (struct dirent *entry; (entry = readdir(dir)) != NULL;) {
    if (strncmp(entry->d_name, prefix, strlen(prefix)) == 0) count++;
  }
  closedir(dir);
  return count;
}

/* Every child's keys ("w.s<split>.<color>/...") are gone, within 20 s. */
static void expect_no_child_keys(const char *what) {
  int left = 0;
  for (int waited_ms = 0; (left = count_keys("k_w.s")) > 0 && waited_ms < 20000; waited_ms += 20) {
    sleep_ms(20);
  }
  if (left != 0) {
    fprintf(stderr, "rank %d: %s: %d key(s) of destroyed children stay in the store\n", g_rank,
            what, left);
    g_failures++;
  }
}

static void allreduce_check(mncl_comm_t comm, const char *what) {
  int size = 0, mine = 1, sum = -1;
  CHECK_OK(mncl_comm_size(comm, &size));
  CHECK_OK(mncl_allreduce(comm, &mine, &sum, 1, MNCL_INT32, MNCL_SUM, NULL));
  if (sum != size) {
    fprintf(stderr, "rank %d: %s: allreduce gave %d, expected %d\n", g_rank, what, sum, size);
    g_failures++;
  }
}

int main(void) {
  const char *store = getenv("MNCL_STORE");
  if (store == NULL || strncmp(store, "file://", 7) != 0) {
    fprintf(stderr, "store_keys_test: needs a file store (mncl-run --store file), MNCL_STORE=%s\n",
            store ? store : "(unset)");
    return 1;
  }
  g_dir = store + 7;
  mncl_comm_t world = NULL;
  CHECK_OK(mncl_comm_create(NULL, &world));
  if (world == NULL) return 1;
  int size = 0;
  CHECK_OK(mncl_comm_rank(world, &g_rank));
  CHECK_OK(mncl_comm_size(world, &size));

  /* 1. Splits: one split's records stay. */
  for (int i = 0; i < 40; ++i) {
    mncl_comm_t child = NULL;
    CHECK_OK(mncl_comm_split(world, 0, g_rank, &child));
    if (child == NULL) return 1;
    allreduce_check(child, "a split's child");
    CHECK_OK(mncl_comm_destroy(child));
  }
  CHECK_OK(mncl_barrier(world, NULL));
  const int records = count_keys("k_w%2Fsplit");
  if (records > size) {
    fprintf(stderr, "rank %d: after 40 splits the world holds %d split records (at most %d)\n",
            g_rank, records, size);
    g_failures++;
  }
  expect_no_child_keys("children destroyed after use");
  CHECK_OK(mncl_barrier(world, NULL));

  /* 2. An allreduce only rank 0 joins, then an abort on every rank. */
  {
    mncl_comm_t child = NULL;
    CHECK_OK(mncl_comm_split(world, 0, g_rank, &child));
    if (child == NULL) return 1;
    static float data[1 << 16];
    mncl_request_t request = NULL;
    if (g_rank == 0) {
      CHECK_OK(mncl_iallreduce(child, data, data, 1 << 16, MNCL_FLOAT32, MNCL_SUM, NULL, &request));
    }
    CHECK_OK(mncl_barrier(world, NULL)); /* rank 0's allreduce is posted */
    CHECK_OK(mncl_comm_abort(child));
    CHECK_OK(mncl_comm_destroy(child));
    if (request != NULL) {
      const mncl_status_t st = mncl_wait(request, -1);
      if (st != MNCL_ERR_ABORTED && size > 1) {
        fprintf(stderr, "rank %d: the lone allreduce ended with %s, expected MNCL_ERR_ABORTED\n",
                g_rank, mncl_status_string(st));
        g_failures++;
      }
    }
    CHECK_OK(mncl_barrier(world, NULL));
    expect_no_child_keys("a child aborted by every rank, with an unfinished allreduce");
    CHECK_OK(mncl_barrier(world, NULL));
  }

  /* 3. Rank 0 aborts, the others destroy in turn. */
  {
    mncl_comm_t child = NULL;
    CHECK_OK(mncl_comm_split(world, 0, g_rank, &child));
    if (child == NULL) return 1;
    allreduce_check(child, "the child rank 0 aborts");
    /* Every rank done with the allreduce first: on shm rank 0 may finish it before the others,
     * whose part would then end with its abort. */
    CHECK_OK(mncl_barrier(world, NULL));
    if (g_rank == 0) CHECK_OK(mncl_comm_abort(child));
    CHECK_OK(mncl_comm_destroy(child));
    CHECK_OK(mncl_barrier(world, NULL));
    expect_no_child_keys("a child aborted by rank 0 only");
    CHECK_OK(mncl_barrier(world, NULL));
  }

  /* The world goes on working. */
  allreduce_check(world, "the world at the end");
  CHECK_OK(mncl_comm_destroy(world));
  if (g_failures == 0)
    printf("rank %d: the store kept only what live communicators need\n", g_rank);
  return g_failures == 0 ? 0 : 1;
}

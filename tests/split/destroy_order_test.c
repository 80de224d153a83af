/* Communicators destroyed in any order, under mncl-run (a TCP store that world rank 0's process
 * serves): nothing in mncl.h makes a parent outlive its children, nor a process keep the store's
 * host in its groups.
 *
 *  1. B = every rank in reverse order (its rank 0 is not the store's host); the world is
 *     destroyed first, then B is used and destroyed, the store's host first and the others
 *     later. Before, the host's destroy of B, its last communicator, closed the store at once:
 *     the others failed in B's allreduce or destroy ("lost the connection to the store").
 *  2. A group that the store's host is no member of (world ranks 1.. size-1) goes on with
 *     allreduces after the host has destroyed all of its communicators; the host's last destroy
 *     waits until the group is gone.
 *  3. Worlds re-created on the same address at once, four times, each with a group; in every
 *     other round rank 1 aborts its group (its last communicator) before destroying it. The
 *     processes that do not serve the store leave without waiting for its host, so their next
 *     world may reach the server of the one before: they must tell it from the next.
 *
 * Every call must return MNCL_OK with exact results. Exit status 0 when all did. */
#include <mncl/mncl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../common/mp_checks.h"

/* An allreduce of every rank's (world rank + 1) on `comm`, whose world ranks are `first`..
 * `first + size - 1`: checks the exact sum. */
static void expect_sum(mncl_comm_t comm, int first, const char *what) {
  int size = 0;
  CHECK_OK(mncl_comm_size(comm, &size));
  int mine = g_rank + 1, sum = -1;
  CHECK_OK(mncl_allreduce(comm, &mine, &sum, 1, MNCL_INT32, MNCL_SUM, NULL));
  const int want = size * (2 * first + size + 1) / 2;
  if (sum != want) {
    fprintf(stderr, "rank %d: %s: allreduce gave %d, expected %d\n", g_rank, what, sum, want);
    g_failures++;
  }
}

int main(void) {
  mncl_comm_t world = NULL, reversed = NULL, others = NULL;
  CHECK_OK(mncl_comm_create(NULL, &world));
  if (world == NULL) return 1;
  int size = 0;
  CHECK_OK(mncl_comm_rank(world, &g_rank));
  CHECK_OK(mncl_comm_size(world, &size));

  /* 1. The world first, then a communicator whose rank 0 is not the store's host. */
  CHECK_OK(mncl_comm_split(world, 0, -g_rank, &reversed));
  /* 2. Every rank but the store's host (which joins none), twice: operations in flight on both
   * at once take two store connections on naive (a client's pool grows), which the host's
   * server must still accept while it waits for them. */
  mncl_comm_t others2 = NULL;
  CHECK_OK(mncl_comm_split(world, g_rank == 0 ? MNCL_SPLIT_NONE : 1, g_rank, &others));
  CHECK_OK(mncl_comm_split(world, g_rank == 0 ? MNCL_SPLIT_NONE : 1, g_rank, &others2));
  CHECK_OK(mncl_comm_destroy(world));
  expect_sum(reversed, 0, "the reversed group after the world's destroy");
  if (g_rank != 0) sleep_ms(150L * g_rank); /* the host's destroy comes first */
  CHECK_OK(mncl_comm_destroy(reversed));
  if (others != NULL && others2 != NULL) {
    /* The host has destroyed everything by now, or waits in its last destroy. */
    sleep_ms(300);
    for (int i = 0; i < 20; ++i) expect_sum(others, 1, "the group without the store's host");
    for (int i = 0; i < 10; ++i) {
      int mine[2] = {g_rank + 1, 2 * (g_rank + 1)}, sums[2] = {-1, -1};
      mncl_request_t requests[2] = {NULL, NULL};
      CHECK_OK(
          mncl_iallreduce(others, &mine[0], &sums[0], 1, MNCL_INT32, MNCL_SUM, NULL, &requests[0]));
      CHECK_OK(mncl_iallreduce(others2, &mine[1], &sums[1], 1, MNCL_INT32, MNCL_SUM, NULL,
                               &requests[1]));
      for (int k = 0; k < 2; ++k) {
        if (requests[k] != NULL) CHECK_OK(mncl_wait(requests[k], -1));
      }
      const int want = (size - 1) * (size + 2) / 2; /* world ranks 1..size-1, plus one each */
      if (sums[0] != want || sums[1] != 2 * want) {
        fprintf(stderr, "rank %d: two groups at once gave %d and %d, expected %d and %d\n", g_rank,
                sums[0], sums[1], want, 2 * want);
        g_failures++;
      }
    }
    CHECK_OK(mncl_comm_destroy(others));
    CHECK_OK(mncl_comm_destroy(others2));
  }
  for (int round = 0; round < 4; ++round) {
    mncl_comm_t again = NULL, group = NULL;
    CHECK_OK(mncl_comm_create(NULL, &again));
    if (again == NULL) break;
    CHECK_OK(mncl_comm_split(again, 0, -g_rank, &group));
    expect_sum(again, 0, "a re-created world");
    CHECK_OK(mncl_comm_destroy(again));
    /* The group is idle: an abort fails no operation of the others. */
    if (round % 2 == 1 && g_rank == 1) CHECK_OK(mncl_comm_abort(group));
    CHECK_OK(mncl_comm_destroy(group));
  }
  if (g_failures == 0) printf("rank %d of %d: every destroy order worked\n", g_rank, size);
  return g_failures == 0 ? 0 : 1;
}

/* A rank that aborts a communicator right after an operation returned MNCL_OK there (its
 * caller's next step: a NaN found in the result, a signal) must not fail that operation on the
 * ranks still finishing it: what they wait for is there. Only operations that need the aborted
 * rank, and later ones, fail. On shm, ranks still copying a large allreduce's result out failed
 * with "the communicator was aborted by rank N" (seen within a few rounds).
 *
 * 30 rounds under mncl-run: a fresh group (a split of the world), an allreduce of 4 MiB on it,
 * checked exactly on every rank; then the last rank aborts the group at once, and every rank
 * destroys it. Exit status 0 when every allreduce returned MNCL_OK with the exact sums. */
#include <mncl/mncl.h>
#include <stdio.h>
#include <stdlib.h>

#define COUNT (1 << 20)

int main(void) {
  mncl_comm_t world = NULL;
  if (mncl_comm_create(NULL, &world) != MNCL_OK) {
    fprintf(stderr, "create: %s\n", mncl_last_error());
    return 1;
  }
  int rank = 0, size = 0, failures = 0;
  mncl_comm_rank(world, &rank);
  mncl_comm_size(world, &size);
  float *data = malloc(sizeof(float) * COUNT);
  if (data == NULL) return 1;
  for (int round = 0; round < 30 && failures == 0; ++round) {
    mncl_comm_t group = NULL;
    if (mncl_comm_split(world, 0, rank, &group) != MNCL_OK) {
      fprintf(stderr, "rank %d: split: %s\n", rank, mncl_last_error());
      return 1;
    }
    for (int i = 0; i < COUNT; ++i) data[i] = (float)(rank + 1 + (i & 7));
    const mncl_status_t st = mncl_allreduce(group, data, data, COUNT, MNCL_FLOAT32, MNCL_SUM, NULL);
    if (rank == size - 1) mncl_comm_abort(group); /* at once, as a caller that found a NaN */
    if (st != MNCL_OK) {
      fprintf(stderr, "rank %d, round %d: the allreduce failed: %s: %s\n", rank, round,
              mncl_status_string(st), mncl_last_error());
      failures++;
    } else {
      for (int i = 0; i < COUNT; ++i) {
        const float want = (float)(size * (size + 1) / 2 + size * (i & 7));
        if (data[i] != want) {
          fprintf(stderr, "rank %d, round %d: element %d is %g, expected %g\n", rank, round, i,
                  data[i], want);
          failures++;
          break;
        }
      }
    }
    mncl_comm_destroy(group);
    /* Every rank knows how the round went before the next (a failed rank stops them all). */
    int failed = failures;
    if (mncl_allreduce(world, &failed, &failed, 1, MNCL_INT32, MNCL_MAX, NULL) != MNCL_OK) {
      fprintf(stderr, "rank %d: world allreduce: %s\n", rank, mncl_last_error());
      return 1;
    }
    if (failed && !failures) failures = -1; /* another rank's failure: stop, it reported */
  }
  free(data);
  mncl_comm_destroy(world);
  if (failures == 0)
    printf("rank %d: every allreduce completed despite the aborts after it\n", rank);
  return failures == 0 ? 0 : 1;
}

// MPI's lifetime under flat: MPI can be initialized only once per process, yet communicators
// come and go, and the core unloads the plugin when the last one is destroyed. So, under
// mpirun with MNCL_BACKEND=flat: create, use and destroy a one-rank flat communicator three
// times in each process (the plugin is unloaded and loaded again in between; MPI stays
// initialized), then communicators over the whole job: three in turn, then three more while
// another one lives, which must still work afterwards (a split, and its destroy). All share
// the job's private store folder (mpirun): a rank that destroyed one may already be creating
// the next while rank 0 is still leaving, so the folder must stay until the process ends.
// Then exit without any MPI call of our own — flat must finalize MPI at exit, or mpirun
// reports the rank as failed.
#include <mncl/mncl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CHECK_MNCL(call)                                                          \
  do {                                                                            \
    const mncl_status_t st_ = (call);                                             \
    if (st_ != MNCL_OK) {                                                         \
      std::fprintf(stderr, "%s failed: %s: %s\n", #call, mncl_status_string(st_), \
                   mncl_last_error());                                            \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

namespace {

// Creates a communicator (config: NULL for the job's), checks one allreduce, destroys it.
int use_once(const mncl_config_t *config, int round) {
  mncl_comm_t comm = nullptr;
  CHECK_MNCL(mncl_comm_create(config, &comm));
  int rank = -1, size = -1;
  CHECK_MNCL(mncl_comm_rank(comm, &rank));
  CHECK_MNCL(mncl_comm_size(comm, &size));
  int64_t value = rank + round, sum = -1;
  CHECK_MNCL(mncl_allreduce(comm, &value, &sum, 1, MNCL_INT64, MNCL_SUM, nullptr));
  const int64_t want = int64_t{size} * (size - 1) / 2 + int64_t{size} * round;
  CHECK_MNCL(mncl_comm_destroy(comm));
  if (sum != want) {
    std::fprintf(stderr, "round %d, rank %d of %d: sum %lld, want %lld\n", round, rank, size,
                 static_cast<long long>(sum), static_cast<long long>(want));
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  mncl_config_t self = MNCL_CONFIG_INIT;
  self.rank = 0;
  self.size = 1;  // this process alone: no store, no peers
  for (int round = 0; round < 3; ++round) {
    if (use_once(&self, round) != 0) return 1;
  }
  // The whole job, after three reloads. A timeout of 30 s: a key lost with its folder makes a
  // join time out.
  mncl_config_t job = MNCL_CONFIG_INIT;
  job.timeout_ms = 30000;
  for (int round = 3; round < 6; ++round) {
    if (use_once(&job, round) != 0) return 1;
  }
  mncl_comm_t outer = nullptr, half = nullptr;
  CHECK_MNCL(mncl_comm_create(&job, &outer));
  for (int round = 6; round < 9; ++round) {
    if (use_once(&job, round) != 0) return 1;
  }
  int rank = -1;
  CHECK_MNCL(mncl_comm_rank(outer, &rank));
  CHECK_MNCL(mncl_comm_split(outer, rank % 2, 0, &half));
  CHECK_MNCL(mncl_comm_destroy(half));
  CHECK_MNCL(mncl_comm_destroy(outer));
  std::printf("recreate_test: 3 one-rank communicators and 7 job-wide ones OK\n");
  return 0;
}

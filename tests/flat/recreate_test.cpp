// MPI's lifetime under flat: MPI can be initialized only once per process, yet communicators
// come and go, and the core unloads the plugin when the last one is destroyed. So, under
// mpirun with MNCL_BACKEND=flat: create, use and destroy a one-rank flat communicator three
// times in each process (the plugin is unloaded and loaded again in between; MPI stays
// initialized), then a communicator over the whole job, and exit without any MPI call of our
// own — flat must finalize MPI at exit, or mpirun reports the rank as failed.
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
  if (use_once(nullptr, 3) != 0) return 1;  // the whole job, after three reloads
  std::printf("recreate_test: 3 one-rank communicators and one job-wide communicator OK\n");
  return 0;
}

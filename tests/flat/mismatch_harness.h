// What flat's mismatch tests (p2p_mismatch_test, rooted_v_mismatch_test) share: failures
// reported and counted per rank, guard elements after each receive buffer, and the communicator
// over the whole mpirun job.
#pragma once

#include <mncl/mncl.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace flat_test {

constexpr size_t kGuards = 16;  // guard elements after each receive buffer
constexpr int32_t kGuard = -7;

inline int g_failures = 0;

inline void fail(int rank, const std::string &what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, what.c_str());
  ++g_failures;
}

// The job's communicator, with rank and size. false when the test cannot go on: *exit_code is
// then 1 (no communicator) or 0 (a single rank: nothing to exchange).
inline bool open_world(const char *test, mncl_comm_t *comm, int *rank, int *size, int *exit_code) {
  *comm = nullptr;
  if (mncl_comm_create(nullptr, comm) != MNCL_OK) {
    std::fprintf(stderr, "mncl_comm_create: %s\n", mncl_last_error());
    *exit_code = 1;
    return false;
  }
  mncl_comm_rank(*comm, rank);
  mncl_comm_size(*comm, size);
  if (*size < 2) {
    std::printf("%s: needs 2 ranks or more; nothing to do\n", test);
    mncl_comm_destroy(*comm);
    *exit_code = 0;
    return false;
  }
  return true;
}

}  // namespace flat_test

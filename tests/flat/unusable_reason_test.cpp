// Once a flat communicator is unusable (MNCL_FLAT_BOUNDED=0: an allgatherv whose ranks disagree
// on a block's count fails after its data went out), every later call says why, quoting the
// first failure: the mismatch, not "timed out or aborted inside MPI", which sent users looking
// for a hang that never happened.
#include <mncl/mncl.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "mismatch_harness.h"

int main() {
  using flat_test::fail;
  mncl_comm_t comm = nullptr;
  int rank = 0, size = 0, exit_code = 0;
  if (!flat_test::open_world("flat_unusable_reason_test", &comm, &rank, &size, &exit_code)) {
    return exit_code;
  }
  // Rank 1 sends 3 elements and says so in its recvcounts[1]; the others expect 2.
  const size_t n = static_cast<size_t>(size);
  std::vector<size_t> counts(n, 2), displs(n);
  for (size_t i = 0; i < n; ++i) displs[i] = 4 * i;
  if (rank == 1) counts[1] = 3;
  std::vector<int32_t> send(3, rank), recv(4 * n, -1);
  mncl_request_t request = nullptr;
  mncl_status_t st =
      mncl_iallgatherv(comm, send.data(), counts[static_cast<size_t>(rank)], recv.data(),
                       counts.data(), displs.data(), MNCL_INT32, nullptr, &request);
  if (st == MNCL_OK) st = mncl_wait(request, 60000);
  const std::string first = st == MNCL_OK ? "" : mncl_last_error();
  if (st != MNCL_ERR_REMOTE || first.find("mismatched") == std::string::npos ||
      first.find("unusable") == std::string::npos) {
    fail(rank, "the mismatched allgatherv: got " + std::string(mncl_status_string(st)) + " (" +
                   first +
                   "), want MNCL_ERR_REMOTE naming the mismatch and the unusable "
                   "communicator");
  }
  st = mncl_barrier(comm, nullptr);
  const std::string next = st == MNCL_OK ? "" : mncl_last_error();
  if (st != MNCL_ERR_REMOTE || next.find("mismatched collective calls") == std::string::npos ||
      next.find("timed out") != std::string::npos) {
    fail(rank, "the barrier after it: got " + std::string(mncl_status_string(st)) + " (" + next +
                   "), want MNCL_ERR_REMOTE quoting the mismatch");
  } else if (rank == 0) {
    std::printf("the barrier after it: %s\n", next.c_str());
  }
  mncl_comm_destroy(comm);
  return flat_test::g_failures == 0 ? 0 : 1;
}

// flat's bounded mode (the default) against mismatched blocking collectives whose messages are
// past MPI's eager limit (16 KiB and more, where Open MPI 4.1's shared memory writes a longer
// message past the end of a receive buffer before it reports the truncation): under mpirun with
// MNCL_BACKEND=flat, every rank must fail with MNCL_ERR_REMOTE saying that no data was moved,
// nothing may be written into any receive buffer or past it, and the communicator must still
// work: a correct allreduce right after each mismatch gives the exact sum. Cases: a bcast whose
// root passes 4x the count of the others, an allreduce whose odd ranks pass 4x the count, and
// an allgatherv whose rank 1 sends 4x what the other ranks' recvcounts[1] says.
#include <mncl/mncl.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "mismatch_harness.h"

namespace {

using flat_test::fail;
using flat_test::kGuard;
using flat_test::kGuards;

constexpr size_t kSmall = 4096;  // int32 elements: 16 KiB, past the eager limit
constexpr size_t kLarge = 4 * kSmall;
constexpr int32_t kUntouched = -1;

// Every element of buf, receive area and guards, must still hold its initial value.
void expect_untouched(int rank, const std::vector<int32_t> &buf, size_t area, const char *what) {
  for (size_t i = 0; i < buf.size(); ++i) {
    const int32_t want = i < area ? kUntouched : kGuard;
    if (buf[i] != want) {
      fail(rank, std::string(what) + ": element " + std::to_string(i) + " of the receive buffer" +
                     (i < area ? "" : " (a guard past it)") + " was written");
      return;
    }
  }
}

void expect_refused(int rank, mncl_status_t st, const char *what) {
  const std::string message = st == MNCL_OK ? "" : mncl_last_error();
  if (st != MNCL_ERR_REMOTE || message.find("no data was moved") == std::string::npos) {
    fail(rank, std::string(what) + ": expected MNCL_ERR_REMOTE saying no data was moved, got " +
                   mncl_status_string(st) + ": " + message);
  }
}

// The communicator still works: a correct allreduce gives the exact sum.
void expect_usable(mncl_comm_t comm, int rank, int size, const char *after) {
  std::vector<int32_t> send(kSmall, rank + 1), recv(kSmall, 0);
  const mncl_status_t st =
      mncl_allreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr);
  const int32_t sum = size * (size + 1) / 2;
  if (st != MNCL_OK) {
    fail(rank, std::string("allreduce after ") + after + ": " + mncl_last_error());
    return;
  }
  for (int32_t v : recv) {
    if (v != sum) {
      fail(rank, std::string("allreduce after ") + after + ": wrong sum");
      return;
    }
  }
}

}  // namespace

int main() {
  mncl_comm_t comm = nullptr;
  int rank = 0, size = 0, code = 0;
  if (!flat_test::open_world("flat_bounded_mismatch_test", &comm, &rank, &size, &code)) {
    return code;
  }
  const bool odd = rank % 2 == 1;

  {  // bcast: the root sends kLarge elements, the others expect kSmall.
    const size_t count = rank == 0 ? kLarge : kSmall;
    std::vector<int32_t> buf(count + kGuards, kUntouched);
    for (size_t i = count; i < buf.size(); ++i) buf[i] = kGuard;
    if (rank == 0) {
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int32_t>(i);
    }
    const mncl_status_t st = mncl_bcast(comm, buf.data(), count, MNCL_INT32, 0, nullptr);
    expect_refused(rank, st, "bcast of 4x the count on the root");
    if (rank != 0) expect_untouched(rank, buf, count, "bcast");
    expect_usable(comm, rank, size, "the mismatched bcast");
  }
  {  // allreduce: odd ranks pass kLarge elements, even ones kSmall.
    const size_t count = odd ? kLarge : kSmall;
    std::vector<int32_t> send(count, 1), recv(count + kGuards, kUntouched);
    for (size_t i = count; i < recv.size(); ++i) recv[i] = kGuard;
    const mncl_status_t st =
        mncl_allreduce(comm, send.data(), recv.data(), count, MNCL_INT32, MNCL_SUM, nullptr);
    expect_refused(rank, st, "allreduce of 4x the count on odd ranks");
    expect_untouched(rank, recv, count, "allreduce");
    expect_usable(comm, rank, size, "the mismatched allreduce");
  }
  {  // allgatherv: rank 1 sends kLarge (and says so in its own recvcounts[1]); every other
     // rank's recvcounts[1] says kSmall.
    const size_t n = static_cast<size_t>(size);
    const size_t mine = rank == 1 ? kLarge : kSmall;
    std::vector<size_t> counts(n, kSmall), displs(n);
    counts[1] = mine;
    for (size_t i = 0; i < n; ++i) displs[i] = i * (kLarge + kGuards);
    const size_t extent = n * (kLarge + kGuards);
    std::vector<int32_t> send(mine, rank), recv(extent, kUntouched);
    const mncl_status_t st = mncl_allgatherv(comm, send.data(), mine, recv.data(), counts.data(),
                                             displs.data(), MNCL_INT32, nullptr);
    expect_refused(rank, st, "allgatherv with rank 1 sending 4x its recvcounts[1]");
    for (size_t e = 0; e < extent; ++e) {
      if (recv[e] != kUntouched) {
        fail(rank, "allgatherv: element " + std::to_string(e) + " was written");
        break;
      }
    }
    expect_usable(comm, rank, size, "the mismatched allgatherv");
  }
  mncl_comm_destroy(comm);
  std::printf("rank %d: %s\n", rank, flat_test::g_failures == 0 ? "PASS" : "FAIL");
  return flat_test::g_failures == 0 ? 0 : 1;
}

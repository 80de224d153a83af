// flat's bounded mode (the default) against mismatched blocking collectives whose messages are
// past MPI's eager limit (16 KiB and more, where Open MPI 4.1's shared memory writes a longer
// message past the end of a receive buffer before it reports the truncation): under mpirun with
// MNCL_BACKEND=flat, every rank must fail with MNCL_ERR_REMOTE saying that no data was moved,
// nothing may be written into any receive buffer or past it, and the communicator must still
// work: a correct allreduce right after each mismatch gives the exact sum. Cases: a bcast whose
// root passes 4x the count of the others, an allreduce whose odd ranks pass 4x the count (also
// small ones, whose data travel with the checks: 16 against 64 int32, 200 against 800), and
// an allgatherv whose rank 1 sends 4x what the other ranks' recvcounts[1] says; each as a
// blocking call and as a posted one (mncl_i*, then mncl_wait), whose data wait for its checks.
// A fourth: rank 1 calls allgatherv where the others call allreduce (one check exchange per
// call whatever the kind, so the checks stay in step). Posted calls also keep their order: a
// correct call posted behind a mismatched one completes first and right, a blocking
// collective behind posted ones waits for their data, and a posted collective's data go out
// while the application waits on a receive, or in a blocking collective on another
// communicator, whose peer waits for that collective; and while the application waits outside
// flat, in a raw MPI_Barrier or a naive communicator's allreduce (flat's progress thread). With
// --stall: rank 1 never takes part in
// the collectives of three communicators; what rank 0 posted there fails with the timeout or the
// abort, what was queued behind it fails "never started", no receive buffer is written, and a
// blocking collective behind a stuck posted one times out too.
#include <mncl/mncl.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mismatch_harness.h"

namespace {

using flat_test::fail;
using flat_test::kGuard;
using flat_test::kGuards;

constexpr size_t kSmall = 4096;  // int32 elements: 16 KiB, past the eager limit
constexpr size_t kLarge = 4 * kSmall;
constexpr size_t kFusedInts =
    960;  // int32 elements: 3840 bytes, the most that travels in the checks
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

// Allreduces on either side of the 3840 bytes that travel inside the check exchange give exact
// results, blocking or posted: int32 SUM of 960 (fused) and 961 elements, float64 AVG of 480
// (fused) and 481.
void expect_fused_exact(mncl_comm_t comm, int rank, int size, bool posted,
                        const std::string &after) {
  const int64_t ranks_sum = int64_t{size} * (size + 1) / 2;
  for (const size_t n : {size_t{960}, size_t{961}, size_t{480}, size_t{481}}) {
    const bool sum = n > 700;
    std::vector<int32_t> isend(n), irecv(n, 0);
    std::vector<double> dsend(n), drecv(n, 0);
    for (size_t i = 0; i < n; ++i) {
      isend[i] = static_cast<int32_t>((rank + 1) * static_cast<int64_t>(i + 1));
      dsend[i] = static_cast<double>(size * (rank + 1) + static_cast<int64_t>(i));
    }
    void *recv = sum ? static_cast<void *>(irecv.data()) : static_cast<void *>(drecv.data());
    const void *send =
        sum ? static_cast<const void *>(isend.data()) : static_cast<const void *>(dsend.data());
    const mncl_dtype_t dtype = sum ? MNCL_INT32 : MNCL_FLOAT64;
    const mncl_op_t op = sum ? MNCL_SUM : MNCL_AVG;
    mncl_request_t request = nullptr;
    mncl_status_t st = posted ? mncl_iallreduce(comm, send, recv, n, dtype, op, nullptr, &request)
                              : mncl_allreduce(comm, send, recv, n, dtype, op, nullptr);
    if (posted && st == MNCL_OK) st = mncl_wait(request, -1);
    const std::string what = std::string(sum ? "int32 SUM" : "float64 AVG") + " of " +
                             std::to_string(n) + " after " + after;
    if (st != MNCL_OK) {
      fail(rank, what + ": " + mncl_last_error());
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      // float64: the ranks' size * (r + 1) + i add up to size * (ranks_sum + i).
      const bool right = sum ? irecv[i] == ranks_sum * static_cast<int64_t>(i + 1)
                             : drecv[i] == static_cast<double>(ranks_sum + static_cast<int64_t>(i));
      if (!right) {
        fail(rank, what + ": wrong value at element " + std::to_string(i));
        break;
      }
    }
  }
}

// A blocking call's status (request == nullptr), or a posted one's once waited for. The
// request is read here, after the call that set it.
mncl_status_t completed(mncl_status_t st, const mncl_request_t *request) {
  if (request == nullptr || st != MNCL_OK) return st;
  return mncl_wait(*request, -1);
}

// The three mismatches, blocking or posted.
void mismatches(mncl_comm_t comm, int rank, int size, bool posted) {
  const bool odd = rank % 2 == 1;
  const std::string how = posted ? " (posted)" : "";
  mncl_request_t request = nullptr;
  mncl_request_t *req = posted ? &request : nullptr;
  {  // bcast: the root sends kLarge elements, the others expect kSmall.
    const size_t count = rank == 0 ? kLarge : kSmall;
    std::vector<int32_t> buf(count + kGuards, kUntouched);
    for (size_t i = count; i < buf.size(); ++i) buf[i] = kGuard;
    if (rank == 0) {
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int32_t>(i);
    }
    const mncl_status_t st =
        completed(posted ? mncl_ibcast(comm, buf.data(), count, MNCL_INT32, 0, nullptr, req)
                         : mncl_bcast(comm, buf.data(), count, MNCL_INT32, 0, nullptr),
                  req);
    expect_refused(rank, st, ("bcast of 4x the count on the root" + how).c_str());
    if (rank != 0) expect_untouched(rank, buf, count, ("bcast" + how).c_str());
    expect_usable(comm, rank, size, ("the mismatched bcast" + how).c_str());
  }
  // allreduce: some ranks pass 4x the count of the others: past the eager limit (kSmall, odd
  // ranks), and small ones whose data travel inside the check exchange (up to 3840 bytes): both
  // fused (16 and 64 int32; odd ranks, then the last rank alone, so that the other ranks' data
  // are reduced before the mismatch shows; 240 and 960, the largest element) and one fused, one
  // not (600 and 2400).
  struct Mismatch {
    size_t small;
    bool last_only;
  };
  for (const Mismatch m : {Mismatch{kSmall, false}, Mismatch{16, false}, Mismatch{16, true},
                           Mismatch{240, false}, Mismatch{600, false}}) {
    const bool more = m.last_only ? rank == size - 1 : odd;
    const size_t count = more ? 4 * m.small : m.small;
    std::vector<int32_t> send(count, 1), recv(count + kGuards, kUntouched);
    for (size_t i = count; i < recv.size(); ++i) recv[i] = kGuard;
    const mncl_status_t st = completed(
        posted
            ? mncl_iallreduce(comm, send.data(), recv.data(), count, MNCL_INT32, MNCL_SUM, nullptr,
                              req)
            : mncl_allreduce(comm, send.data(), recv.data(), count, MNCL_INT32, MNCL_SUM, nullptr),
        req);
    const std::string what = "allreduce of " + std::to_string(m.small) + " and " +
                             std::to_string(4 * m.small) + " int32" +
                             (m.last_only ? " (the last rank)" : "") + how;
    expect_refused(rank, st, what.c_str());
    expect_untouched(rank, recv, count, what.c_str());
    expect_usable(comm, rank, size, what.c_str());
    if (m.small != kSmall) expect_fused_exact(comm, rank, size, posted, what);
  }
  {  // A small allreduce whose last rank asks for AVG where the others ask for SUM.
    const mncl_op_t op = rank == size - 1 ? MNCL_AVG : MNCL_SUM;
    std::vector<int32_t> send(16, 1), recv(16 + kGuards, kUntouched);
    for (size_t i = 16; i < recv.size(); ++i) recv[i] = kGuard;
    const mncl_status_t st = completed(
        posted ? mncl_iallreduce(comm, send.data(), recv.data(), 16, MNCL_INT32, op, nullptr, req)
               : mncl_allreduce(comm, send.data(), recv.data(), 16, MNCL_INT32, op, nullptr),
        req);
    const std::string what = "allreduce of 16 int32, SUM against AVG" + how;
    expect_refused(rank, st, what.c_str());
    expect_untouched(rank, recv, 16, what.c_str());
    expect_fused_exact(comm, rank, size, posted, what);
  }
  // Small calls of the other kinds whose data travel inside the check exchange (a broadcast
  // and an allgather with the direct exchange, a reduce, a reduce-scatter): odd ranks pass 4x
  // the count of the others (16 and 64 int32, both fused). Nothing may be written anywhere.
  for (const std::string kind : {"bcast", "allgather", "reduce", "reduce_scatter"}) {
    const size_t count = odd ? 64 : 16, n = static_cast<size_t>(size);
    const size_t in = kind == "reduce_scatter" ? n * count : count;
    const size_t out = kind == "allgather" ? n * count : count;
    std::vector<int32_t> send(in, rank + 1), recv(out + kGuards, kUntouched);
    for (size_t i = out; i < recv.size(); ++i) recv[i] = kGuard;
    if (kind == "bcast" && rank == 0) std::fill(recv.begin(), recv.begin() + out, 7);
    mncl_status_t st = MNCL_OK;
    if (kind == "bcast") {
      st = completed(posted ? mncl_ibcast(comm, recv.data(), count, MNCL_INT32, 0, nullptr, req)
                            : mncl_bcast(comm, recv.data(), count, MNCL_INT32, 0, nullptr),
                     req);
    } else if (kind == "allgather") {
      st = completed(
          posted ? mncl_iallgather(comm, send.data(), recv.data(), count, MNCL_INT32, nullptr, req)
                 : mncl_allgather(comm, send.data(), recv.data(), count, MNCL_INT32, nullptr),
          req);
    } else if (kind == "reduce") {
      st = completed(posted ? mncl_ireduce(comm, send.data(), recv.data(), count, MNCL_INT32,
                                           MNCL_SUM, 0, nullptr, req)
                            : mncl_reduce(comm, send.data(), recv.data(), count, MNCL_INT32,
                                          MNCL_SUM, 0, nullptr),
                     req);
    } else {
      st = completed(posted ? mncl_ireduce_scatter(comm, send.data(), recv.data(), count,
                                                   MNCL_INT32, MNCL_SUM, nullptr, req)
                            : mncl_reduce_scatter(comm, send.data(), recv.data(), count, MNCL_INT32,
                                                  MNCL_SUM, nullptr),
                     req);
    }
    const std::string what = kind + " of 16 and 64 int32" + how;
    expect_refused(rank, st, what.c_str());
    if (!(kind == "bcast" && rank == 0)) expect_untouched(rank, recv, out, what.c_str());
    expect_usable(comm, rank, size, ("the mismatched " + what).c_str());
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
    const mncl_status_t st =
        completed(posted ? mncl_iallgatherv(comm, send.data(), mine, recv.data(), counts.data(),
                                            displs.data(), MNCL_INT32, nullptr, req)
                         : mncl_allgatherv(comm, send.data(), mine, recv.data(), counts.data(),
                                           displs.data(), MNCL_INT32, nullptr),
                  req);
    expect_refused(rank, st, ("allgatherv with rank 1 sending 4x its recvcounts[1]" + how).c_str());
    for (size_t e = 0; e < extent; ++e) {
      if (recv[e] != kUntouched) {
        fail(rank, "allgatherv" + how + ": element " + std::to_string(e) + " was written");
        break;
      }
    }
    expect_usable(comm, rank, size, ("the mismatched allgatherv" + how).c_str());
  }
  {  // rank 1: allgatherv of kSmall per rank; the others: allreduce of kSmall.
    const size_t n = static_cast<size_t>(size);
    std::vector<size_t> counts(n, kSmall), displs(n);
    for (size_t i = 0; i < n; ++i) displs[i] = i * kSmall;
    const size_t area = rank == 1 ? n * kSmall : kSmall;
    std::vector<int32_t> send(kSmall, rank), recv(area + kGuards, kUntouched);
    for (size_t i = area; i < recv.size(); ++i) recv[i] = kGuard;
    mncl_status_t st;
    if (rank == 1) {
      st =
          completed(posted ? mncl_iallgatherv(comm, send.data(), kSmall, recv.data(), counts.data(),
                                              displs.data(), MNCL_INT32, nullptr, req)
                           : mncl_allgatherv(comm, send.data(), kSmall, recv.data(), counts.data(),
                                             displs.data(), MNCL_INT32, nullptr),
                    req);
    } else {
      st = completed(posted ? mncl_iallreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32,
                                              MNCL_SUM, nullptr, req)
                            : mncl_allreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32,
                                             MNCL_SUM, nullptr),
                     req);
    }
    expect_refused(rank, st, ("allgatherv on rank 1 against allreduce" + how).c_str());
    expect_untouched(rank, recv, area, ("allgatherv against allreduce" + how).c_str());
    expect_usable(comm, rank, size, ("allgatherv against allreduce" + how).c_str());
  }
}

// A mismatched allreduce posted, then a correct one behind it, waited for in reverse order.
void correct_call_behind_a_mismatched_one(mncl_comm_t comm, int rank, int size) {
  const size_t bad_count = rank % 2 == 1 ? kLarge : kSmall;
  std::vector<int32_t> bad_send(bad_count, 1), bad_recv(bad_count + kGuards, kUntouched);
  for (size_t i = bad_count; i < bad_recv.size(); ++i) bad_recv[i] = kGuard;
  std::vector<int32_t> send(kSmall, rank + 1), recv(kSmall, 0);
  mncl_request_t bad = nullptr, good = nullptr;
  if (mncl_iallreduce(comm, bad_send.data(), bad_recv.data(), bad_count, MNCL_INT32, MNCL_SUM,
                      nullptr, &bad) != MNCL_OK ||
      mncl_iallreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr,
                      &good) != MNCL_OK) {
    fail(rank, std::string("posting two allreduces: ") + mncl_last_error());
    return;
  }
  if (mncl_wait(good, -1) != MNCL_OK) {
    fail(rank, std::string("the correct allreduce behind a mismatched one: ") + mncl_last_error());
  } else {
    const int32_t sum = size * (size + 1) / 2;
    for (int32_t v : recv) {
      if (v != sum) {
        fail(rank, "the correct allreduce behind a mismatched one: wrong sum");
        break;
      }
    }
  }
  expect_refused(rank, mncl_wait(bad, -1), "the mismatched allreduce, waited for second");
  expect_untouched(rank, bad_recv, bad_count, "the mismatched allreduce, waited for second");
  expect_usable(comm, rank, size, "two posted allreduces");
}

// Every rank but rank 1 posts at once; rank 1 after a pause, so that the others' checks are
// still out when they return from posting (their data then wait in the queue).
void pause_on_rank_1(int rank) {
  if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

// Every element is the sum over the ranks of scale * (rank + 1).
void expect_sum(int rank, int size, const std::vector<int32_t> &recv, const char *what,
                int32_t scale = 1) {
  const int32_t sum = scale * size * (size + 1) / 2;
  for (int32_t v : recv) {
    if (v != sum) {
      fail(rank, std::string(what) + ": wrong sum");
      return;
    }
  }
}

// Two allreduces posted, then a small blocking one (its data in its checks, which do not wait
// for the posted ones' data) and a blocking one that waits for their data: all four right
// (each sums other values, so calls paired out of order across the ranks would show).
void blocking_call_behind_posted_ones(mncl_comm_t comm, int rank, int size) {
  std::vector<int32_t> send_a(kSmall, rank + 1), send_b(kSmall, 10 * (rank + 1)),
      send_c(kSmall, 100 * (rank + 1)), send_d(kFusedInts, 1000 * (rank + 1)), a(kSmall, 0),
      b(kSmall, 0), c(kSmall, 0), d(kFusedInts, 0);
  mncl_request_t ra = nullptr, rb = nullptr;
  pause_on_rank_1(rank);
  if (mncl_iallreduce(comm, send_a.data(), a.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr, &ra) !=
          MNCL_OK ||
      mncl_iallreduce(comm, send_b.data(), b.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr, &rb) !=
          MNCL_OK) {
    fail(rank, std::string("posting two allreduces: ") + mncl_last_error());
    return;
  }
  if (mncl_allreduce(comm, send_d.data(), d.data(), kFusedInts, MNCL_INT32, MNCL_SUM, nullptr) !=
      MNCL_OK) {
    fail(rank, std::string("a small blocking allreduce behind posted ones: ") + mncl_last_error());
  }
  if (mncl_allreduce(comm, send_c.data(), c.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr) !=
      MNCL_OK) {
    fail(rank, std::string("a blocking allreduce behind posted ones: ") + mncl_last_error());
  }
  if (mncl_wait(ra, -1) != MNCL_OK || mncl_wait(rb, -1) != MNCL_OK) {
    fail(rank, std::string("posted allreduces before a blocking one: ") + mncl_last_error());
  }
  expect_sum(rank, size, a, "the first posted allreduce");
  expect_sum(rank, size, b, "the second posted allreduce", 10);
  expect_sum(rank, size, c, "the blocking allreduce behind them", 100);
  expect_sum(rank, size, d, "the small blocking allreduce behind them", 1000);
}

// Rank 0 waits in a blocking allreduce on another communicator while rank 1 first waits for a
// posted allreduce on `comm`: rank 0's blocking call must move that allreduce's data on.
void collective_progresses_under_another_communicator(mncl_comm_t comm, int rank, int size) {
  mncl_comm_t other = nullptr;
  if (mncl_comm_split(comm, 0, rank, &other) != MNCL_OK) {
    fail(rank, std::string("mncl_comm_split: ") + mncl_last_error());
    return;
  }
  std::vector<int32_t> send(kSmall, rank + 1), recv(kSmall, 0), other_recv(kSmall, 0);
  mncl_request_t request = nullptr;
  pause_on_rank_1(rank);
  if (mncl_iallreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr,
                      &request) != MNCL_OK) {
    fail(rank, std::string("posting an allreduce: ") + mncl_last_error());
    mncl_comm_destroy(other);
    return;
  }
  const auto blocking_on_other = [&] {
    if (mncl_allreduce(other, send.data(), other_recv.data(), kSmall, MNCL_INT32, MNCL_SUM,
                       nullptr) != MNCL_OK) {
      fail(rank, std::string("a blocking allreduce on another communicator: ") + mncl_last_error());
    }
  };
  if (rank != 1) blocking_on_other();
  if (mncl_wait(request, -1) != MNCL_OK) {
    fail(rank, std::string("a posted allreduce beside another communicator's blocking one: ") +
                   mncl_last_error());
  }
  if (rank == 1) blocking_on_other();
  expect_sum(rank, size, recv, "a posted allreduce beside another communicator's blocking one");
  expect_sum(rank, size, other_recv, "the blocking allreduce on another communicator");
  mncl_comm_destroy(other);
}

// Rank 0 waits on a receive whose sender (rank 1) first waits for a posted allreduce: rank 0's
// receive must move the allreduce's data on.
void collective_progresses_under_a_receive(mncl_comm_t comm, int rank, int size) {
  std::vector<int32_t> send(kSmall, rank + 1), recv(kSmall, 0);
  mncl_request_t request = nullptr;
  pause_on_rank_1(rank);
  if (mncl_iallreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr,
                      &request) != MNCL_OK) {
    fail(rank, std::string("posting an allreduce: ") + mncl_last_error());
    return;
  }
  int32_t token = rank == 1 ? 42 : 0;
  if (rank == 0 && mncl_recv(comm, &token, 1, MNCL_INT32, 1, nullptr) != MNCL_OK) {
    fail(rank, std::string("a receive beside a posted allreduce: ") + mncl_last_error());
  }
  if (mncl_wait(request, -1) != MNCL_OK) {
    fail(rank, std::string("a posted allreduce beside a receive: ") + mncl_last_error());
    return;
  }
  if (rank == 1 && mncl_send(comm, &token, 1, MNCL_INT32, 0, nullptr) != MNCL_OK) {
    fail(rank, std::string("the send after the allreduce: ") + mncl_last_error());
  }
  if (rank == 0 && token != 42) fail(rank, "the receive beside a posted allreduce: wrong value");
  expect_sum(rank, size, recv, "a posted allreduce beside a receive");
}

// A failure of the expected status whose message says `says` (when given).
void expect_failure(int rank, mncl_status_t st, mncl_status_t want, const char *says,
                    const std::string &what) {
  const std::string message = st == MNCL_OK ? "" : mncl_last_error();
  if (st != want || (says != nullptr && message.find(says) == std::string::npos)) {
    fail(rank, what + ": expected " + mncl_status_string(want) +
                   (says != nullptr ? std::string(" saying \"") + says + "\"" : "") + ", got " +
                   mncl_status_string(st) + ": " + message);
  } else {
    std::printf("%s: %s\n", what.c_str(), message.c_str());
  }
}

// Rank 0's posted allreduce whose peers never call: its buffers, and whether it was posted.
struct Stuck {
  std::vector<int32_t> send = std::vector<int32_t>(kSmall, 1);
  std::vector<int32_t> recv = std::vector<int32_t>(kSmall + kGuards, kUntouched);
  mncl_request_t request = nullptr;

  bool post(mncl_comm_t comm, int rank, const char *what) {
    for (size_t i = kSmall; i < recv.size(); ++i) recv[i] = kGuard;
    if (mncl_iallreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr,
                        &request) == MNCL_OK) {
      return true;
    }
    fail(rank, std::string("posting ") + what + ": " + mncl_last_error());
    return false;
  }
  void expect_untouched_after(int rank, const char *what) const {
    expect_untouched(rank, recv, kSmall, what);
  }
};

// --stall: rank 1 only creates and destroys the four communicators (and takes part in the
// world's barrier); rank 0 posts collectives there that can never pass their checks.
int stall() {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.timeout_ms = 1000;
  mncl_comm_t world = nullptr, timed = nullptr, timed_blocking = nullptr, timed_fused = nullptr,
              aborted = nullptr;
  int rank = -1;
  if (mncl_comm_create(nullptr, &world) != MNCL_OK || mncl_comm_rank(world, &rank) != MNCL_OK ||
      mncl_comm_create(&config, &timed) != MNCL_OK ||
      mncl_comm_create(&config, &timed_blocking) != MNCL_OK ||
      mncl_comm_create(&config, &timed_fused) != MNCL_OK ||
      mncl_comm_split(world, 0, rank, &aborted) != MNCL_OK) {
    std::fprintf(stderr, "rank %d: communicators: %s\n", rank, mncl_last_error());
    return 1;
  }
  if (rank == 0) {
    {  // Two posted, the second waited for first: it times out in the queue; the first, at
       // the head, then never starts (this rank is out of step with its peers).
      Stuck first, second;
      if (first.post(timed, rank, "the first allreduce") &&
          second.post(timed, rank, "the second allreduce")) {
        expect_failure(rank, mncl_wait(second.request, -1), MNCL_ERR_TIMEOUT, nullptr,
                       "stall: the second posted allreduce, waited for first");
        expect_failure(rank, mncl_wait(first.request, -1), MNCL_ERR_REMOTE, "never started",
                       "stall: the first posted allreduce, after the second timed out");
      }
      first.expect_untouched_after(rank, "stall: the first posted allreduce");
      second.expect_untouched_after(rank, "stall: the second posted allreduce");
      std::vector<int32_t> send(kSmall, 1), recv(kSmall, kUntouched);
      expect_failure(
          rank,
          mncl_allreduce(timed, send.data(), recv.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr),
          MNCL_ERR_REMOTE, "destroy the communicator",
          "stall: a blocking allreduce after the timeout");
    }
    {  // A blocking allreduce behind a stuck posted one: it times out waiting for the posted
       // one's checks, and the posted one never starts.
      Stuck posted;
      if (posted.post(timed_blocking, rank, "an allreduce")) {
        std::vector<int32_t> send(kSmall, 1), recv(kSmall, kUntouched);
        expect_failure(rank,
                       mncl_allreduce(timed_blocking, send.data(), recv.data(), kSmall, MNCL_INT32,
                                      MNCL_SUM, nullptr),
                       MNCL_ERR_TIMEOUT, "did not pass its checks in time",
                       "stall: a blocking allreduce behind a stuck posted one");
        expect_failure(rank, mncl_wait(posted.request, -1), MNCL_ERR_REMOTE, "never started",
                       "stall: the posted allreduce before a blocking one that timed out");
      }
      posted.expect_untouched_after(rank, "stall: the posted allreduce before a blocking one");
    }
    {  // The same with a blocking allreduce small enough to travel in its checks (which need
       // not wait for the posted one's data): it times out on its own checks, nothing written,
       // and the posted one fails too.
      Stuck posted;
      if (posted.post(timed_fused, rank, "an allreduce")) {
        std::vector<int32_t> send(kFusedInts, 1), recv(kFusedInts + kGuards, kUntouched);
        for (size_t i = kFusedInts; i < recv.size(); ++i) recv[i] = kGuard;
        expect_failure(rank,
                       mncl_allreduce(timed_fused, send.data(), recv.data(), kFusedInts, MNCL_INT32,
                                      MNCL_SUM, nullptr),
                       MNCL_ERR_TIMEOUT, "not complete after the communicator's timeout",
                       "stall: a small blocking allreduce behind a stuck posted one");
        expect_untouched(rank, recv, kFusedInts,
                         "stall: a small blocking allreduce behind a stuck posted one");
        const mncl_status_t status = mncl_wait(posted.request, -1);
        if (status != MNCL_ERR_TIMEOUT && status != MNCL_ERR_REMOTE) {
          fail(rank, std::string("stall: the posted allreduce before a small blocking one: ") +
                         mncl_status_string(status) +
                         ", want a timeout or REMOTE: " + mncl_last_error());
        }
      }
      posted.expect_untouched_after(rank,
                                    "stall: the posted allreduce before a small blocking one");
    }
    {  // Two posted, the communicator aborted from another thread: the first fails ABORTED,
       // the second, queued behind it, never starts.
      Stuck first, second;
      if (first.post(aborted, rank, "the first allreduce") &&
          second.post(aborted, rank, "the second allreduce")) {
        std::thread aborter([aborted] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          mncl_comm_abort(aborted);
        });
        expect_failure(rank, mncl_wait(first.request, -1), MNCL_ERR_ABORTED, nullptr,
                       "stall: the first posted allreduce, aborted");
        aborter.join();
        expect_failure(rank, mncl_wait(second.request, -1), MNCL_ERR_ABORTED, "never started",
                       "stall: the second posted allreduce, queued behind the aborted one");
      }
      first.expect_untouched_after(rank, "stall: the first posted allreduce, aborted");
      second.expect_untouched_after(rank, "stall: the second posted allreduce, aborted");
    }
  }
  // In step again on the world communicator (default timeout), then done.
  if (mncl_barrier(world, nullptr) != MNCL_OK) {
    fail(rank, std::string("barrier: ") + mncl_last_error());
  }
  mncl_comm_destroy(aborted);
  mncl_comm_destroy(timed_fused);
  mncl_comm_destroy(timed_blocking);
  mncl_comm_destroy(timed);
  mncl_comm_destroy(world);
  std::printf("rank %d: stall cases: %s\n", rank, flat_test::g_failures == 0 ? "PASS" : "FAIL");
  return flat_test::g_failures == 0 ? 0 : 1;
}

// Rank 0 waits outside flat while rank 1 first waits for a posted allreduce: in a raw
// MPI_Barrier, then in an allreduce on a naive communicator. Under MPI_THREAD_MULTIPLE flat's
// progress thread must issue rank 0's data meanwhile (MPI's own non-blocking collectives
// progress inside any MPI call). A 20 s timeout: without it, rank 1 fails with
// MNCL_ERR_TIMEOUT.
// A small allreduce (its data inside its check) posted by a rank that then waits outside flat,
// in MPI_Barrier, while its peers wait for the allreduce first. Without flat's progress thread
// its check goes from every rank to every other at once (also where MNCL_FLAT_CHECK_EXCHANGE=
// doubling), which MPI completes inside the barrier; with it, the thread steps the exchange.
void small_collective_progresses_outside_flat(int rank, int size) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.timeout_ms = 20000;
  mncl_comm_t comm = nullptr;
  if (mncl_comm_create(&config, &comm) != MNCL_OK) {
    fail(rank, std::string("a small posted allreduce: mncl_comm_create: ") + mncl_last_error());
    return;
  }
  std::vector<int32_t> send(2, rank + 1), recv(2, 0);
  mncl_request_t request = nullptr;
  mncl_status_t st = mncl_iallreduce(comm, send.data(), recv.data(), send.size(), MNCL_INT32,
                                     MNCL_SUM, nullptr, &request);
  const auto barrier = [&] {
    if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) fail(rank, "small posted: MPI_Barrier failed");
  };
  if (st == MNCL_OK && rank == 1) barrier();
  if (st == MNCL_OK) st = mncl_wait(request, -1);
  if (rank != 1) barrier();
  if (st != MNCL_OK) {
    fail(rank, std::string("a small allreduce posted while a peer waits in MPI_Barrier: ") +
                   mncl_status_string(st) + ": " + mncl_last_error());
  } else if (recv != std::vector<int32_t>(2, size * (size + 1) / 2)) {
    fail(rank, "a small allreduce posted while a peer waits in MPI_Barrier: wrong result");
  }
  mncl_comm_destroy(comm);
}

void collective_progresses_outside_flat(int rank, int size) {
  // flat asks for MPI_THREAD_MULTIPLE, which Open MPI grants: below it there is no thread.
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    fail(rank, "MPI runs below MPI_THREAD_MULTIPLE: flat has no progress thread");
    return;
  }
  // A communicator of its own per case: a case that fails leaves it unusable.
  for (const char *outside : {"MPI_Barrier", "a naive allreduce"}) {
    const std::string where = std::string("a posted allreduce while a peer waits in ") + outside;
    mncl_config_t config = MNCL_CONFIG_INIT;
    config.timeout_ms = 20000;
    mncl_comm_t comm = nullptr, naive = nullptr;
    if (mncl_comm_create(&config, &comm) != MNCL_OK) {
      fail(rank, where + ": mncl_comm_create: " + mncl_last_error());
      return;
    }
    config.backend = "naive";
    if (mncl_comm_split_config(comm, 0, rank, &config, &naive) != MNCL_OK) {
      fail(rank, where + ": a naive communicator: " + mncl_last_error());
      mncl_comm_destroy(comm);
      return;
    }
    std::vector<int32_t> send(kSmall, rank + 1), recv(kSmall, 0), naive_recv(kSmall, 0);
    mncl_request_t request = nullptr;
    // Rank 1 posts only once every other rank has posted (a token each, raw MPI): their posts
    // then find their checks incomplete, so the thread, not the posting call, issues the data.
    int token = 0;
    if (rank == 1) {
      for (int peer = 0; peer < size; ++peer) {
        if (peer != 1) MPI_Recv(&token, 1, MPI_INT, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      }
    }
    if (mncl_iallreduce(comm, send.data(), recv.data(), kSmall, MNCL_INT32, MNCL_SUM, nullptr,
                        &request) != MNCL_OK) {
      fail(rank, "posting " + where + ": " + mncl_last_error());
      request = nullptr;
    }
    if (rank != 1) MPI_Send(&token, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
    const auto wait_outside = [&] {
      if (outside[0] == 'M') {
        if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) fail(rank, where + ": MPI_Barrier failed");
      } else if (mncl_allreduce(naive, send.data(), naive_recv.data(), kSmall, MNCL_INT32, MNCL_SUM,
                                nullptr) != MNCL_OK) {
        fail(rank, where + ": the naive allreduce: " + mncl_last_error());
      } else {
        expect_sum(rank, size, naive_recv, (where + ": the naive allreduce").c_str());
      }
    };
    if (rank != 1) wait_outside();
    if (request != nullptr && mncl_wait(request, -1) != MNCL_OK) {
      fail(rank, where + ": " + mncl_last_error());
    } else if (request != nullptr) {
      expect_sum(rank, size, recv, where.c_str());
    }
    if (rank == 1) wait_outside();
    mncl_comm_destroy(naive);
    mncl_comm_destroy(comm);
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::string(argv[1]) == "--stall") return stall();
  mncl_comm_t comm = nullptr;
  int rank = 0, size = 0, code = 0;
  if (!flat_test::open_world("flat_bounded_mismatch_test", &comm, &rank, &size, &code)) {
    return code;
  }
  mismatches(comm, rank, size, false);
  mismatches(comm, rank, size, true);
  correct_call_behind_a_mismatched_one(comm, rank, size);
  blocking_call_behind_posted_ones(comm, rank, size);
  collective_progresses_under_a_receive(comm, rank, size);
  collective_progresses_under_another_communicator(comm, rank, size);
  small_collective_progresses_outside_flat(rank, size);
  // MNCL_FLAT_PROGRESS_THREAD=0 (flat.bounded_mismatch_no_progress_thread.np3): the cases
  // above progress by flat calls alone; waiting outside flat would time out.
  const char *progress_thread = std::getenv("MNCL_FLAT_PROGRESS_THREAD");
  if (progress_thread == nullptr || std::string(progress_thread) != "0") {
    collective_progresses_outside_flat(rank, size);
  }
  mncl_comm_destroy(comm);
  std::printf("rank %d: %s\n", rank, flat_test::g_failures == 0 ? "PASS" : "FAIL");
  return flat_test::g_failures == 0 ? 0 : 1;
}

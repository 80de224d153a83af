// flat's native gatherv / scatterv (plugin ABI v5) when one rank's count disagrees with the
// root's: under mpirun with MNCL_BACKEND=flat (bounded or not), for both kinds, blocking and
// non-blocking, the disagreeing block longer and shorter than its receiver expects, at two
// roots, with blocks small enough for MPI to send eagerly and large enough for its rendezvous
// protocol (where Open MPI 4.1's shared-memory transport writes a longer message past the end
// of the receive buffer before it reports the truncation: flat must never let it). The receiving
// rank (the root for gatherv, the odd rank for scatterv) must fail with MNCL_ERR_REMOTE naming its
// peer, write nothing outside its blocks, and every other rank must complete; afterwards a correct
// gatherv on the same communicator must still work (nothing of the failed call was left in flight).
#include <mncl/mncl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mismatch_harness.h"

namespace {

using flat_test::fail;
using flat_test::kGuard;
using flat_test::kGuards;

mncl_status_t finish(mncl_status_t st, mncl_request_t request, bool nonblocking) {
  if (st != MNCL_OK || !nonblocking) return st;
  return mncl_wait(request, 60000);
}

// One call in which rank `odd` disagrees by `delta` elements (its own count is block + delta).
// Blocks of `block` elements as the root sees them, at stride * i.
void mismatched(mncl_comm_t comm, int rank, int size, size_t block, bool gather, bool nonblocking,
                int root, int odd, int delta) {
  const size_t stride = block + kGuards;
  const std::string name =
      std::to_string(block) + "-element " + std::string(gather ? "gatherv" : "scatterv") +
      (nonblocking ? " (non-blocking)" : "") + ", root " + std::to_string(root) + ", rank " +
      std::to_string(odd) + " " + (delta > 0 ? "longer" : "shorter");
  const size_t n = static_cast<size_t>(size);
  const size_t mine = rank == odd ? static_cast<size_t>(static_cast<int>(block) + delta) : block;
  std::vector<size_t> counts(n, block), displs(n);
  for (size_t i = 0; i < n; ++i) displs[i] = stride * i;
  std::vector<int32_t> big(stride * n + stride, kGuard);  // the root's side, with guards
  std::vector<int32_t> own(mine + stride, kGuard);        // this rank's block, with guards
  for (size_t i = 0; i < big.size(); ++i) {
    if (!gather) big[i] = static_cast<int32_t>(1000 + i);
  }
  for (size_t k = 0; k < own.size(); ++k) {
    if (gather) own[k] = static_cast<int32_t>(100 * rank + k);
  }
  const bool is_root = rank == root;
  mncl_request_t request = nullptr;
  mncl_status_t st;
  if (gather) {
    st = nonblocking
             ? mncl_igatherv(comm, own.data(), mine, big.data(), is_root ? counts.data() : nullptr,
                             is_root ? displs.data() : nullptr, MNCL_INT32, root, nullptr, &request)
             : mncl_gatherv(comm, own.data(), mine, big.data(), is_root ? counts.data() : nullptr,
                            is_root ? displs.data() : nullptr, MNCL_INT32, root, nullptr);
  } else {
    st = nonblocking ? mncl_iscatterv(comm, big.data(), is_root ? counts.data() : nullptr,
                                      is_root ? displs.data() : nullptr, own.data(), mine,
                                      MNCL_INT32, root, nullptr, &request)
                     : mncl_scatterv(comm, big.data(), is_root ? counts.data() : nullptr,
                                     is_root ? displs.data() : nullptr, own.data(), mine,
                                     MNCL_INT32, root, nullptr);
  }
  st = finish(st, request, nonblocking);
  const bool receiver = gather ? is_root : rank == odd;
  const std::string error = st == MNCL_OK ? "" : mncl_last_error();
  if (receiver) {
    const std::string peer = "rank " + std::to_string(gather ? odd : root);
    if (st != MNCL_ERR_REMOTE) {
      fail(rank,
           name + ": got " + mncl_status_string(st) + " (" + error + "), want MNCL_ERR_REMOTE");
    } else if (error.find(peer) == std::string::npos || error.find("agree") == std::string::npos) {
      fail(rank, name + ": the error does not name " + peer + ": " + error);
    } else if (rank == 0) {
      std::printf("%s: %s\n", name.c_str(), error.c_str());
    }
  } else if (st != MNCL_OK) {
    fail(rank, name + ": a sending rank failed: " + error);
  }
  // Nothing written outside the blocks this rank receives.
  if (gather && is_root) {
    for (size_t i = 0; i < big.size(); ++i) {
      if (i % stride < block && i / stride < n) continue;
      if (big[i] != kGuard) fail(rank, name + ": element " + std::to_string(i) + " overwritten");
    }
  }
  if (!gather) {
    for (size_t k = mine; k < own.size(); ++k) {
      if (own[k] != kGuard) fail(rank, name + ": element " + std::to_string(k) + " overwritten");
    }
  }
}

// A correct gatherv at root 0: all ranks in step after a failed call.
void correct(mncl_comm_t comm, int rank, int size, const char *after) {
  const size_t n = static_cast<size_t>(size);
  std::vector<size_t> counts(n), displs(n);
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    counts[i] = i + 1;
    displs[i] = total;
    total += counts[i];
  }
  std::vector<int32_t> send(static_cast<size_t>(rank) + 1), recv(total, -1);
  for (size_t k = 0; k < send.size(); ++k) send[k] = static_cast<int32_t>(100 * rank + k);
  const mncl_status_t st =
      mncl_gatherv(comm, send.data(), send.size(), recv.data(), rank == 0 ? counts.data() : nullptr,
                   rank == 0 ? displs.data() : nullptr, MNCL_INT32, 0, nullptr);
  if (st != MNCL_OK) {
    fail(rank, std::string("correct gatherv after ") + after + ": " + mncl_last_error());
    return;
  }
  for (size_t i = 0; rank == 0 && i < n; ++i) {
    for (size_t k = 0; k < counts[i]; ++k) {
      if (recv[displs[i] + k] != static_cast<int32_t>(100 * i + k)) {
        fail(rank, std::string("correct gatherv after ") + after + ": wrong result");
        return;
      }
    }
  }
}

}  // namespace

int main() {
  mncl_comm_t comm = nullptr;
  int rank = -1, size = -1, exit_code = 0;
  if (!flat_test::open_world("rooted_v_mismatch_test", &comm, &rank, &size, &exit_code)) {
    return exit_code;
  }
  int cases = 0;
  for (const size_t block : {size_t{8}, size_t{100000}}) {  // 32 B and 400 KB
    for (const int root : {0, size - 1}) {
      const int odd = (root + 1) % size;
      for (const bool gather : {true, false}) {
        for (const bool nonblocking : {false, true}) {
          for (const int delta : {3, -3}) {
            mismatched(comm, rank, size, block, gather, nonblocking, root, odd, delta);
            correct(comm, rank, size, "a mismatch");
            ++cases;
          }
        }
      }
    }
  }
  mncl_comm_destroy(comm);
  std::printf("rank %d: %d mismatched calls, %d failures\n", rank, cases, flat_test::g_failures);
  return flat_test::g_failures == 0 ? 0 : 1;
}

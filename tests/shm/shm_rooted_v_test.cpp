// A native gatherv / scatterv (plugin ABI v5: shm, gloo) when a rank and the root disagree on its
// block's count, which no rank can check alone: the rank receiving the block (the root for
// gatherv, rank 1 for scatterv) fails with MNCL_ERR_REMOTE and a message naming the peer and
// both counts, before it writes anything; nothing outside a block is written on any rank; and
// every other rank either completes or fails with MNCL_ERR_REMOTE (never a timeout, a hang or a
// crash). One rank of a job started by mncl-run -n N (N >= 2), root 0:
//
//   shm_rooted_v_test gatherv|scatterv less|more SCALE
//
// Every block is 20 * SCALE int32 elements in the root's arrays, with 8 guard elements before
// and after each; rank 1 passes half of that (less) or 7 more (more). With MNCL_SHM_CHUNK=64K
// a large SCALE runs many rounds.
//
//   shm_rooted_v_test scatterv root SCALE   (N >= 3)
//
// Ranks that disagree on the root: rank 2 passes root 2, the others root 0, every count agrees.
// Rank 2 acts as a second root and waits for nobody; what it writes must not change what root
// 0's receivers read (it once wrote their counts into their control lines, so a receiver could
// run too few rounds and return MNCL_OK with part of its block). Root 0 calls first, rank 2
// 100 ms later, the others 300 ms later, the order in which rank 2's writes would land last.
// Every rank must fail (any error, a timeout included) or complete with the result its own call
// asks for: root 0's block for ranks 1 and 3, its own block for each root.
#include <mncl/mncl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int32_t kUntouched = -1;
constexpr size_t kGuard = 8;

int failures = 0;
int my_rank = -1;

void expect(bool ok, const std::string &what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", my_rank, what.c_str());
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

// A communicator from the environment, with my_rank and *size set; NULL (said why) if none.
mncl_comm_t open_comm(int *size) {
  mncl_comm_t comm = nullptr;
  if (mncl_comm_create(nullptr, &comm) != MNCL_OK) {
    std::fprintf(stderr, "mncl_comm_create: %s\n", mncl_last_error());
    return nullptr;
  }
  mncl_comm_rank(comm, &my_rank);
  mncl_comm_size(comm, size);
  return comm;
}

// The "root" case (see the top).
int two_roots(size_t base) {
  int size = 0;
  mncl_comm_t comm = open_comm(&size);
  if (comm == nullptr) return 1;
  if (size < 3) {
    std::fprintf(stderr, "the root case needs 3 ranks or more\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(size), me = static_cast<size_t>(my_rank);
  const int root = my_rank == 2 ? 2 : 0;
  std::vector<size_t> counts(n, base), displs(n);
  for (size_t i = 0; i < n; ++i) displs[i] = kGuard + i * (base + kGuard);
  const size_t extent = kGuard + n * (base + kGuard);
  // Element e of rank r's sendbuf is r * 100000000 + e: a block names its sender and offset.
  std::vector<int32_t> send(extent), recv(base + kGuard, kUntouched);
  for (size_t e = 0; e < extent; ++e) send[e] = static_cast<int32_t>(me * 100000000 + e);
  if (mncl_barrier(comm, nullptr) != MNCL_OK) {
    std::fprintf(stderr, "mncl_barrier: %s\n", mncl_last_error());
    return 1;
  }
  if (my_rank != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(my_rank == 2 ? 100 : 300));
  const mncl_status_t st = mncl_scatterv(comm, send.data(), counts.data(), displs.data(),
                                         recv.data(), base, MNCL_INT32, root, nullptr);
  const std::string message = st == MNCL_OK ? "" : mncl_last_error();
  std::fprintf(stderr, "rank %d (root %d): scatterv: %s%s%s\n", my_rank, root,
               mncl_status_string(st), message.empty() ? "" : ": ", message.c_str());
  if (st == MNCL_OK) {
    // This rank's own call: the block root sends to it (from its sendbuf), nothing past it.
    const size_t from = static_cast<size_t>(root) * 100000000 + displs[me];
    for (size_t k = 0; k < recv.size(); ++k) {
      const int32_t want = k < base ? static_cast<int32_t>(from + k) : kUntouched;
      if (recv[k] != want) {
        expect(false, "MNCL_OK but element " + std::to_string(k) + " of the block is " +
                          std::to_string(recv[k]) + ", not " + std::to_string(want));
        break;
      }
    }
  }
  // A failed communicator is abandoned (abort + destroy skips the leave protocol).
  if (st != MNCL_OK) mncl_comm_abort(comm);
  mncl_comm_destroy(comm);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 4 || (std::strcmp(argv[1], "gatherv") != 0 && std::strcmp(argv[1], "scatterv")) ||
      (std::strcmp(argv[2], "less") != 0 && std::strcmp(argv[2], "more") != 0 &&
       std::strcmp(argv[2], "root") != 0)) {
    std::fprintf(stderr, "usage: %s gatherv|scatterv less|more SCALE, %s scatterv root SCALE\n",
                 argv[0], argv[0]);
    return 2;
  }
  const bool gatherv = std::strcmp(argv[1], "gatherv") == 0;
  const bool less = std::strcmp(argv[2], "less") == 0;
  const size_t base = 20 * std::strtoull(argv[3], nullptr, 10);
  if (std::strcmp(argv[2], "root") == 0) {
    if (gatherv) {
      std::fprintf(stderr, "%s: the root case is scatterv's\n", argv[0]);
      return 2;
    }
    return two_roots(base);
  }

  int size = 0;
  mncl_comm_t comm = open_comm(&size);
  if (comm == nullptr) return 1;
  const size_t n = static_cast<size_t>(size), me = static_cast<size_t>(my_rank);
  // The root's arrays: every block `base` long, kGuard untouched elements around each.
  std::vector<size_t> counts(n, base), displs(n);
  for (size_t i = 0; i < n; ++i) displs[i] = kGuard + i * (base + kGuard);
  const size_t extent = kGuard + n * (base + kGuard);
  const size_t mine = my_rank != 1 ? base : less ? base / 2 : base + 7;
  auto in_a_block = [&](size_t e) {
    for (size_t i = 0; i < n; ++i) {
      if (e >= displs[i] && e < displs[i] + counts[i]) return true;
    }
    return false;
  };

  if (mncl_barrier(comm, nullptr) != MNCL_OK) {
    std::fprintf(stderr, "mncl_barrier: %s\n", mncl_last_error());
    return 1;
  }
  mncl_status_t st;
  bool receiver;
  if (gatherv) {
    std::vector<int32_t> send(mine), recv(extent, kUntouched);
    for (size_t k = 0; k < mine; ++k) send[k] = static_cast<int32_t>(me * 1000000 + k);
    st = mncl_gatherv(comm, send.data(), mine, recv.data(), counts.data(), displs.data(),
                      MNCL_INT32, 0, nullptr);
    receiver = my_rank == 0;
    for (size_t e = 0; e < extent; ++e) {
      if ((my_rank != 0 || !in_a_block(e)) && recv[e] != kUntouched) {
        expect(false, "gatherv wrote element " + std::to_string(e) + " outside every block");
        break;
      }
    }
  } else {
    std::vector<int32_t> send(extent, 7), recv(mine + kGuard, kUntouched);
    st = mncl_scatterv(comm, send.data(), counts.data(), displs.data(), recv.data(), mine,
                       MNCL_INT32, 0, nullptr);
    receiver = my_rank == 1;
    // shm checks the count before it reads any data: the receiver's whole buffer is untouched.
    for (size_t e = receiver ? 0 : mine; e < recv.size(); ++e) {
      if (recv[e] != kUntouched) {
        expect(false, "scatterv wrote element " + std::to_string(e) +
                          (receiver ? " of the disagreeing block" : " past the block"));
        break;
      }
    }
  }
  const std::string message = st == MNCL_OK ? "" : mncl_last_error();
  std::fprintf(stderr, "rank %d: %s: %s%s%s\n", my_rank, argv[1], mncl_status_string(st),
               message.empty() ? "" : ": ", message.c_str());
  if (receiver) {
    // shm: "rank 1 sends 10 elements to root 0, which expects recvcounts[1] = 20" (gatherv),
    // "root 0 sends sendcounts[1] = 20 elements to rank 1, which expects 10" (scatterv); gloo:
    // "rank 0 sends 20 elements to rank 1, which expects 10".
    const std::string peer = gatherv ? "rank 1" : "root 0";
    const bool names_peer =
        contains(message, peer) || (!gatherv && contains(message, "rank 0 sends"));
    expect(st == MNCL_ERR_REMOTE, "the receiving rank must fail with MNCL_ERR_REMOTE");
    expect(contains(message, "expects") && names_peer && contains(message, std::to_string(base)) &&
               contains(message, std::to_string(mine)),
           "the message must name " + peer + " and both counts (" + std::to_string(base) + ", " +
               std::to_string(mine) + ")");
  } else {
    expect(st == MNCL_OK || st == MNCL_ERR_REMOTE,
           "other ranks complete or fail with MNCL_ERR_REMOTE");
  }
  // No abort: a peer still in the call would fail with MNCL_ERR_ABORTED instead of its own
  // verdict. Destroy's leave protocol waits for every rank.
  mncl_comm_destroy(comm);
  return failures == 0 ? 0 : 1;
}

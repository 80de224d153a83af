// Non-blocking operations against the clock and against mncl_comm_destroy: an SPMD program for
// two ranks or more, run under any launcher with any MNCL_BACKEND (ranks past 1 only take part
// in the collectives):
//
//   mncl-run -n 2 --backend naive -- nonblocking_lifetime_test
//   mpirun -np 2 -x MNCL_BACKEND=flat nonblocking_lifetime_test
//
// Rank 0 receives from rank 1 on sub-communicators with a short timeout (kTimeoutMs):
//   queued_deadlines  kMany irecvs that rank 1 never serves. Each operation's timeout counts from
//                     the call that issued it, so mncl_wait(-1) on the last one, then
//                     mncl_comm_destroy with kMany more pending, each end within about one
//                     timeout, not kMany (lane backends once ran them one full timeout apiece).
//                     Every request reports MNCL_ERR_TIMEOUT, also when waited after destroy.
//   destroy_pending   irecvs left pending at mncl_comm_destroy, three served and one not:
//                     destroy ends them first (backends that post natively, flat and nccl, once
//                     returned at once while the backend still used the buffers), and the
//                     requests, tested or waited after destroy and after a new communicator was
//                     made, report their own results: the data, and MNCL_ERR_TIMEOUT.
//   destroy_beside_blocking, destroy_beside_queries  destroy while other threads of rank 0
//                     are inside calls on the communicator: they return, and are refused after.
//   huge_wait         mncl_wait with timeouts too long for the clock (INT64_MAX ms, 9.3e12 ms)
//                     waits for the operation, as -1 does (they once returned MNCL_ERR_TIMEOUT at
//                     once); 2^40 ms, the largest counted one, too.
// Prints one line per failed check and "nonblocking_lifetime <backend> PASS|FAIL ..." per rank.
// Not for nccl: its operations on one stream run one after the other (mncl.h), so rank 0's
// second mncl_irecv already waits for the first, which nobody serves.
#include <mncl/mncl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kTimeoutMs = 1000;  // the sub-communicators' timeout
constexpr int kMany = 20;             // kMany x kTimeoutMs is what the old behaviour took
// Generous on a loaded 2-core machine, and far below kMany timeouts.
constexpr double kBoundSeconds = 8.0;
constexpr size_t kCount = 16;  // elements per message (small: sent eagerly by MPI)

using Clock = std::chrono::steady_clock;

int g_rank = 0, g_size = 1;
int g_failures = 0;
std::string g_backend = "?";

void fail(const std::string &what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", g_rank, what.c_str());
  ++g_failures;
}

// A call that must succeed for the ranks to stay in step: stops the test otherwise.
#define CHECK_MNCL(call)                                                                           \
  do {                                                                                             \
    const mncl_status_t st_ = (call);                                                              \
    if (st_ != MNCL_OK) {                                                                          \
      std::fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, mncl_status_string(st_), \
                   mncl_last_error());                                                             \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A sub-communicator of every rank with the short timeout.
mncl_comm_t short_timeout_comm(mncl_comm_t world) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.timeout_ms = kTimeoutMs;
  mncl_comm_t comm = nullptr;
  CHECK_MNCL(mncl_comm_split_config(world, 0, g_rank, &config, &comm));
  return comm;
}

std::vector<int32_t> message(int salt) {
  std::vector<int32_t> m(kCount);
  for (size_t k = 0; k < kCount; ++k) m[k] = static_cast<int32_t>(1000 * salt + k);
  return m;
}

// Completes `req` (mncl_test when `poll`, else mncl_wait(-1)) and checks its status; returns
// the message. `after_failure`: a backend that gives up on a communicator after its first
// timeout (gloo) may fail the operation with MNCL_ERR_REMOTE naming that earlier failure.
std::string complete(mncl_request_t req, bool poll, mncl_status_t want, const std::string &name,
                     bool after_failure = false) {
  mncl_status_t st = MNCL_OK;
  if (poll) {
    int done = 0;
    st = mncl_test(req, &done);
    if (!done && st == MNCL_OK) {
      fail(name + ": mncl_test says not done, though it must have ended");
      st = mncl_wait(req, -1);
    }
  } else {
    st = mncl_wait(req, -1);
  }
  const std::string error = st == MNCL_OK ? "" : mncl_last_error();
  const bool earlier =
      after_failure && st == MNCL_ERR_REMOTE && error.find("earlier failure") != std::string::npos;
  // Rank 1 destroys its communicator as rank 0 posts: gloo's final exchange there gives up after
  // the same timeout as rank 0's receives and closes the connection, which may come first. A
  // receive that a peer's leaving ended is as much an end within its timeout.
  const bool peer_left = want == MNCL_ERR_TIMEOUT && st == MNCL_ERR_REMOTE &&
                         error.find("Connection closed by peer") != std::string::npos;
  if (st != want && !earlier && !peer_left) {
    fail(name + ": " + mncl_status_string(st) + " (" + error + "), want " +
         mncl_status_string(want));
  } else if (st != MNCL_OK && error.empty()) {
    fail(name + ": " + mncl_status_string(st) + " without a message");
  }
  return error;
}

void queued_deadlines(mncl_comm_t world) {
  // naive queues one peer's receives on a lane and keeps the communicator usable after a
  // timeout: every receive after the first then either ends unstarted or runs with what is
  // left of its timeout, and its message says which.
  const bool queue_notes = g_backend == "naive";
  for (const bool by_destroy : {false, true}) {
    const std::string how = by_destroy ? "mncl_comm_destroy" : "mncl_wait(-1) on the last";
    mncl_comm_t comm = short_timeout_comm(world);
    if (g_rank == 0) {
      std::vector<std::vector<int32_t>> bufs(kMany, std::vector<int32_t>(kCount));
      std::vector<mncl_request_t> reqs(kMany);
      const auto start = Clock::now();
      for (int i = 0; i < kMany; ++i) {
        CHECK_MNCL(mncl_irecv(comm, bufs[i].data(), kCount, MNCL_INT32, 1, nullptr, &reqs[i]));
      }
      // Ended unstarted, or started with what was left of its timeout: the message says so.
      int queued = 0;
      auto count_note = [&](const std::string &error) {
        if (error.find("queued behind earlier operations") != std::string::npos) ++queued;
      };
      if (by_destroy) {
        const mncl_status_t st = mncl_comm_destroy(comm);
        if (st != MNCL_OK) fail(how + ": " + mncl_status_string(st) + ": " + mncl_last_error());
      } else {
        count_note(complete(reqs[kMany - 1], false, MNCL_ERR_TIMEOUT,
                            "queued_deadlines: the last irecv", true));
      }
      const double first = seconds_since(start);
      for (int i = 0; i < kMany - (by_destroy ? 0 : 1); ++i) {
        count_note(complete(reqs[i], i % 2 == 1, MNCL_ERR_TIMEOUT,
                            "queued_deadlines (" + how + "): irecv " + std::to_string(i), i > 0));
      }
      const double total = seconds_since(start);
      std::printf(
          "queued_deadlines on %s, %d irecvs of timeout %.1f s, %s: %.2f s, all %.2f s; "
          "%d of them had waited in their queue\n",
          g_backend.c_str(), kMany, kTimeoutMs / 1000.0, how.c_str(), first, total, queued);
      if (total >= kBoundSeconds) {
        fail("queued_deadlines (" + how + "): " + std::to_string(kMany) + " irecvs took " +
             std::to_string(total) + " s; each should have ended within its timeout of " +
             std::to_string(kTimeoutMs / 1000.0) + " s from the call that issued it");
      }
      if (queue_notes && queued < kMany - 1) {
        fail("queued_deadlines (" + how + "): only " + std::to_string(queued) + " of the " +
             std::to_string(kMany - 1) + " irecvs after the first say they waited in the queue");
      }
      if (!by_destroy) CHECK_MNCL(mncl_comm_destroy(comm));
    } else {
      CHECK_MNCL(mncl_comm_destroy(comm));
    }
    CHECK_MNCL(mncl_barrier(world, nullptr));
  }
}

void destroy_pending(mncl_comm_t world) {
  mncl_comm_t comm = short_timeout_comm(world);
  constexpr int kServed = 3;
  std::vector<std::vector<int32_t>> bufs(kServed + 1, std::vector<int32_t>(kCount, -1));
  std::vector<mncl_request_t> reqs(kServed + 1);
  if (g_rank == 0) {
    for (int i = 0; i <= kServed; ++i) {
      CHECK_MNCL(mncl_irecv(comm, bufs[i].data(), kCount, MNCL_INT32, 1, nullptr, &reqs[i]));
    }
  }
  CHECK_MNCL(mncl_barrier(world, nullptr));
  if (g_rank == 0) {
    // Rank 1 sends after the barrier: destroy must let the receives take the messages.
    const auto start = Clock::now();
    const mncl_status_t st = mncl_comm_destroy(comm);
    if (st != MNCL_OK) {
      fail(std::string("destroy_pending: mncl_comm_destroy: ") + mncl_status_string(st) + ": " +
           mncl_last_error());
    }
    const double took = seconds_since(start);
    // A new communicator meanwhile (whose handle may be the freed one's address): the old
    // requests must still answer for their own operations.
    mncl_comm_t next = short_timeout_comm(world);
    for (int i = 0; i < kServed; ++i) {
      const std::string name = "destroy_pending: served irecv " + std::to_string(i);
      complete(reqs[i], i == 0, MNCL_OK, name);
      if (bufs[i] != message(i)) fail(name + ": wrong data");
    }
    const std::string error =
        complete(reqs[kServed], false, MNCL_ERR_TIMEOUT, "destroy_pending: unserved irecv");
    std::printf("destroy_pending on %s: destroy took %.2f s; the unserved irecv: %s\n",
                g_backend.c_str(), took, error.c_str());
    if (took >= kBoundSeconds) fail("destroy_pending: destroy took " + std::to_string(took) + " s");
    CHECK_MNCL(mncl_comm_destroy(next));
  } else {
    if (g_rank == 1) {
      for (int i = 0; i < kServed; ++i) {
        CHECK_MNCL(mncl_send(comm, message(i).data(), kCount, MNCL_INT32, 0, nullptr));
      }
    }
    CHECK_MNCL(mncl_comm_destroy(comm));
    mncl_comm_t next = short_timeout_comm(world);
    CHECK_MNCL(mncl_comm_destroy(next));
  }
  CHECK_MNCL(mncl_barrier(world, nullptr));
}

// mncl_comm_destroy while another thread of the rank is blocked in mncl_recv on the same
// communicator (a message that never comes): destroy waits for that call to return (at its
// timeout) before the backend frees its communicator. It freed it under the call, which then
// crashed (shm unmapped its segment, naive freed its state).
void destroy_beside_blocking(mncl_comm_t world) {
  mncl_comm_t comm = short_timeout_comm(world);
  if (g_rank == 0) {
    std::vector<int32_t> buf(kCount, -1);
    mncl_status_t recv_status = MNCL_OK;
    std::string recv_error;
    std::thread receiver([&] {
      recv_status = mncl_recv(comm, buf.data(), kCount, MNCL_INT32, 1, nullptr);
      recv_error = mncl_last_error();
    });
    // Ordering only: the receiver is in its call by then (else it is refused as the
    // communicator is being destroyed, which is fine too).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const mncl_status_t st = mncl_comm_destroy(comm);
    receiver.join();
    if (st != MNCL_OK) {
      fail(std::string("destroy_beside_blocking: mncl_comm_destroy: ") + mncl_status_string(st) +
           ": " + mncl_last_error());
    }
    // MNCL_ERR_REMOTE: rank 1 destroyed the communicator at once, and gloo's destroy closes its
    // connections after its own final exchange times out, about when this recv does; which of
    // the two comes first is a race (the recv saw the closed connection in one CI run).
    if (recv_status != MNCL_ERR_TIMEOUT && recv_status != MNCL_ERR_INVALID_ARGUMENT &&
        recv_status != MNCL_ERR_REMOTE) {
      fail(std::string("destroy_beside_blocking: the blocked mncl_recv returned ") +
           mncl_status_string(recv_status) + ": " + recv_error);
    }
    std::printf("destroy_beside_blocking on %s: the blocked recv returned %s: %s\n",
                g_backend.c_str(), mncl_status_string(recv_status), recv_error.c_str());
  } else {
    CHECK_MNCL(mncl_comm_destroy(comm));
  }
  CHECK_MNCL(mncl_barrier(world, nullptr));
}

// mncl_comm_destroy while other threads of the rank keep calling mncl_comm_size, _rank and
// _backend on the communicator: each call returns MNCL_OK until destroy begins, then
// MNCL_ERR_INVALID_ARGUMENT ("being destroyed", "not a live communicator"). A call that had
// found the handle live an instant before destroy began once went on to use the freed handle
// and communicator (AddressSanitizer: heap-use-after-free; this test runs under it in CI).
void destroy_beside_queries(mncl_comm_t world) {
  constexpr int kRounds = 50, kThreads = 2;
  int refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    mncl_comm_t comm = short_timeout_comm(world);
    if (g_rank != 0) {
      CHECK_MNCL(mncl_comm_destroy(comm));
      continue;
    }
    std::atomic<int> started{0};
    std::vector<std::string> last(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (long i = 0;; ++i) {
          int value = 0;
          const char *name = nullptr;
          const mncl_status_t st = i % 3 == 0   ? mncl_comm_size(comm, &value)
                                   : i % 3 == 1 ? mncl_comm_rank(comm, &value)
                                                : mncl_comm_backend(comm, &name);
          if (i == 0) started.fetch_add(1);
          if (st == MNCL_OK) continue;
          const std::string error = mncl_last_error();
          if (st != MNCL_ERR_INVALID_ARGUMENT ||
              (error.find("being destroyed") == std::string::npos &&
               error.find("not a live communicator") == std::string::npos)) {
            last[static_cast<size_t>(t)] = std::string(mncl_status_string(st)) + ": " + error;
          }
          return;
        }
      });
    }
    while (started.load() < kThreads) std::this_thread::yield();
    const mncl_status_t st = mncl_comm_destroy(comm);
    for (auto &thread : threads) thread.join();
    if (st != MNCL_OK) {
      fail(std::string("destroy_beside_queries: mncl_comm_destroy: ") + mncl_status_string(st) +
           ": " + mncl_last_error());
    }
    for (const std::string &wrong : last) {
      if (!wrong.empty()) fail("destroy_beside_queries: a query beside destroy returned " + wrong);
      refused += wrong.empty();
    }
  }
  if (g_rank == 0) {
    std::printf("destroy_beside_queries on %s: %d rounds, %d queries refused cleanly\n",
                g_backend.c_str(), kRounds, refused);
  }
  CHECK_MNCL(mncl_barrier(world, nullptr));
}

void huge_wait(mncl_comm_t world) {
  const int64_t timeouts[] = {INT64_MAX, 9300000000000, int64_t{1} << 40};
  int salt = 100;
  for (const int64_t timeout : timeouts) {
    const std::vector<int32_t> sent = message(++salt);
    if (g_rank == 0) {
      std::vector<int32_t> buf(kCount, -1);
      mncl_request_t req = nullptr;
      CHECK_MNCL(mncl_irecv(world, buf.data(), kCount, MNCL_INT32, 1, nullptr, &req));
      const auto start = Clock::now();
      const mncl_status_t st = mncl_wait(req, timeout);
      const std::string name = "huge_wait: mncl_wait(" + std::to_string(timeout) + " ms)";
      if (st != MNCL_OK) {
        fail(name + ": " + mncl_status_string(st) + " after " +
             std::to_string(seconds_since(start)) + " s: " + mncl_last_error());
        // A request that is still pending would leave rank 1's message behind: take it.
        if (mncl_wait(req, -1) != MNCL_OK) fail(name + ": mncl_wait(-1) after it failed too");
      }
      if (buf != sent) fail(name + ": wrong data");
    } else if (g_rank == 1) {
      // Late, so that the wait has to wait.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      CHECK_MNCL(mncl_send(world, sent.data(), kCount, MNCL_INT32, 0, nullptr));
    }
    CHECK_MNCL(mncl_barrier(world, nullptr));
  }
}

}  // namespace

int main() {
  mncl_comm_t world = nullptr;
  CHECK_MNCL(mncl_comm_create(nullptr, &world));
  CHECK_MNCL(mncl_comm_rank(world, &g_rank));
  CHECK_MNCL(mncl_comm_size(world, &g_size));
  const char *backend = "?";
  CHECK_MNCL(mncl_comm_backend(world, &backend));
  g_backend = backend;
  if (g_size < 2) {
    std::printf("nonblocking_lifetime: needs 2 ranks or more; nothing to do\n");
    CHECK_MNCL(mncl_comm_destroy(world));
    return 0;
  }
  queued_deadlines(world);
  destroy_pending(world);
  destroy_beside_blocking(world);
  destroy_beside_queries(world);
  huge_wait(world);
  CHECK_MNCL(mncl_comm_destroy(world));
  std::printf("nonblocking_lifetime %s rank %d %s: %d failures\n", g_backend.c_str(), g_rank,
              g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}

// libmncl-shm.so under plugin ABI v2's threading rule (mncl_plugin_v2.h): execute() called by
// several threads at once on one communicator, at most one collective, one SEND per peer and
// one RECV per peer at a time, as the core's lanes call it. The plugin is dlopen'ed directly
// (no core); the ranks are threads of this process, each with its own communicator mapping the
// job's segment, bootstrapped through an in-memory store.
//
//   FreeRunning    every (peer, direction) and the collectives run on their own thread, each
//                  a fixed sequence of messages / collectives with random pauses: exact data.
//   RecvThenSend   per iteration each rank blocks in RECVs from its neighbours before it starts
//   SendThenRecv   its SENDs (or the reverse), beside an allreduce; messages are larger than
//                  the channel's two 32 KiB slots, so they stream and need both sides running.
//   Abort          comm_abort ends every blocked call (RECV, streaming SEND, collective) of
//                  every rank with MNCL_ERR_ABORTED well before the timeout.
//   FailureStaysOnItsLane  a failed RECV does not cut short a running collective (nor a
//                  failed collective a running SEND); the communicator refuses new calls after.
//   LateReceiverOfAWithdrawnSingleCopySend  a SEND offered for a single copy that times out
//                  withdraws the offer: the late RECV fails instead of reading the reused buffer.
//   SenderThatFailsDuringASingleCopyReadTakesItsBufferBack  the same while the RECV is copying:
//                  the SEND returns at its deadline, the RECV fails.
//
// SHM_LANES_ITERS scales the iteration counts (default 1.0; ctest sets 0.2 under TSan).
#include <gtest/gtest.h>
#include <mncl/mncl_plugin.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "plugin_harness.h"

#ifndef MNCL_SHM_PLUGIN
#error "MNCL_SHM_PLUGIN must name the built libmncl-shm.so"
#endif

namespace {

using mncl_testing::Clock;
using mncl_testing::seconds_since;
using mncl_testing::t_last_error;

int iters(int n) {
  const char *s = std::getenv("SHM_LANES_ITERS");
  return std::max(2, static_cast<int>(n * (s ? std::atof(s) : 1.0)));
}

// ---------------------------------------------------------------------------------------------
// The plugin (loaded once, left loaded) and a job of n thread-ranks. The host logs above
// MNCL_TEST_LOG_LEVEL and sets MNCL_SHM_CHUNK=64K unless the environment does, so large
// collectives run several pipeline rounds.
// ---------------------------------------------------------------------------------------------

mncl_testing::Plugin g_shm;  // g_v2, g_v1: its tables, set before the first test
const mncl_plugin_v2_t *const &g_v2 = g_shm.v2;
const mncl_plugin_v1_t *const &g_v1 = g_shm.v1;
[[maybe_unused]] const auto *const g_env = mncl_testing::add_plugins_env(
    {"shm", MNCL_LOG_WARN, {}, {{"MNCL_SHM_CHUNK", "64K"}}},
    {{"shm", MNCL_SHM_PLUGIN, mncl_testing::PluginsEnv::kV2, &g_shm, /*keep_loaded=*/true}});

constexpr int64_t kTimeoutMs = 30000;

class Job {
 public:
  explicit Job(int n) : n_(n), comms_(static_cast<size_t>(n), nullptr) {
    static std::atomic<int> next{0};
    const std::string id = "lanes" + std::to_string(next++);
    std::vector<mncl_status_t> st(static_cast<size_t>(n), MNCL_OK);
    std::vector<std::string> err(static_cast<size_t>(n));
    mncl_testing::on_threads(n, [&](int r) {
      const mncl_bootstrap_v1_t bs =
          mncl_testing::make_bootstrap(r, n, kTimeoutMs, id.c_str(), store_.table());
      st[size_t(r)] = g_v2->comm_create(&bs, &comms_[size_t(r)]);
      err[size_t(r)] = t_last_error;
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(st[size_t(r)], MNCL_OK) << "rank " << r << ": " << err[size_t(r)];
    }
  }
  ~Job() {
    for (void *c : comms_) {
      if (c != nullptr) {
        EXPECT_EQ(g_v2->comm_destroy(c), MNCL_OK) << t_last_error;
      }
    }
  }
  bool ok() const {
    return std::all_of(comms_.begin(), comms_.end(), [](void *c) { return c != nullptr; });
  }
  void *comm(int r) const { return comms_[static_cast<size_t>(r)]; }
  int size() const { return n_; }

 private:
  int n_;
  mncl_testing::MemStore store_;
  std::vector<void *> comms_;
};

mncl_coll_v1_t coll(int32_t kind, int32_t dtype, const void *send, void *recv, size_t count,
                    int32_t root, uint64_t seq, int64_t timeout_ms = kTimeoutMs) {
  return mncl_testing::make_coll(kind, dtype, MNCL_SUM, root, send, recv, count, seq, timeout_ms);
}

// Failures seen by any thread: counted, the first few kept for the report.
class Failures {
 public:
  void add(const std::string &what) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (list_.size() < 8) list_.push_back(what);
    ++count_;
  }
  void expect_none() {
    const std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const auto &s : list_) all += "\n  " + s;
    EXPECT_EQ(count_, 0) << all;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> list_;
  int count_ = 0;
};

// Runs one call; false (and the failure recorded) if it does not return MNCL_OK.
bool run(Failures &f, void *comm, const mncl_coll_v1_t &c, const char *what, int rank) {
  const mncl_status_t st = g_v2->execute(comm, &c);
  if (st == MNCL_OK) return true;
  f.add("rank " + std::to_string(rank) + " " + what + " #" + std::to_string(c.seq) + ": status " +
        std::to_string(st) + ": " + t_last_error);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Data: messages are bytes (odd sizes), a hash of (src, dst, message, word) in 8-byte words.
// ---------------------------------------------------------------------------------------------

std::vector<uint8_t> message(int src, int dst, uint64_t msg, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t j = 0; j < bytes; j += 8) {
    uint64_t x = (uint64_t(src) << 56) ^ (uint64_t(dst) << 48) ^ (msg << 24) ^ j;
    x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
    std::memcpy(out.data() + j, &x, std::min<size_t>(8, bytes - j));
  }
  return out;
}

// Sizes around the channel's geometry (two 32 KiB slots): empty, one slot, exactly two (still
// buffered), just over, and several streamed chunks.
const size_t kSizes[] = {0, 1, 777, 32768, 65536, 65537, 100003, 140000};

size_t message_bytes(int src, int dst, uint64_t msg) {
  return kSizes[(msg + static_cast<uint64_t>(src) * 3 + static_cast<uint64_t>(dst)) %
                (sizeof kSizes / sizeof kSizes[0])];
}

bool send_message(Failures &f, void *comm, int me, int peer, uint64_t msg, size_t bytes) {
  const std::vector<uint8_t> data = message(me, peer, msg, bytes);
  return run(f, comm, coll(MNCL_COLL_SEND, MNCL_UINT8, data.data(), nullptr, bytes, peer, msg),
             "send", me);
}

bool recv_message(Failures &f, void *comm, int me, int peer, uint64_t msg, size_t bytes) {
  std::vector<uint8_t> got(bytes + 1, 0xee);  // one guard byte
  if (!run(f, comm, coll(MNCL_COLL_RECV, MNCL_UINT8, nullptr, got.data(), bytes, peer, msg), "recv",
           me)) {
    return false;
  }
  const std::vector<uint8_t> want = message(peer, me, msg, bytes);
  if (std::memcmp(got.data(), want.data(), bytes) != 0 || got[bytes] != 0xee) {
    f.add("rank " + std::to_string(me) + " recv #" + std::to_string(msg) + " from " +
          std::to_string(peer) + ": wrong data (" + std::to_string(bytes) + " bytes)");
    return false;
  }
  return true;
}

// Collective number i of a rank: the kinds and sizes cycle (large ones run several 64 KiB
// rounds, the allreduce its two-phase path), exact integer results.
bool collective(Failures &f, void *comm, int me, int n, uint64_t i, uint64_t seq) {
  const size_t count = i % 2 ? 40000 : 1000;  // 160 KB: two-phase; 4 KB: single phase
  const int32_t base = static_cast<int32_t>(i % 1000);
  std::vector<int32_t> in(count), out(count * static_cast<size_t>(n), -1);
  auto wrong = [&](const char *what) {
    f.add("rank " + std::to_string(me) + " " + what + " #" + std::to_string(i) + ": wrong data");
    return false;
  };
  switch (i % 4) {
    case 0:
    case 1: {  // allreduce
      for (size_t j = 0; j < count; ++j) in[j] = (me + 1) * (base + int32_t(j % 1000));
      if (!run(f, comm,
               coll(MNCL_COLL_ALLREDUCE, MNCL_INT32, in.data(), out.data(), count, -1, seq),
               "allreduce", me)) {
        return false;
      }
      for (size_t j = 0; j < count; ++j) {
        if (out[j] != (base + int32_t(j % 1000)) * n * (n + 1) / 2) return wrong("allreduce");
      }
      return true;
    }
    case 2: {  // allgather
      for (size_t j = 0; j < count; ++j) in[j] = me * 100000 + base + int32_t(j);
      if (!run(f, comm,
               coll(MNCL_COLL_ALLGATHER, MNCL_INT32, in.data(), out.data(), count, -1, seq),
               "allgather", me)) {
        return false;
      }
      for (int p = 0; p < n; ++p) {
        for (size_t j = 0; j < count; ++j) {
          if (out[size_t(p) * count + j] != p * 100000 + base + int32_t(j)) {
            return wrong("allgather");
          }
        }
      }
      return true;
    }
    default: {  // bcast (large) from a rotating root
      const int root = static_cast<int>(i / 4 % static_cast<uint64_t>(n));
      std::vector<int32_t> buf(70000, -1);
      if (me == root) {
        for (size_t j = 0; j < buf.size(); ++j) buf[j] = base * 7 + int32_t(j);
      }
      if (!run(f, comm,
               coll(MNCL_COLL_BCAST, MNCL_INT32, buf.data(), buf.data(), buf.size(), root, seq),
               "bcast", me)) {
        return false;
      }
      for (size_t j = 0; j < buf.size(); ++j) {
        if (buf[j] != base * 7 + int32_t(j)) return wrong("bcast");
      }
      return true;
    }
  }
}

void pause_sometimes(std::minstd_rand &rng) {
  if (rng() % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

TEST(ShmLanes, TablesV2AndV1) {
  ASSERT_EQ(g_v2->struct_size, sizeof(mncl_plugin_v2_t));
  EXPECT_EQ(g_v2->magic, MNCL_PLUGIN_MAGIC);
  EXPECT_EQ(g_v2->abi_version, MNCL_PLUGIN_ABI_V2);
  EXPECT_STREQ(g_v2->name, "shm");
  EXPECT_EQ(g_v2->caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  ASSERT_EQ(g_v1->struct_size, sizeof(mncl_plugin_v1_t));
  EXPECT_EQ(g_v1->abi_version, MNCL_PLUGIN_ABI_V1);
  EXPECT_EQ(g_v1->caps, MNCL_CAP_HOST_MEMORY);  // a v1 core runs one call at a time
  EXPECT_EQ(g_v1->coll_mask, g_v2->coll_mask);
  EXPECT_EQ(g_v1->dtype_mask, g_v2->dtype_mask);
  EXPECT_EQ(g_v1->op_mask, g_v2->op_mask);
  EXPECT_EQ(g_v1->execute, g_v2->execute);
  EXPECT_EQ(g_v1->comm_abort, g_v2->comm_abort);
}

class ShmLanesN : public ::testing::TestWithParam<int> {};

// Every lane on its own thread, free-running: a collective sequence and, per peer and
// direction, a message sequence, with random pauses so the lanes interleave differently.
TEST_P(ShmLanesN, FreeRunning) {
  const int n = GetParam();
  Job job(n);
  ASSERT_TRUE(job.ok());
  const int msgs = iters(2000), colls = iters(1000);
  Failures f;
  std::atomic<long> done{0}, bytes{0};
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (int r = 0; r < n; ++r) {
    void *comm = job.comm(r);
    ts.emplace_back([&, r, comm] {
      std::minstd_rand rng(static_cast<unsigned>(r * 7 + 1));
      for (int i = 0; i < colls; ++i) {
        if (!collective(f, comm, r, n, uint64_t(i), uint64_t(i))) return;
        ++done;
        pause_sometimes(rng);
      }
    });
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      ts.emplace_back([&, r, p, comm] {
        std::minstd_rand rng(static_cast<unsigned>(r * 31 + p * 5 + 2));
        for (int m = 0; m < msgs; ++m) {
          if (!send_message(f, comm, r, p, uint64_t(m), message_bytes(r, p, uint64_t(m)))) return;
          pause_sometimes(rng);
        }
      });
      ts.emplace_back([&, r, p, comm] {
        std::minstd_rand rng(static_cast<unsigned>(r * 31 + p * 5 + 3));
        for (int m = 0; m < msgs; ++m) {
          const size_t len = message_bytes(p, r, uint64_t(m));
          if (!recv_message(f, comm, r, p, uint64_t(m), len)) return;
          ++done;
          bytes += static_cast<long>(len);
          pause_sometimes(rng);
        }
      });
    }
  }
  for (auto &t : ts) t.join();
  std::printf(
      "%d ranks, %zu threads: %d messages per (peer, direction), %d collectives per rank: %ld "
      "calls checked, %.1f MB received, %.2f s\n",
      n, ts.size(), msgs, colls, done.load(), static_cast<double>(bytes.load()) / 1e6,
      seconds_since(t0));
  f.expect_none();
  EXPECT_EQ(done.load(), long(n) * colls + long(n) * (n - 1) * msgs);
}

// Per iteration, on every rank: an allreduce on one thread; RECVs from both neighbours, each on
// its own thread, given time to block; then SENDs to both neighbours (recv_first), or the
// reverse. Messages of 3.4 and just over 8 slots stream, so each needs its receiver running: run
// one call at a time, either order deadlocks.
void exchange(int n, bool recv_first) {
  Job job(n);
  ASSERT_TRUE(job.ok());
  const int rounds = iters(200);
  Failures f;
  std::vector<std::thread> ranks;
  const auto t0 = Clock::now();
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      void *comm = job.comm(r);
      std::vector<int> nb = {(r + n - 1) % n, (r + 1) % n};  // left, right
      if (nb[0] == nb[1]) nb.pop_back();                     // 2 ranks: one peer
      for (int it = 0; it < rounds; ++it) {
        const uint64_t m = uint64_t(it);
        auto bytes = [&](int src, int dst) {
          return it % 3 == 2 ? 262144 + 9 : 110000 + src - dst;
        };
        std::vector<std::thread> ts;
        std::atomic<int> entered{0};
        ts.emplace_back([&] { collective(f, comm, r, n, m * 4, m); });  // a small allreduce
        auto start = [&](bool recvs) {
          for (int p : nb) {
            ts.emplace_back([&, p, recvs] {
              ++entered;
              if (recvs) {
                recv_message(f, comm, r, p, m, size_t(bytes(p, r)));
              } else {
                send_message(f, comm, r, p, m, size_t(bytes(r, p)));
              }
            });
          }
          while (entered.load() < static_cast<int>(nb.size())) std::this_thread::yield();
          entered = 0;
          std::this_thread::sleep_for(std::chrono::microseconds(500));  // let them block
        };
        start(recv_first);
        start(!recv_first);
        for (auto &t : ts) t.join();
      }
    });
  }
  for (auto &t : ranks) t.join();
  std::printf("%d ranks, %s first: %d rounds: %.2f s\n", n, recv_first ? "recv" : "send", rounds,
              seconds_since(t0));
  f.expect_none();
}

TEST_P(ShmLanesN, RecvThenSend) {
  exchange(GetParam(), true);
}
TEST_P(ShmLanesN, SendThenRecv) {
  exchange(GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmLanesN, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int> &p) {
                           return "np" + std::to_string(p.param);
                         });

// Ranks 0 and 1 block on rank 2, which never calls: a RECV, a streaming SEND and an allreduce
// each. comm_abort on rank 0 (from this thread) must end all six with MNCL_ERR_ABORTED long
// before their 60 s timeout, and rank 2's next call fails the same way at once.
TEST(ShmLanes, AbortEndsEveryBlockedCall) {
  Job job(3);
  ASSERT_TRUE(job.ok());
  constexpr int64_t kLong = 60000;
  const std::vector<uint8_t> big(1 << 20, 1);
  struct Call {
    int rank;
    const char *what;
    mncl_coll_v1_t c;
    mncl_status_t st;
    Clock::time_point returned;
    std::string error;
  };
  std::vector<uint8_t> rbuf[2] = {std::vector<uint8_t>(4096), std::vector<uint8_t>(4096)};
  std::vector<int32_t> in(1000, 1),
      out[2] = {std::vector<int32_t>(1000), std::vector<int32_t>(1000)};
  std::vector<Call> calls;
  for (int r = 0; r < 2; ++r) {
    const mncl_coll_v1_t c[3] = {
        coll(MNCL_COLL_RECV, MNCL_UINT8, nullptr, rbuf[r].data(), 4096, 2, 0, kLong),
        coll(MNCL_COLL_SEND, MNCL_UINT8, big.data(), nullptr, big.size(), 2, 0, kLong),
        coll(MNCL_COLL_ALLREDUCE, MNCL_INT32, in.data(), out[r].data(), in.size(), -1, 0, kLong)};
    for (int k = 0; k < 3; ++k) {
      calls.push_back({r, k == 0 ? "recv" : k == 1 ? "send" : "allreduce", c[k], MNCL_OK, {}, {}});
    }
  }
  std::vector<std::thread> ts;
  for (Call &call : calls) {
    ts.emplace_back([&] {
      call.st = g_v2->execute(job.comm(call.rank), &call.c);
      call.returned = Clock::now();
      call.error = t_last_error;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // everyone blocked by now
  const Clock::time_point aborted_at = Clock::now();
  ASSERT_EQ(g_v2->comm_abort(job.comm(0)), MNCL_OK);
  for (auto &t : ts) t.join();
  for (const Call &call : calls) {
    const double after = std::chrono::duration<double>(call.returned - aborted_at).count();
    std::printf("rank %d %s: status %d after %.3f s: %s\n", call.rank, call.what, call.st, after,
                call.error.c_str());
    EXPECT_EQ(call.st, MNCL_ERR_ABORTED) << "rank " << call.rank << " " << call.what;
    EXPECT_GE(after, 0) << "returned before the abort";
    EXPECT_LT(after, 2.0) << "rank " << call.rank << " " << call.what;
  }
  std::vector<uint8_t> b(16);
  const mncl_coll_v1_t late = coll(MNCL_COLL_RECV, MNCL_UINT8, nullptr, b.data(), b.size(), 0, 0);
  EXPECT_EQ(g_v2->execute(job.comm(2), &late), MNCL_ERR_ABORTED) << t_last_error;
}

// What a failure does to the other lanes (shm_comm.h, "Failure handling"): a RECV that times out
// while an allreduce waits for a late peer leaves the allreduce to complete with the right
// result; a collective that times out while a SEND streams leaves the SEND (and its RECV) to
// complete. After either, the failing rank refuses new calls, naming the first failure.
TEST(ShmLanes, FailureStaysOnItsLane) {
  constexpr int64_t kShort = 300;
  for (const bool p2p_fails : {true, false}) {
    SCOPED_TRACE(p2p_fails ? "failing recv beside an allreduce"
                           : "failing allreduce beside a send");
    Job job(2);
    ASSERT_TRUE(job.ok());
    Failures f;
    std::vector<int32_t> in0(50000, 3), in1(50000, 4), out0(50000), out1(50000);
    const std::vector<uint8_t> big = message(0, 1, 0, 300000);
    std::vector<uint8_t> got(big.size());
    mncl_status_t failed_st = MNCL_OK;
    std::string failed_msg;
    std::thread failing([&] {
      const mncl_coll_v1_t c =
          p2p_fails
              ? coll(MNCL_COLL_RECV, MNCL_UINT8, nullptr, got.data(), 16, 1, 0, kShort)
              : coll(MNCL_COLL_ALLREDUCE, MNCL_INT32, in0.data(), out0.data(), 16, -1, 0, kShort);
      failed_st = g_v2->execute(job.comm(0), &c);
      failed_msg = t_last_error;
    });
    // Rank 0's long call on the other lane, started at once; rank 1 joins it after the failure.
    std::thread lane0([&] {
      if (p2p_fails) {
        run(f, job.comm(0),
            coll(MNCL_COLL_ALLREDUCE, MNCL_INT32, in0.data(), out0.data(), in0.size(), -1, 0),
            "allreduce", 0);
      } else {
        run(f, job.comm(0), coll(MNCL_COLL_SEND, MNCL_UINT8, big.data(), nullptr, big.size(), 1, 0),
            "send", 0);
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * kShort));
    if (p2p_fails) {
      run(f, job.comm(1),
          coll(MNCL_COLL_ALLREDUCE, MNCL_INT32, in1.data(), out1.data(), in1.size(), -1, 0),
          "allreduce", 1);
    } else {
      run(f, job.comm(1), coll(MNCL_COLL_RECV, MNCL_UINT8, nullptr, got.data(), got.size(), 0, 0),
          "recv", 1);
    }
    failing.join();
    lane0.join();
    f.expect_none();
    EXPECT_EQ(failed_st, MNCL_ERR_TIMEOUT) << failed_msg;
    if (p2p_fails) {
      EXPECT_TRUE(std::all_of(out0.begin(), out0.end(), [](int32_t v) { return v == 7; }));
      EXPECT_TRUE(std::all_of(out1.begin(), out1.end(), [](int32_t v) { return v == 7; }));
    } else {
      EXPECT_TRUE(got == big);
    }
    // Rank 0 refuses whatever comes next, on any lane.
    std::vector<uint8_t> b(16);
    const mncl_coll_v1_t next = coll(MNCL_COLL_SEND, MNCL_UINT8, b.data(), nullptr, b.size(), 1, 1);
    EXPECT_EQ(g_v2->execute(job.comm(0), &next), MNCL_ERR_REMOTE);
    EXPECT_NE(t_last_error.find("unusable after an earlier failure"), std::string::npos)
        << t_last_error;
    EXPECT_NE(t_last_error.find(p2p_fails ? "shm recv" : "shm allreduce"), std::string::npos)
        << t_last_error;
  }
}

// A SEND above two slots only offers the receiver its buffer (single copy). When the offer times
// out before any RECV took it, the sender withdraws it and the caller may reuse the buffer: the
// late RECV must fail, not read whatever the buffer holds by then.
TEST(ShmLanes, LateReceiverOfAWithdrawnSingleCopySend) {
  constexpr int64_t kShort = 300;
  Job job(2);
  ASSERT_TRUE(job.ok());
  const std::vector<uint8_t> original = message(0, 1, 0, 300000);
  std::vector<uint8_t> buffer = original, got(original.size(), 0);
  const mncl_coll_v1_t send =
      coll(MNCL_COLL_SEND, MNCL_UINT8, buffer.data(), nullptr, buffer.size(), 1, 0, kShort);
  EXPECT_EQ(g_v2->execute(job.comm(0), &send), MNCL_ERR_TIMEOUT) << t_last_error;
  std::fill(buffer.begin(), buffer.end(), uint8_t{0xee});  // the caller has it back
  const mncl_coll_v1_t recv =
      coll(MNCL_COLL_RECV, MNCL_UINT8, nullptr, got.data(), got.size(), 0, 0, kShort);
  EXPECT_EQ(g_v2->execute(job.comm(1), &recv), MNCL_ERR_REMOTE) << t_last_error;
  EXPECT_NE(t_last_error.find("withdrew message #0"), std::string::npos) << t_last_error;
  EXPECT_TRUE(std::none_of(got.begin(), got.end(), [](uint8_t v) { return v == 0xee; }));
}

// The same when the RECV has claimed the offer and is copying: the SEND's failure (a 1 ms
// timeout, far below the copy of 128 MiB) hands its buffer back at once instead of waiting for a
// reader that could be stuck for ever (stopped, swapping), and the reader then fails instead of
// returning what it read from a buffer its owner may have reused. (It once waited the read out.)
TEST(ShmLanes, SenderThatFailsDuringASingleCopyReadTakesItsBufferBack) {
  constexpr size_t kBytes = 128u << 20;
  std::vector<uint8_t> buffer(kBytes, 7), got(kBytes, 0);
  iovec local{got.data(), 64}, remote{buffer.data(), 64};
  if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != 64) {
    GTEST_SKIP() << "process_vm_readv is refused here (" << std::strerror(errno)
                 << "): messages stream, no single copy to abandon";
  }
  Job job(2);
  ASSERT_TRUE(job.ok());
  mncl_status_t recv_status = MNCL_OK;
  std::string recv_error;
  std::thread receiver([&] {  // already waiting when the offer comes, so it claims it at once
    const mncl_coll_v1_t recv =
        coll(MNCL_COLL_RECV, MNCL_UINT8, nullptr, got.data(), kBytes, 0, 0, 10000);
    recv_status = g_v2->execute(job.comm(1), &recv);
    recv_error = t_last_error;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const mncl_coll_v1_t send =
      coll(MNCL_COLL_SEND, MNCL_UINT8, buffer.data(), nullptr, kBytes, 1, 0, 1);
  EXPECT_EQ(g_v2->execute(job.comm(0), &send), MNCL_ERR_TIMEOUT) << t_last_error;
  receiver.join();
  EXPECT_EQ(recv_status, MNCL_ERR_REMOTE) << recv_error;
  EXPECT_NE(recv_error.find("withdrew message #0"), std::string::npos) << recv_error;
}

}  // namespace

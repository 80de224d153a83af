// Plugin ABI v2's threading contract (MNCL_CAP_CONCURRENT_P2P) on libmncl-naive.so and
// libmncl-gloo.so alone: each plugin is dlopen'ed directly (no core), ranks are threads of this
// process over an in-memory store, and every rank calls execute() from several threads at once,
// as the core's lanes do: one thread for the collectives, one per peer for SENDs and one per
// peer for RECVs. Checked, for each plugin:
//   - the exported tables: v2 with the capability, and a v1 copy without it;
//   - receive-before-send exchanges (which hang when one thread runs a rank's calls in issue
//     order) with every peer at once, beside a stream of collectives: exact data, many
//     iterations (MNCL_P2P_ITERATIONS, default 50);
//   - gloo's classic algorithms, whose eager chunks could block a message queued behind them;
//   - a timeout is reported by the op that ran out of time only, never as the timeout of an op
//     running beside it (Gloo closes every connection when one wait times out);
//   - comm_abort wakes every blocked lane with MNCL_ERR_ABORTED, promptly.
#include <gtest/gtest.h>
#include <mncl/mncl_plugin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plugin_harness.h"

#ifndef MNCL_NAIVE_PLUGIN
#error "MNCL_NAIVE_PLUGIN must name the built libmncl-naive.so"
#endif

namespace {

using mncl_testing::Clock;
using mncl_testing::host_env;
using mncl_testing::MemStore;
using mncl_testing::Plugin;
using mncl_testing::PluginsEnv;
using mncl_testing::seconds_since;
using mncl_testing::t_last_error;
using std::chrono::milliseconds;

// Tests assert outcomes, not speed: an upper bound on a call's duration only tells a failure
// that ends from a hang, so it is far above any timeout used here, even on a loaded machine.
constexpr double kNoHang = 15.0;

// Threads meeting at a point (C++17 has no std::barrier).
class Meeting {
 public:
  explicit Meeting(int parties) : parties_(parties) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int parties_;
  int arrived_ = 0;
  int generation_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The plugins, each loaded and initialized once for the whole program. The host logs up to
// MNCL_TEST_LOG_LEVEL (default: errors only) and pins MNCL_GLOO_ALGO: unset, unless a test
// sets it around comm_create.
// ---------------------------------------------------------------------------------------------

std::map<std::string, Plugin> g_plugins;

::testing::Environment *const g_env = mncl_testing::add_plugins_env(
    {"plugin", MNCL_LOG_ERROR, {{"MNCL_GLOO_ALGO", ""}}, {}},
    {
        {"naive", MNCL_NAIVE_PLUGIN, PluginsEnv::kV2, &g_plugins["naive"]},
#ifdef MNCL_GLOO_PLUGIN
        {"gloo", MNCL_GLOO_PLUGIN, PluginsEnv::kV2, &g_plugins["gloo"]},
#endif
    });

std::vector<std::string> backends() {
  std::vector<std::string> out{"naive"};
#ifdef MNCL_GLOO_PLUGIN
  out.push_back("gloo");
#endif
  return out;
}

// ---------------------------------------------------------------------------------------------
// One rank: its communicator, and the sequence numbers the core would give its calls
// (collectives per communicator; SEND and RECV per peer and direction, mncl_plugin_v1.h). Each
// counter is only touched by the thread of its lane, as in the core.
// ---------------------------------------------------------------------------------------------

struct Result {
  mncl_status_t status = MNCL_OK;
  std::string error;
  double seconds = 0;  // how long execute() took
};

struct Rank {
  const mncl_plugin_v2_t *plugin = nullptr;
  int rank = 0;
  int size = 0;
  void *comm = nullptr;
  int64_t timeout_ms = 20000;
  uint64_t next_collective = 0;
  std::vector<uint64_t> next_send, next_recv;

  Result execute(int32_t kind, int32_t dtype, int32_t op, int32_t root, const void *sendbuf,
                 void *recvbuf, size_t count, uint64_t seq, int64_t timeout) {
    const mncl_coll_v1_t c = mncl_testing::make_coll(kind, dtype, op, root, sendbuf, recvbuf, count,
                                                     seq, timeout > 0 ? timeout : timeout_ms);
    t_last_error.clear();
    const auto start = Clock::now();
    Result r;
    r.status = plugin->execute(comm, &c);
    r.seconds = seconds_since(start);
    if (r.status != MNCL_OK) r.error = t_last_error;
    return r;
  }
  Result send(int peer, const void *buf, size_t count, int32_t dtype, int64_t timeout = 0) {
    const uint64_t seq = next_send[static_cast<size_t>(peer)]++;
    return execute(MNCL_COLL_SEND, dtype, 0, peer, buf, nullptr, count, seq, timeout);
  }
  Result recv(int peer, void *buf, size_t count, int32_t dtype, int64_t timeout = 0) {
    const uint64_t seq = next_recv[static_cast<size_t>(peer)]++;
    return execute(MNCL_COLL_RECV, dtype, 0, peer, nullptr, buf, count, seq, timeout);
  }
  Result collective(int32_t kind, int32_t dtype, int32_t op, const void *sendbuf, void *recvbuf,
                    size_t count, int64_t timeout = 0) {
    return execute(kind, dtype, op, -1, sendbuf, recvbuf, count, next_collective++, timeout);
  }
};

std::string describe(const Result &r) {
  return std::to_string(r.status) + " after " + std::to_string(r.seconds) + " s: " + r.error;
}

// Runs body on `size` threads as the ranks of one communicator of `backend` over a fresh
// store. Every rank creates its communicator (collectively), runs body, meets the others, and
// destroys it (collectively too, for gloo). `store` lets a test throw the store's abort switch.
void run_ranks(const std::string &backend, int size, const std::function<void(Rank &)> &body,
               int64_t timeout_ms = 20000, MemStore *store = nullptr) {
  MemStore local;
  MemStore &st = store ? *store : local;
  const mncl_plugin_v2_t *plugin = g_plugins.at(backend).v2;
  Meeting done(size);
  mncl_testing::on_threads(size, [&](int r) {
    Rank me;
    me.plugin = plugin;
    me.rank = r;
    me.size = size;
    me.timeout_ms = timeout_ms;
    me.next_send.assign(static_cast<size_t>(size), 0);
    me.next_recv.assign(static_cast<size_t>(size), 0);
    const mncl_bootstrap_v1_t bs =
        mncl_testing::make_bootstrap(r, size, timeout_ms, "w", st.table());
    const mncl_status_t created = plugin->comm_create(&bs, &me.comm);
    EXPECT_EQ(created, MNCL_OK) << backend << " rank " << r << ": " << t_last_error;
    if (created == MNCL_OK) body(me);
    done.arrive_and_wait();  // nobody closes connections a peer still uses
    if (created == MNCL_OK) {
      EXPECT_EQ(plugin->comm_destroy(me.comm), MNCL_OK) << t_last_error;
    }
  });
}

class Concurrent : public ::testing::TestWithParam<std::string> {};

std::string param_name(const ::testing::TestParamInfo<std::string> &info) {
  return info.param;
}

// ---------------------------------------------------------------------------------------------
// The tables
// ---------------------------------------------------------------------------------------------

TEST_P(Concurrent, ExportsV2WithTheCapabilityAndAV1CopyWithout) {
  const Plugin &p = g_plugins.at(GetParam());
  const mncl_plugin_v2_t &t = *p.v2;
  EXPECT_EQ(t.struct_size, sizeof(mncl_plugin_v2_t));
  EXPECT_EQ(t.magic, MNCL_PLUGIN_MAGIC);
  EXPECT_EQ(t.abi_version, MNCL_PLUGIN_ABI_V2);
  EXPECT_EQ(GetParam(), t.name);
  EXPECT_EQ(t.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(t.reserved0, 0u);

  const mncl_plugin_v1_t &v1 = *p.v1;
  EXPECT_EQ(v1.struct_size, sizeof(mncl_plugin_v1_t));
  EXPECT_EQ(v1.magic, MNCL_PLUGIN_MAGIC);
  EXPECT_EQ(v1.abi_version, MNCL_PLUGIN_ABI_V1);
  EXPECT_EQ(v1.name, t.name);
  EXPECT_EQ(v1.version, t.version);
  EXPECT_EQ(v1.caps, MNCL_CAP_HOST_MEMORY);  // a v1 core serializes: no concurrency promised
  EXPECT_EQ(v1.coll_mask, t.coll_mask);
  EXPECT_EQ(v1.dtype_mask, t.dtype_mask);
  EXPECT_EQ(v1.op_mask, t.op_mask);
  EXPECT_EQ(v1.reserved0, 0u);
  EXPECT_EQ(v1.init, t.init);
  EXPECT_EQ(v1.finalize, t.finalize);
  EXPECT_EQ(v1.probe, t.probe);
  EXPECT_EQ(v1.comm_create, t.comm_create);
  EXPECT_EQ(v1.comm_destroy, t.comm_destroy);
  EXPECT_EQ(v1.comm_abort, t.comm_abort);
  EXPECT_EQ(v1.comm_split, t.comm_split);
  EXPECT_EQ(v1.execute, t.execute);
  EXPECT_EQ(v1.post, t.post);
  EXPECT_EQ(v1.test, t.test);
}

// ---------------------------------------------------------------------------------------------
// Receive before send, with every peer at once, beside collectives
// ---------------------------------------------------------------------------------------------

// Element i of message k from src to dst: distinct per pair, message and position.
int32_t message_value(int src, int dst, int k, size_t i) {
  const uint32_t v = static_cast<uint32_t>(src) * 0x9e3779b1u ^
                     static_cast<uint32_t>(dst) * 0x85ebca6bu ^
                     static_cast<uint32_t>(k) * 0xc2b2ae35u;
  return static_cast<int32_t>((v + static_cast<uint32_t>(i)) & 0x7fffffffu);
}

// Message sizes in elements: empty, tiny, and larger than a socket buffer (gloo then keeps the
// send queued and reads it in parts, beside the other lanes' traffic).
const size_t kSizes[] = {1, 0, 4099, 300000};
constexpr int kRounds = 3;

// One exchange on one rank: RECV lanes for every peer start first and block (the MPI pattern
// "irecv from everyone, then isend to everyone"), then SEND lanes, then the collective lane;
// all run at once. Every message and every collective result is checked exactly.
void exchange_beside_collectives(Rank &me) {
  const int n = me.size, r = me.rank;
  std::atomic<int> failures{0};
  std::vector<std::thread> lanes;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == r) continue;
    lanes.emplace_back([&, peer] {  // the RECV lane of peer
      for (int k = 0; k < kRounds; ++k) {
        for (size_t count : kSizes) {
          std::vector<int32_t> buf(count + 1, -1);  // one more: nothing may land past count
          const Result res = me.recv(peer, buf.data(), count, MNCL_INT32);
          if (res.status != MNCL_OK) {
            ADD_FAILURE() << "rank " << r << " recv from " << peer << ": " << describe(res);
            ++failures;
            return;
          }
          for (size_t i = 0; i < count; ++i) {
            if (buf[i] != message_value(peer, r, k, i)) {
              ADD_FAILURE() << "rank " << r << " message " << k << " from " << peer << " [" << i
                            << "] = " << buf[i];
              ++failures;
              return;
            }
          }
          if (buf[count] != -1) {
            ADD_FAILURE() << "rank " << r << ": recv wrote past its count";
            ++failures;
          }
        }
      }
    });
  }
  // Let the receives block first: serialized in issue order, nothing would ever be sent.
  std::this_thread::sleep_for(milliseconds(2));
  for (int peer = 0; peer < n; ++peer) {
    if (peer == r) continue;
    lanes.emplace_back([&, peer] {  // the SEND lane of peer
      for (int k = 0; k < kRounds; ++k) {
        for (size_t count : kSizes) {
          std::vector<int32_t> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = message_value(r, peer, k, i);
          const Result res = me.send(peer, buf.data(), count, MNCL_INT32);
          if (res.status != MNCL_OK) {
            ADD_FAILURE() << "rank " << r << " send to " << peer << ": " << describe(res);
            ++failures;
            return;
          }
        }
      }
    });
  }
  lanes.emplace_back([&] {  // the collective lane
    for (int k = 0; k < kRounds; ++k) {
      const size_t count = 1000;
      std::vector<int32_t> in(count), out(count, -1);
      for (size_t i = 0; i < count; ++i) in[i] = r * 1000 + k + static_cast<int32_t>(i);
      Result res =
          me.collective(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, in.data(), out.data(), count);
      if (res.status != MNCL_OK) {
        ADD_FAILURE() << "rank " << r << " allreduce: " << describe(res);
        ++failures;
        return;
      }
      for (size_t i = 0; i < count; ++i) {
        const int32_t want = 1000 * n * (n - 1) / 2 + n * (k + static_cast<int32_t>(i));
        if (out[i] != want) {
          ADD_FAILURE() << "rank " << r << " allreduce [" << i << "] = " << out[i];
          ++failures;
          return;
        }
      }
      std::vector<int64_t> mine(7, 100 * r + k), all(7 * static_cast<size_t>(n), -1);
      res = me.collective(MNCL_COLL_ALLGATHER, MNCL_INT64, 0, mine.data(), all.data(), 7);
      if (res.status != MNCL_OK) {
        ADD_FAILURE() << "rank " << r << " allgather: " << describe(res);
        ++failures;
        return;
      }
      for (size_t i = 0; i < all.size(); ++i) {
        if (all[i] != 100 * static_cast<int64_t>(i / 7) + k) {
          ADD_FAILURE() << "rank " << r << " allgather [" << i << "] = " << all[i];
          ++failures;
          return;
        }
      }
      res = me.collective(MNCL_COLL_BARRIER, MNCL_INT32, 0, nullptr, nullptr, 0);
      if (res.status != MNCL_OK) {
        ADD_FAILURE() << "rank " << r << " barrier: " << describe(res);
        ++failures;
        return;
      }
    }
  });
  for (auto &t : lanes) t.join();
}

int iterations() {
  const char *text = std::getenv("MNCL_P2P_ITERATIONS");
  return text != nullptr && std::atoi(text) > 0 ? std::atoi(text) : 50;
}

void stress(const std::string &backend, int n) {
  const int runs = iterations();
  const auto start = Clock::now();
  for (int it = 0; it < runs && !::testing::Test::HasFailure(); ++it) {
    run_ranks(backend, n, exchange_beside_collectives);
  }
  std::printf("%s np%d: %d iterations of %d rounds in %.2f s\n", backend.c_str(), n, runs, kRounds,
              seconds_since(start));
}

TEST_P(Concurrent, ReceiveBeforeSendBesideCollectivesNp2) {
  stress(GetParam(), 2);
}
TEST_P(Concurrent, ReceiveBeforeSendBesideCollectivesNp3) {
  stress(GetParam(), 3);
}
TEST_P(Concurrent, ReceiveBeforeSendBesideCollectivesNp4) {
  stress(GetParam(), 4);
}

// ---------------------------------------------------------------------------------------------
// A timeout belongs to the op that ran out of time
// ---------------------------------------------------------------------------------------------

// The op that ran out of its 0.4 s reports TIMEOUT naming itself, and ends (no hang).
void expect_own_timeout(const Result &res, const char *name) {
  EXPECT_EQ(res.status, MNCL_ERR_TIMEOUT) << describe(res);
  EXPECT_NE(res.error.find(name), std::string::npos) << res.error;
  EXPECT_NE(res.error.find("within 0.4 s"), std::string::npos) << res.error;
  EXPECT_LT(res.seconds, kNoHang);
}

// An op running beside another op's failure (gloo, whose context that failure breaks) reports
// REMOTE naming the op that failed, not a timeout of its own.
void expect_stopped_by(const Result &res, const char *culprit) {
  EXPECT_EQ(res.status, MNCL_ERR_REMOTE) << describe(res);
  EXPECT_NE(res.error.find("concurrent operation"), std::string::npos) << res.error;
  EXPECT_NE(res.error.find(culprit), std::string::npos) << res.error;
  EXPECT_LT(res.seconds, kNoHang);
}

// Rank 0 waits for a message that comes too late (0.4 s bound) while its barrier waits for
// rank 1, which arrives after 1.5 s. The RECV must time out naming itself; the barrier must not
// be reported as timed out (gloo: the communicator is unusable after any failure, so it fails
// with MNCL_ERR_REMOTE naming the RECV; naive: it completes).
TEST_P(Concurrent, RecvTimeoutIsNotReportedAsTheCollectives) {
  const bool gloo = GetParam() == "gloo";
  Result recv, barrier0, barrier1;
  run_ranks(GetParam(), 2, [&](Rank &me) {
    if (me.rank == 1) {
      std::this_thread::sleep_for(milliseconds(1500));
      barrier1 = me.collective(MNCL_COLL_BARRIER, MNCL_INT32, 0, nullptr, nullptr, 0, 5000);
      return;
    }
    std::thread lane([&] {
      int32_t v = 0;
      recv = me.recv(1, &v, 1, MNCL_INT32, /*timeout=*/400);
    });
    barrier0 = me.collective(MNCL_COLL_BARRIER, MNCL_INT32, 0, nullptr, nullptr, 0, 20000);
    lane.join();
  });
  expect_own_timeout(recv, "recv #0");
  EXPECT_GE(recv.seconds, 0.35);
  if (gloo) {
    expect_stopped_by(barrier0, "gloo recv #0");
    EXPECT_EQ(barrier1.status, MNCL_ERR_REMOTE) << describe(barrier1);  // rank 0 hung up
  } else {
    EXPECT_EQ(barrier0.status, MNCL_OK) << describe(barrier0);
    EXPECT_EQ(barrier1.status, MNCL_OK) << describe(barrier1);
  }
}

// The other way round: rank 0's allreduce runs out of time (0.4 s; rank 1 never joins) while
// its RECV waits for a message that rank 1 sends after 1.5 s, well within the RECV's bound.
TEST_P(Concurrent, CollectiveTimeoutIsNotReportedAsTheRecvs) {
  const bool gloo = GetParam() == "gloo";
  Result allreduce, recv, send;
  int32_t got = -1;
  run_ranks(GetParam(), 2, [&](Rank &me) {
    if (me.rank == 1) {
      std::this_thread::sleep_for(milliseconds(1500));
      const int32_t v = 42;
      send = me.send(0, &v, 1, MNCL_INT32, 5000);
      return;
    }
    std::thread lane([&] { recv = me.recv(1, &got, 1, MNCL_INT32, /*timeout=*/20000); });
    int32_t x = 1;
    allreduce = me.collective(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, &x, &x, 1, 400);
    lane.join();
  });
  expect_own_timeout(allreduce, "allreduce #0");
  if (gloo) {
    expect_stopped_by(recv, "gloo allreduce #0");
    EXPECT_EQ(send.status, MNCL_ERR_REMOTE) << describe(send);  // rank 0 hung up
  } else {
    EXPECT_EQ(recv.status, MNCL_OK) << describe(recv);
    EXPECT_EQ(got, 42);
    EXPECT_EQ(send.status, MNCL_OK) << describe(send);
  }
}

// Quick ops one after the other, then one that blocks: it must still time out on time (gloo's
// watchdog sleeps until deadlines planned by ops long gone, and must then look again).
TEST_P(Concurrent, TimeoutAfterManyQuickOpsComesOnTime) {
  Result recv;
  run_ranks(GetParam(), 2, [&](Rank &me) {
    for (int i = 0; i < 50; ++i) {
      int32_t x = 1;
      const Result res =
          me.collective(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, &x, &x, 1, /*timeout=*/300);
      ASSERT_EQ(res.status, MNCL_OK) << describe(res);
      ASSERT_EQ(x, 2);
    }
    if (me.rank == 0) {
      int32_t v = 0;
      recv = me.recv(1, &v, 1, MNCL_INT32, /*timeout=*/300);
    }
  });
  EXPECT_EQ(recv.status, MNCL_ERR_TIMEOUT) << describe(recv);
  EXPECT_GE(recv.seconds, 0.25);
  EXPECT_LT(recv.seconds, kNoHang);
}

// ---------------------------------------------------------------------------------------------
// Abort
// ---------------------------------------------------------------------------------------------

// Rank 0 of 3 blocks on every lane at once: a RECV from each peer (never sent), a SEND to each
// peer (never received: gloo's send waits for its receiver, naive's completes at once) and an
// allreduce nobody joins. An abort from another thread (the core's order: store switch, then
// comm_abort) must end each of them with MNCL_ERR_ABORTED within a second, and fail later calls.
TEST_P(Concurrent, AbortEndsEveryBlockedLane) {
  const bool gloo = GetParam() == "gloo";
  MemStore store;
  std::vector<Result> recvs(3), sends(3);
  Result allreduce, after;
  double abort_at = 0;
  Meeting rank0_done(3);
  run_ranks(
      GetParam(), 3,
      [&](Rank &me) {
        if (me.rank != 0) {  // stay connected until rank 0 is through
          rank0_done.arrive_and_wait();
          return;
        }
        const auto start = Clock::now();
        std::vector<std::thread> lanes;
        int32_t in[2] = {0, 0}, out[2] = {0, 0};
        for (int peer = 1; peer < 3; ++peer) {
          lanes.emplace_back(
              [&, peer] { recvs[peer] = me.recv(peer, &in[peer - 1], 1, MNCL_INT32); });
          lanes.emplace_back(
              [&, peer] { sends[peer] = me.send(peer, &out[peer - 1], 1, MNCL_INT32); });
        }
        lanes.emplace_back([&] {
          int32_t x = 1;
          allreduce = me.collective(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, &x, &x, 1);
        });
        std::this_thread::sleep_for(milliseconds(300));
        std::thread aborter([&] {
          abort_at = seconds_since(start);
          store.abort();
          EXPECT_EQ(me.plugin->comm_abort(me.comm), MNCL_OK) << t_last_error;
        });
        for (auto &t : lanes) t.join();
        aborter.join();
        after = me.recv(1, &in[0], 1, MNCL_INT32);
        rank0_done.arrive_and_wait();
      },
      /*timeout_ms=*/20000, &store);
  // Each lane ends with ABORTED soon after the abort, long before its 20 s timeout.
  auto check = [&](const Result &res, const char *what) {
    EXPECT_EQ(res.status, MNCL_ERR_ABORTED) << what << ": " << describe(res);
    EXPECT_LT(res.seconds, abort_at + kNoHang) << what;
  };
  for (int peer = 1; peer < 3; ++peer) {
    check(recvs[peer], "recv");
    if (gloo) {
      check(sends[peer], "send");
    } else {
      EXPECT_EQ(sends[peer].status, MNCL_OK) << describe(sends[peer]);  // lands in the store
    }
  }
  check(allreduce, "allreduce");
  EXPECT_EQ(after.status, MNCL_ERR_ABORTED) << describe(after);
}

INSTANTIATE_TEST_SUITE_P(Plugins, Concurrent, ::testing::ValuesIn(backends()), param_name);

// ---------------------------------------------------------------------------------------------
// gloo's classic algorithms send their first chunks before the peer has entered the collective;
// a message queued behind them on the connection must still reach a receiver that only enters
// the collective once it has that message (rank 0: recv, then allreduce; rank 1: allreduce and,
// a little later, the send, on two lanes: correct MPI, which needs the plugin's barrier).
// ---------------------------------------------------------------------------------------------

#ifdef MNCL_GLOO_PLUGIN
class GlooClassic : public ::testing::TestWithParam<std::string> {};

TEST_P(GlooClassic, MessageBehindEagerChunksArrives) {
  host_env().pin("MNCL_GLOO_ALGO", GetParam());
  const size_t count = 1 << 18;  // 1 MiB of int32: chunks fill the connection first
  for (int it = 0; it < 5 && !HasFailure(); ++it) {
    run_ranks(
        "gloo", 2,
        [&](Rank &me) {
          std::vector<int32_t> data(count, me.rank + 1);
          int32_t message = -1;
          if (me.rank == 0) {
            const Result recv = me.recv(1, &message, 1, MNCL_INT32);
            EXPECT_EQ(recv.status, MNCL_OK) << describe(recv);
            EXPECT_EQ(message, 7);
          } else {
            std::thread lane([&] {
              std::this_thread::sleep_for(milliseconds(50));
              message = 7;
              const Result send = me.send(0, &message, 1, MNCL_INT32);
              EXPECT_EQ(send.status, MNCL_OK) << describe(send);
            });
            const Result res = me.collective(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, data.data(),
                                             data.data(), count);
            EXPECT_EQ(res.status, MNCL_OK) << describe(res);
            lane.join();
            EXPECT_EQ(data[count - 1], 3);
            return;
          }
          const Result res = me.collective(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, data.data(),
                                           data.data(), count);
          EXPECT_EQ(res.status, MNCL_OK) << describe(res);
          EXPECT_EQ(data[0], 3);
        },
        /*timeout_ms=*/5000);
  }
  host_env().pin("MNCL_GLOO_ALGO", "");
}

// The same barrier carries the call's digest: ranks that disagree on the count now time out
// before any chunk moves (untagged, the classic algorithms would exchange mismatched buffers).
TEST_P(GlooClassic, MismatchedCountsTimeOutBeforeDataMoves) {
  host_env().pin("MNCL_GLOO_ALGO", GetParam());
  std::vector<Result> results(2);
  run_ranks("gloo", 2, [&](Rank &me) {
    std::vector<int32_t> data(4096, 1);
    results[static_cast<size_t>(me.rank)] =
        me.collective(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, data.data(), data.data(),
                      me.rank == 0 ? 4096 : 2048, /*timeout=*/500);
  });
  for (const Result &res : results) {
    EXPECT_TRUE(res.status == MNCL_ERR_TIMEOUT || res.status == MNCL_ERR_REMOTE) << describe(res);
    EXPECT_LT(res.seconds, kNoHang);
  }
  host_env().pin("MNCL_GLOO_ALGO", "");
}

INSTANTIATE_TEST_SUITE_P(Algos, GlooClassic, ::testing::Values("ring_chunked", "halving_doubling"),
                         param_name);
#endif

}  // namespace

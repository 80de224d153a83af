// OpHistory and Watchdog (sdk/core/watchdog.h): the watchdog must see every running operation,
// however many newer ones the other lanes finish meanwhile. Before slots of running operations
// were kept, an operation outlived by 16 newer ones left its view: a backend hung in it was
// never aborted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/coll.h"  // plugin kit
#include "core/watchdog.h"

namespace mncl::core {
namespace {

mncl_coll_v1_t op(int kind, uint64_t seq, size_t count = 4) {
  mncl_coll_v1_t c = kit::make_coll(kind, MNCL_FLOAT32, MNCL_SUM, -1, nullptr, nullptr, count);
  c.seq = seq;
  return c;
}

TEST(OpHistory, NoOperationsYet) {
  OpHistory history;
  history.set_max_running(3);
  OpHistory::Record r;
  EXPECT_FALSE(history.running(&r));
  EXPECT_EQ(history.dump(), "no operations yet");
}

TEST(OpHistory, RunningOperationOutlivedByManyNewerOnesStaysInView) {
  OpHistory history;
  history.set_max_running(3);  // e.g. a 1-rank communicator: collectives + 2 p2p lanes
  const size_t receive = history.begin(op(MNCL_COLL_RECV, 7));
  for (uint64_t seq = 0; seq < 10 * OpHistory::kOps; ++seq) {
    history.end(history.begin(op(MNCL_COLL_ALLREDUCE, seq)), true);
  }
  OpHistory::Record r;
  ASSERT_TRUE(history.running(&r));
  EXPECT_EQ(r.kind, MNCL_COLL_RECV);
  EXPECT_EQ(r.seq, 7u);
  history.end(receive, true);
  EXPECT_FALSE(history.running(&r));
}

TEST(OpHistory, OldestOfSeveralRunningOperations) {
  OpHistory history;
  history.set_max_running(5);
  std::vector<size_t> tokens;
  for (uint64_t seq = 0; seq < 4; ++seq) {
    tokens.push_back(history.begin(op(MNCL_COLL_SEND, 100 + seq)));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // distinct start times
    for (uint64_t i = 0; i < 2 * OpHistory::kOps; ++i) {
      history.end(history.begin(op(MNCL_COLL_BCAST, i)), true);
    }
  }
  OpHistory::Record r;
  for (uint64_t seq = 0; seq < 4; ++seq) {
    ASSERT_TRUE(history.running(&r));
    EXPECT_EQ(r.seq, 100 + seq) << "the oldest running one";
    history.end(tokens[seq], seq % 2 == 0);
  }
  EXPECT_FALSE(history.running(&r));
}

TEST(OpHistory, DumpIsNewestFirstAndKeepsTheRunningOne) {
  OpHistory history;
  history.set_max_running(3);
  const size_t receive = history.begin(op(MNCL_COLL_RECV, 1, 2));
  for (uint64_t seq = 0; seq < 3 * OpHistory::kOps; ++seq) {
    history.end(history.begin(op(MNCL_COLL_ALLREDUCE, seq)), seq != 40);
  }
  const std::string newest = history.dump(3);
  EXPECT_EQ(newest.find("allreduce #47 16 B done"), 0u) << newest;
  EXPECT_NE(newest.find("allreduce #46"), std::string::npos) << newest;
  EXPECT_NE(newest.find("allreduce #45"), std::string::npos) << newest;
  const std::string all = history.dump(1000);
  EXPECT_NE(all.find("recv #1 8 B running"), std::string::npos) << all;
  EXPECT_NE(all.find("allreduce #40 16 B failed"), std::string::npos) << all;
  history.end(receive, true);
}

TEST(OpHistory, ConcurrentLanesEachKeepTheirRunningOperation) {
  // One thread per lane: each keeps one long operation running while it records many short
  // ones, as a lane's thread would around a posted receive. Every long one must stay in view.
  constexpr int kLanes = 6;
  OpHistory history;
  history.set_max_running(2 * kLanes);  // a long and a short one per lane
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < kLanes; ++lane) {
    lanes.emplace_back([&, lane] {
      const size_t long_op = history.begin(op(MNCL_COLL_RECV, 1000 + lane));
      ++started;
      for (uint64_t i = 0; i < 2000; ++i) {
        history.end(history.begin(op(MNCL_COLL_SEND, i)), true);
      }
      while (!release.load()) std::this_thread::yield();
      history.end(long_op, true);
    });
  }
  while (started.load() < kLanes) std::this_thread::yield();
  // While the lanes churn, the oldest running operation is always one of the long ones, and
  // every long one is still listed.
  for (int i = 0; i < 200; ++i) {
    OpHistory::Record r;
    ASSERT_TRUE(history.running(&r));
    EXPECT_EQ(r.kind, MNCL_COLL_RECV) << "seq " << r.seq;
    if (i % 20 != 0) continue;
    const std::string all = history.dump(1000);
    for (int lane = 0; lane < kLanes; ++lane) {
      EXPECT_NE(all.find("recv #" + std::to_string(1000 + lane) + " 16 B running"),
                std::string::npos)
          << all;
    }
  }
  release.store(true);
  for (auto &t : lanes) t.join();
  OpHistory::Record r;
  EXPECT_FALSE(history.running(&r));
}

TEST(Watchdog, FiresForAnOperationOutlivedByManyNewerOnes) {
  OpHistory history;
  history.set_max_running(3);
  std::mutex mutex;
  std::condition_variable cv;
  bool fired = false;
  OpHistory::Record expired;
  const size_t hung = history.begin(op(MNCL_COLL_RECV, 3));
  for (uint64_t seq = 0; seq < 4 * OpHistory::kOps; ++seq) {
    history.end(history.begin(op(MNCL_COLL_ALLREDUCE, seq)), true);
  }
  Watchdog watchdog(history, /*timeout_ms=*/50, [&](const OpHistory::Record &r) {
    std::lock_guard<std::mutex> lock(mutex);
    expired = r;
    fired = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mutex);
  // The bound only keeps a broken watchdog from hanging the test (it fires after ~150 ms).
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return fired; }))
      << "the watchdog never saw the running receive";
  EXPECT_EQ(expired.kind, MNCL_COLL_RECV);
  EXPECT_EQ(expired.seq, 3u);
  EXPECT_TRUE(watchdog.fired());
  history.end(hung, false);
}

}  // namespace
}  // namespace mncl::core

// OpHistory and Watchdog (sdk/core/watchdog.h): the watchdog must see every running operation,
// however many newer ones the other lanes finish meanwhile. Before slots of running operations
// were kept, an operation outlived by 16 newer ones left its view: a backend hung in it was
// never aborted. And, through a communicator (Comm::execute_now), what its abort reports: the
// operation that timed out MNCL_ERR_TIMEOUT, every other one it ended MNCL_ERR_ABORTED.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/coll.h"  // plugin kit
#include "common/error.h"
#include "core/comm.h"
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

#if defined(MNCL_MOCK_HANG_P2P_PLUGIN) && defined(MNCL_MOCK_P2P_LANES_PLUGIN)
// Whether `path` has a line equal to `line`, polled until it does; the bound only keeps a
// broken scenario from hanging the test.
bool wait_for_line(const std::string &path, const std::string &line) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < give_up) {
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) {
      if (l == line) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// The mock's lines in `path` but its "init" and "finalize" (each rank loads it).
std::vector<std::string> operation_lines(const std::string &path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    const size_t space = l.rfind(' ');
    const std::string last = space == std::string::npos ? l : l.substr(space + 1);
    if (last != "init" && last != "finalize") lines.push_back(l);
  }
  return lines;
}

// A job of two ranks on a mock plugin: rank 0 is a Comm in this process (`comm`), rank 1 a
// forked process that only joins, and leaves once finish() lets it go. The mock's events go to
// `events`; the temporary folder goes with the object.
class TwoRanks {
 public:
  TwoRanks(const char *plugin, int64_t timeout_ms) {
    char dir_template[] = "/tmp/mncl_lanes_XXXXXX";
    if (mkdtemp(dir_template) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = dir_template;
    events = dir_ + "/events";
    store_ = "file://" + dir_ + "/store";
    setenv("MNCL_MOCK_EVENTS", events.c_str(), 1);
    plugin_ = plugin;
    timeout_ms_ = timeout_ms;
    int release[2];
    if (pipe(release) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {  // rank 1: joins, waits until rank 0 closes the pipe (or exits), leaves
      close(release[1]);
      int rc = 0;
      try {
        const mncl_config_t config = config_for(1);
        const std::unique_ptr<Comm> peer = Comm::create(&config);
        char byte = 0;
        for (ssize_t n; (n = read(release[0], &byte, 1)) != 0;) {
          if (n < 0 && errno != EINTR) break;
        }
        peer->destroy();
      } catch (const std::exception &e) {
        std::fprintf(stderr, "rank 1: %s\n", e.what());
        rc = 1;
      }
      _exit(rc);
    }
    close(release[0]);
    release_fd_ = release[1];
    const mncl_config_t config = config_for(0);
    comm = Comm::create(&config);
  }
  // Destroys rank 0's communicator, lets rank 1 go and returns its wait status.
  int finish() {
    release();
    if (comm) {
      comm->destroy();
      comm.reset();
    }
    if (pid_ > 0) {
      while (waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    return status_;
  }
  ~TwoRanks() {
    try {
      finish();
    } catch (...) {
    }
    unsetenv("MNCL_MOCK_EVENTS");
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::unique_ptr<Comm> comm;
  std::string events;

 private:
  mncl_config_t config_for(int rank) const {
    mncl_config_t config = MNCL_CONFIG_INIT;
    config.backend = plugin_;
    config.rank = rank;
    config.size = 2;
    config.bootstrap = store_.c_str();
    config.timeout_ms = timeout_ms_;
    return config;
  }
  void release() {
    if (release_fd_ >= 0) close(release_fd_);
    release_fd_ = -1;
  }

  std::string dir_, store_;
  const char *plugin_ = nullptr;
  int64_t timeout_ms_ = 0;
  pid_t pid_ = -1;
  int release_fd_ = -1;
  int status_ = -1;
};

// The watchdog times out one operation and aborts the backend's communicator, which ends every
// other operation running beside it: only the one that ran out of time reports
// MNCL_ERR_TIMEOUT; the others report MNCL_ERR_ABORTED, saying that the watchdog's abort after
// another operation's timeout ended them (not a timeout of their own, nor the user's abort).
// Rank 0 of 2 on the "hangp2p" mock, which blocks every operation until aborted and ignores
// its timeout: a non-blocking send, blocked on its own p2p lane, then a blocking allreduce
// beside it on the collectives lane. The send is in the backend before the allreduce starts,
// so it is the one the watchdog times out.
TEST(Watchdog, OperationsEndedByItsAbortReportAbortedOnlyTheTimedOutOneTimeout) {
  constexpr int64_t kTimeoutMs = 2000;  // the watchdog fires ~2.2 s after the send began
  std::unique_ptr<TwoRanks> job;
  try {
    job = std::make_unique<TwoRanks>(MNCL_MOCK_HANG_P2P_PLUGIN, kTimeoutMs);
  } catch (const std::exception &e) {
    FAIL() << "rank 0: " << e.what();
  }
  Comm &comm = *job->comm;
  int32_t value = 1, result = 0;
  const std::shared_ptr<Operation> send =
      comm.start(kit::make_coll(MNCL_COLL_SEND, MNCL_INT32, -1, /*peer=*/1, &value, nullptr, 1));
  ASSERT_TRUE(wait_for_line(
      job->events, "hangp2p blocked rank 0 kind " + std::to_string(MNCL_COLL_SEND) + " #0"))
      << "the send never reached the backend";

  mncl_status_t allreduce_status = MNCL_OK;
  std::string allreduce_error;
  try {
    comm.run(kit::make_coll(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, -1, &value, &result, 1));
  } catch (const Error &e) {
    allreduce_status = e.status();
    allreduce_error = e.what();
  }
  ASSERT_TRUE(comm.wait(*send, -1));

  // The send ran out of time: its own timeout, named as the watchdog's.
  EXPECT_EQ(send->status, MNCL_ERR_TIMEOUT) << send->error;
  EXPECT_EQ(send->error.rfind("mncl_send #0 on hangp2p (rank 0 of 2): no result from the backend "
                              "within the timeout",
                              0),
            0u)
      << send->error;
  EXPECT_NE(send->error.find("the watchdog aborted the backend's communicator"), std::string::npos)
      << send->error;
  EXPECT_EQ(send->error.find("ended by the watchdog's abort"), std::string::npos) << send->error;
  // The allreduce was ended by that abort: ABORTED, naming itself, the abort and the send.
  EXPECT_EQ(allreduce_status, MNCL_ERR_ABORTED) << allreduce_error;
  EXPECT_EQ(allreduce_error.rfind("mncl_allreduce #0 on hangp2p (rank 0 of 2): ended by the "
                                  "watchdog's abort of the backend's communicator after another "
                                  "operation timed out: ",
                                  0),
            0u)
      << allreduce_error;
  EXPECT_NE(allreduce_error.find("timed out: mncl_send #0 on hangp2p (rank 0 of 2): no result from "
                                 "the backend within the timeout"),
            std::string::npos)
      << allreduce_error;

  int status = -1;
  EXPECT_NO_THROW(status = job->finish());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1: wait status " << status;
}

// A native batch on a backend with per-peer lanes runs on the collectives' lane, yet keeps its
// place in its peers' lanes (mncl_plugin_v2.h: one SEND to a peer at a time, in seq order). On
// the "p2planes" mock, whose sends and batches take 100 ms and which records any breach: a send
// to rank 1, then a batch with a send to rank 1, then another send. Before the lanes were
// gated the batch ran at once, beside the first send (an overlap), and the last send beside
// the batch.
TEST(Lanes, ANativeBatchKeepsItsPlaceInItsPeersLanes) {
  std::unique_ptr<TwoRanks> job;
  try {
    job = std::make_unique<TwoRanks>(MNCL_MOCK_P2P_LANES_PLUGIN, 30000);
  } catch (const std::exception &e) {
    FAIL() << "rank 0: " << e.what();
  }
  Comm &comm = *job->comm;
  int32_t a = 1, b = 2, c = 3, d = 4;
  const auto first =
      comm.start(kit::make_coll(MNCL_COLL_SEND, MNCL_INT32, -1, /*peer=*/1, &a, nullptr, 1));
  const mncl_p2p_v4_t ops[2] = {{MNCL_COLL_SEND, 1, MNCL_INT32, 0, &b, 1, 0},
                                {MNCL_COLL_RECV, 1, MNCL_INT32, 0, &d, 1, 0}};
  const auto batch = comm.start_batch("mncl_isendrecv_batch", {ops[0], ops[1]}, nullptr, false);
  const auto last =
      comm.start(kit::make_coll(MNCL_COLL_SEND, MNCL_INT32, -1, /*peer=*/1, &c, nullptr, 1));
  for (const auto &op : {last, batch, first}) {
    ASSERT_TRUE(comm.wait(*op, -1));
    EXPECT_EQ(op->status, MNCL_OK) << op->error;
  }
  EXPECT_EQ(operation_lines(job->events),
            (std::vector<std::string>{"p2planes send 1 #0", "p2planes batch send 1 #1",
                                      "p2planes batch recv 1 #0", "p2planes send 1 #2"}));
  int status = -1;
  EXPECT_NO_THROW(status = job->finish());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1: wait status " << status;
}
#endif

}  // namespace
}  // namespace mncl::core

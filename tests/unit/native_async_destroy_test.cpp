// Operations posted natively (MNCL_CAP_NATIVE_ASYNC: post/test, as flat and nccl run
// non-blocking calls) on a backend that never ends them itself: the mock "stuck"
// (tests/loader/mock_plugin.c, MOCK_ASYNC_STUCK) reports an operation done only once its
// communicator is aborted, or never (MNCL_MOCK_IGNORE_ABORT=1). Through the public API, one rank:
//   - mncl_comm_destroy ends such operations before it frees the backend's communicator (the
//     mock fails comm_destroy while one is pending): past an operation's timeout (+ the
//     watchdog's grace) it aborts that communicator, and gives up after one more grace;
//   - a request outliving its communicator answers with its operation's result, also from
//     another thread during destroy and after a new communicator took the freed handle's place;
//   - mncl_wait (-1, or a timeout too long for the clock) and mncl_test polling end once the
//     operation's own timeout has passed, never hang, never end at once.
#include <gtest/gtest.h>
#include <mncl/mncl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kTimeoutMs = 500;
// Generous on a loaded machine; the operations end after about 0.6 s (timeout + grace).
constexpr double kBoundSeconds = 5.0;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class NativeAsync : public ::testing::Test {
 protected:
  void SetUp() override {
    // One rank with the in-process store, whatever the launcher set.
    for (const char *v : {"MNCL_RANK", "MNCL_STORE", "MNCL_LOCAL_RANK", "MNCL_LOCAL_SIZE", "RANK",
                          "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
      unsetenv(v);
    }
    setenv("MNCL_SIZE", "1", 1);
    unsetenv("MNCL_MOCK_IGNORE_ABORT");
    comm_ = create();
    ASSERT_NE(comm_, nullptr);
  }
  void TearDown() override {
    unsetenv("MNCL_MOCK_IGNORE_ABORT");
    if (comm_ != nullptr) {
      EXPECT_EQ(mncl_comm_destroy(comm_), MNCL_OK) << mncl_last_error();
    }
  }

  static mncl_comm_t create() {
    mncl_config_t config = MNCL_CONFIG_INIT;
    config.backend = MNCL_MOCK_STUCK_PLUGIN;
    config.timeout_ms = kTimeoutMs;
    mncl_comm_t comm = nullptr;
    EXPECT_EQ(mncl_comm_create(&config, &comm), MNCL_OK) << mncl_last_error();
    return comm;
  }

  mncl_request_t post() {
    mncl_request_t req = nullptr;
    EXPECT_EQ(mncl_iallreduce(comm_, a_, b_, 4, MNCL_FLOAT32, MNCL_SUM, nullptr, &req), MNCL_OK)
        << mncl_last_error();
    return req;
  }

  // Destroys comm_, which must succeed within the bound.
  void destroy() {
    const auto start = Clock::now();
    EXPECT_EQ(mncl_comm_destroy(comm_), MNCL_OK) << mncl_last_error();
    comm_ = nullptr;
    EXPECT_LT(seconds_since(start), kBoundSeconds) << "mncl_comm_destroy";
  }

  mncl_comm_t comm_ = nullptr;
  std::atomic<bool> done_{false};  // WaitsWithoutALimit...: the wait returned
  float a_[4] = {1, 2, 3, 4}, b_[4] = {0, 0, 0, 0};
};

// A message must name the operation (the non-blocking call that started it) and say what ended
// it.
void expect_message(const std::string &message, const char *what) {
  EXPECT_NE(message.find("mncl_iallreduce #"), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

TEST_F(NativeAsync, DestroyAbortsTheBackendThenAnswersTheRequest) {
  mncl_request_t req = post();
  ASSERT_NE(req, nullptr);
  const auto start = Clock::now();
  destroy();
  // Not at once: the operation had its timeout to end.
  EXPECT_GE(seconds_since(start), kTimeoutMs / 1000.0 * 0.9);
  // A new communicator first, which may take the freed handle's address: the request still
  // answers for its own operation.
  comm_ = create();
  EXPECT_EQ(mncl_wait(req, -1), MNCL_ERR_TIMEOUT);
  const std::string message = mncl_last_error();
  expect_message(message, "aborted the backend's communicator");
  EXPECT_NE(message.find("stuck: the communicator was aborted"), std::string::npos) << message;
}

TEST_F(NativeAsync, DestroyGivesUpWhenTheBackendIgnoresItsAbort) {
  setenv("MNCL_MOCK_IGNORE_ABORT", "1", 1);
  mncl_request_t req = post();
  ASSERT_NE(req, nullptr);
  destroy();
  int done = 0;
  EXPECT_EQ(mncl_test(req, &done), MNCL_ERR_TIMEOUT);
  EXPECT_EQ(done, 1);
  expect_message(mncl_last_error(), "abandoned");
}

// mncl_comm_abort on a backend that ignores it: a wait on a posted operation ends with
// MNCL_ERR_ABORTED a grace (at most 1 s) after the abort. It once waited out the operation's
// whole timeout (here 10 minutes) and then reported a timeout.
TEST_F(NativeAsync, AbortEndsAWaitOnABackendThatIgnoresIt) {
  ASSERT_EQ(mncl_comm_destroy(comm_), MNCL_OK) << mncl_last_error();
  comm_ = nullptr;
  setenv("MNCL_MOCK_IGNORE_ABORT", "1", 1);
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = MNCL_MOCK_STUCK_PLUGIN;
  config.timeout_ms = 600000;
  ASSERT_EQ(mncl_comm_create(&config, &comm_), MNCL_OK) << mncl_last_error();
  mncl_request_t req = post();
  ASSERT_NE(req, nullptr);
  std::thread aborter([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mncl_comm_abort(comm_);
  });
  EXPECT_EQ(mncl_wait(req, -1), MNCL_ERR_ABORTED);
  expect_message(mncl_last_error(), "mncl_comm_abort was called");
  aborter.join();
  destroy();  // while the mock still ignores aborts (it then frees what it holds)
}

// A bounded wait returns MNCL_ERR_TIMEOUT both when it runs out of time (the request stays
// pending) and when the operation itself timed out (the request is complete and freed). The
// caller tells them apart with mncl_test, which refuses a freed handle for good: handles are
// never reused (a later request once got the freed one's address, and a stale wait completed
// it, returning garbage as a success).
TEST_F(NativeAsync, ACompletedRequestsHandleIsNeverReused) {
  mncl_request_t req = post();
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(mncl_wait(req, 1), MNCL_ERR_TIMEOUT);  // the wait's own limit
  int done = 0;
  EXPECT_EQ(mncl_test(req, &done), MNCL_OK) << "still pending";
  EXPECT_EQ(done, 0);
  EXPECT_EQ(mncl_wait(req, 60000), MNCL_ERR_TIMEOUT);  // now the operation's (500 ms + grace)
  expect_message(mncl_last_error(), "timeout");
  EXPECT_EQ(mncl_test(req, &done), MNCL_ERR_INVALID_ARGUMENT) << "freed";
  EXPECT_NE(std::string(mncl_last_error()).find("not pending"), std::string::npos);
  // Later requests (on a new communicator: this one was aborted) never take its handle.
  destroy();
  comm_ = create();
  std::vector<mncl_request_t> later;
  for (int i = 0; i < 50; ++i) {
    later.push_back(post());
    EXPECT_NE(later.back(), req);
  }
  destroy();  // ends them all (the backend's abort)
  for (mncl_request_t r : later) EXPECT_EQ(mncl_wait(r, -1), MNCL_ERR_TIMEOUT);
}

// Two threads on one request: the second is refused while the first waits (it once freed the
// request under the first: a double free).
TEST_F(NativeAsync, ASecondThreadOnARequestIsRefused) {
  mncl_request_t req = post();
  ASSERT_NE(req, nullptr);
  std::thread waiter([req] { EXPECT_EQ(mncl_wait(req, -1), MNCL_ERR_TIMEOUT); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int done = 0;
  const mncl_status_t second = mncl_test(req, &done);
  // Refused while the waiter holds it; "not pending" if the waiter had already finished.
  EXPECT_EQ(second, MNCL_ERR_INVALID_ARGUMENT);
  const std::string message = mncl_last_error();
  EXPECT_TRUE(message.find("another thread") != std::string::npos ||
              message.find("not pending") != std::string::npos)
      << message;
  waiter.join();
}

TEST_F(NativeAsync, WaitsWithoutALimitEndAtTheOperationsTimeout) {
  // -1 and timeouts too long for the clock: until the operation ends, which the core bounds.
  for (const int64_t timeout : {int64_t{-1}, INT64_MAX, int64_t{9300000000000}}) {
    SCOPED_TRACE("mncl_wait(" + std::to_string(timeout) + " ms)");
    mncl_request_t req = post();
    ASSERT_NE(req, nullptr);
    // A hang fails instead of blocking the suite: the abort ends the wait.
    std::thread guard([this, stop = Clock::now() + std::chrono::seconds(20)] {
      while (Clock::now() < stop && !done_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!done_.load()) mncl_comm_abort(comm_);
    });
    const auto start = Clock::now();
    const mncl_status_t st = mncl_wait(req, timeout);
    const double took = seconds_since(start);
    done_.store(true);
    guard.join();
    done_.store(false);
    EXPECT_EQ(st, MNCL_ERR_TIMEOUT) << mncl_last_error();
    expect_message(mncl_last_error(), "aborted the backend's communicator");
    EXPECT_GE(took, kTimeoutMs / 1000.0 * 0.9);
    EXPECT_LT(took, kBoundSeconds);
    // The backend's communicator was aborted: a fresh one for the next round.
    EXPECT_EQ(mncl_comm_destroy(comm_), MNCL_OK) << mncl_last_error();
    comm_ = create();
    ASSERT_NE(comm_, nullptr);
  }
}

TEST_F(NativeAsync, PollingWithTestEndsAtTheOperationsTimeout) {
  mncl_request_t req = post();
  ASSERT_NE(req, nullptr);
  const auto start = Clock::now();
  int done = 0;
  mncl_status_t st = MNCL_OK;
  while (!done && seconds_since(start) < 20) {
    st = mncl_test(req, &done);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(done, 1) << "mncl_test polled for 20 s";
  EXPECT_EQ(st, MNCL_ERR_TIMEOUT) << mncl_last_error();
  EXPECT_LT(seconds_since(start), kBoundSeconds);
}

TEST_F(NativeAsync, WaitOnAnotherThreadDuringDestroy) {
  mncl_request_t req = post();
  ASSERT_NE(req, nullptr);
  mncl_status_t waited = MNCL_OK;
  std::string message;
  std::thread waiter([&] {
    waited = mncl_wait(req, -1);
    message = mncl_last_error();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the waiter is polling
  destroy();
  waiter.join();
  EXPECT_EQ(waited, MNCL_ERR_TIMEOUT) << message;
  expect_message(message, "aborted the backend's communicator");
}

}  // namespace

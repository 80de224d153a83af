// A plugin that breaks the plugin ABI at run time (the mock "misbehave",
// tests/loader/mock_plugin.c with MOCK_MISBEHAVES, as MNCL_MOCK_MISBEHAVE says): an exception
// escaping init or execute, a status that is no mncl_status_t, MNCL_IN_PROGRESS from a blocking
// entry, a failure without a message. Through the public API, one rank, blocking and
// non-blocking: each is a clear error naming the backend and the entry, never a crash (a throw
// from a lane's thread ended the process with std::terminate), never a status the application
// cannot read (-1; MNCL_IN_PROGRESS from mncl_allreduce, which reads as "keep waiting").
#include <gtest/gtest.h>
#include <mncl/mncl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

class Misbehaving : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char *v : {"MNCL_RANK", "MNCL_STORE", "MNCL_LOCAL_RANK", "MNCL_LOCAL_SIZE", "RANK",
                          "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
      unsetenv(v);
    }
    setenv("MNCL_SIZE", "1", 1);
  }
  void TearDown() override { unsetenv("MNCL_MOCK_MISBEHAVE"); }

  static mncl_config_t config(const char *backend) {
    mncl_config_t c = MNCL_CONFIG_INIT;
    c.backend = backend;
    c.timeout_ms = 20000;
    return c;
  }

  // Runs one allreduce blocking and one non-blocking, each on a fresh communicator of the mock
  // that misbehaves as `how`; each must fail with `status` and a message containing `words`.
  // breaks: the entry threw, which leaves the backend's state unknown: the communicator is
  // then unusable (MNCL_ERR_INTERNAL quoting why); else it goes on.
  void expect_failure(const char *how, mncl_status_t status, const std::string &words,
                      bool breaks = false) {
    SCOPED_TRACE(how);
    setenv("MNCL_MOCK_MISBEHAVE", how, 1);
    for (const bool blocking : {true, false}) {
      SCOPED_TRACE(blocking ? "blocking" : "non-blocking");
      const mncl_config_t c = config(MNCL_MISBEHAVING_PLUGIN);
      mncl_comm_t comm = nullptr;
      ASSERT_EQ(mncl_comm_create(&c, &comm), MNCL_OK) << mncl_last_error();
      std::vector<float> send(16, 1.0f), recv(16, 0.0f);
      if (blocking) {
        EXPECT_EQ(mncl_allreduce(comm, send.data(), recv.data(), send.size(), MNCL_FLOAT32,
                                 MNCL_SUM, nullptr),
                  status);
        EXPECT_CONTAINS(mncl_last_error(), "mncl_allreduce #0 on misbehave");
      } else {
        mncl_request_t request = nullptr;
        ASSERT_EQ(mncl_iallreduce(comm, send.data(), recv.data(), send.size(), MNCL_FLOAT32,
                                  MNCL_SUM, nullptr, &request),
                  MNCL_OK)
            << mncl_last_error();
        EXPECT_EQ(mncl_wait(request, -1), status);
      }
      EXPECT_CONTAINS(mncl_last_error(), words);
      // A barrier (which the mock leaves alone): a communicator still, or unusable, saying why.
      if (breaks) {
        EXPECT_EQ(mncl_barrier(comm, nullptr), MNCL_ERR_INTERNAL);
        EXPECT_CONTAINS(mncl_last_error(), "the communicator is unusable: " + words);
      } else {
        EXPECT_EQ(mncl_barrier(comm, nullptr), MNCL_OK) << mncl_last_error();
      }
      EXPECT_EQ(mncl_comm_destroy(comm), MNCL_OK) << mncl_last_error();
    }
  }
};

TEST_F(Misbehaving, AStdExceptionFromExecuteIsAnInternalErrorNamingTheBackend) {
  expect_failure("throws", MNCL_ERR_INTERNAL,
                 "backend 'misbehave': execute threw a C++ exception (vector::_M_range_check), "
                 "which the plugin ABI forbids",
                 true);
}

TEST_F(Misbehaving, AnyOtherExceptionFromExecuteEndsNoProcess) {
  expect_failure("throws_int", MNCL_ERR_INTERNAL,
                 "backend 'misbehave': execute threw a C++ exception that is no std::exception",
                 true);
}

TEST_F(Misbehaving, AStatusOutsideTheEnumIsAnInternalError) {
  expect_failure("minus_one", MNCL_ERR_INTERNAL,
                 "backend 'misbehave': execute returned -1, which is no final mncl_status_t");
}

TEST_F(Misbehaving, InProgressFromABlockingEntryIsAnInternalError) {
  expect_failure("in_progress", MNCL_ERR_INTERNAL,
                 "backend 'misbehave': execute returned 10, which is no final mncl_status_t");
}

TEST_F(Misbehaving, AFailureWithoutAMessageSaysSo) {
  expect_failure("silent", MNCL_ERR_REMOTE,
                 "(no message: the backend set none with host->set_error)");
}

// A posted operation whose test() throws (a backend with MNCL_CAP_NATIVE_ASYNC): given up on at
// once with MNCL_ERR_INTERNAL, not tested again and again until a "timeout" it never had.
TEST_F(Misbehaving, AThrowingTestAbandonsTheOperationAsAnInternalError) {
  setenv("MNCL_MOCK_MISBEHAVE", "test_throws", 1);
  const mncl_config_t c = config(MNCL_MISBEHAVING_ASYNC_PLUGIN);
  mncl_comm_t comm = nullptr;
  ASSERT_EQ(mncl_comm_create(&c, &comm), MNCL_OK) << mncl_last_error();
  std::vector<float> send(16, 1.0f), recv(16, 0.0f);
  mncl_request_t request = nullptr;
  ASSERT_EQ(mncl_iallreduce(comm, send.data(), recv.data(), send.size(), MNCL_FLOAT32, MNCL_SUM,
                            nullptr, &request),
            MNCL_OK)
      << mncl_last_error();
  EXPECT_EQ(mncl_wait(request, -1), MNCL_ERR_INTERNAL);
  EXPECT_CONTAINS(mncl_last_error(),
                  "backend 'misbehaveasync': test threw a C++ exception (handle table "
                  "corrupted), which the plugin ABI forbids");
  EXPECT_CONTAINS(mncl_last_error(), "abandoned, the backend may still use its buffers");
  EXPECT_EQ(mncl_barrier(comm, nullptr), MNCL_ERR_INTERNAL);
  EXPECT_CONTAINS(mncl_last_error(), "the communicator is unusable");
  // The mock's comm_destroy reports the operation it still holds (the core gave up on it).
  EXPECT_EQ(mncl_comm_destroy(comm), MNCL_ERR_INTERNAL);
  EXPECT_CONTAINS(mncl_last_error(), "comm_destroy with 1 posted operation(s) pending");
}

// The watchdog aborts an operation past its timeout; a backend that goes on regardless holds
// the caller, and is named for it (the first warning only said the watchdog aborted).
TEST_F(Misbehaving, ABackendThatIgnoresTheAbortIsNamed) {
  setenv("MNCL_MOCK_MISBEHAVE", "ignores_abort", 1);
  mncl_config_t c = config(MNCL_MISBEHAVING_PLUGIN);
  c.timeout_ms = 1000;  // the follow-up warning comes 1 s after the abort, the mock ends 3 s after
  mncl_comm_t comm = nullptr;
  ASSERT_EQ(mncl_comm_create(&c, &comm), MNCL_OK) << mncl_last_error();
  std::vector<float> send(16, 1.0f), recv(16, 0.0f);
  ::testing::internal::CaptureStderr();
  const mncl_status_t st =
      mncl_allreduce(comm, send.data(), recv.data(), send.size(), MNCL_FLOAT32, MNCL_SUM, nullptr);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(st, MNCL_ERR_TIMEOUT) << mncl_last_error();
  EXPECT_CONTAINS(err, "still runs");
  EXPECT_CONTAINS(err,
                  "after the watchdog aborted the backend's communicator: backend 'misbehave' "
                  "does not end its operations on comm_abort");
  EXPECT_EQ(mncl_comm_destroy(comm), MNCL_OK) << mncl_last_error();
}

TEST_F(Misbehaving, AThrowingInitMakesOnlyThatPluginUnusable) {
  setenv("MNCL_MOCK_MISBEHAVE", "init_throws", 1);
  // Named: the creation fails, naming the plugin and what it did.
  mncl_config_t c = config(MNCL_MISBEHAVING_PLUGIN);
  mncl_comm_t comm = nullptr;
  EXPECT_EQ(mncl_comm_create(&c, &comm), MNCL_ERR_PLUGIN);
  EXPECT_CONTAINS(mncl_last_error(),
                  "init() refused with MNCL_ERR_INTERNAL: backend 'misbehave': init threw a C++ "
                  "exception (device 3 not found)");
  // Under auto, in a folder of the path beside naive (the build tree's plugins are found too):
  // it is passed over (every auto job failed, naming no plugin, before).
  const char *plugins = std::getenv("MNCL_PLUGIN_PATH");
  ASSERT_NE(plugins, nullptr);
  char dir_template[] = "/tmp/mncl-misbehave-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string naive = std::string(plugins) + "/libmncl-naive.so";
  ASSERT_EQ(symlink(naive.c_str(), (dir + "/libmncl-naive.so").c_str()), 0) << naive;
  ASSERT_EQ(symlink(MNCL_MISBEHAVING_PLUGIN, (dir + "/libmncl-misbehave.so").c_str()), 0);
  const std::string saved = plugins;
  setenv("MNCL_PLUGIN_PATH", dir.c_str(), 1);
  c = config("auto");
  EXPECT_EQ(mncl_comm_create(&c, &comm), MNCL_OK) << mncl_last_error();
  if (comm != nullptr) {
    const char *name = nullptr;
    EXPECT_EQ(mncl_comm_backend(comm, &name), MNCL_OK);
    EXPECT_STRNE(name, "misbehave");
    EXPECT_EQ(mncl_comm_destroy(comm), MNCL_OK) << mncl_last_error();
  }
  setenv("MNCL_PLUGIN_PATH", saved.c_str(), 1);
  unlink((dir + "/libmncl-naive.so").c_str());
  unlink((dir + "/libmncl-misbehave.so").c_str());
  rmdir(dir.c_str());
}

}  // namespace

// The scaffolding of an SPMD GoogleTest binary run under mncl-run (or mpirun): every rank runs
// every test, in the same order, on one world communicator made before the first test. Rank 0
// prints GoogleTest's usual output; the other ranks only their failures and a summary line.
//
//   int main(int argc, char **argv) {
//     ::testing::InitGoogleTest(&argc, argv);
//     spmd::install_spmd();
//     return RUN_ALL_TESTS();
//   }
//   ... spmd::world() in the tests ...
#ifndef MNCL_TESTS_FRONTENDS_SPMD_GTEST_HPP
#define MNCL_TESTS_FRONTENDS_SPMD_GTEST_HPP

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "mncl/frontends/communicator.hpp"

namespace spmd {

// The world communicator of the running tests (nullptr outside them).
inline mncl::Communicator *&world_pointer() {
  static mncl::Communicator *world = nullptr;
  return world;
}
inline mncl::Communicator &world() {
  return *world_pointer();
}

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    comm_ = std::make_unique<mncl::Communicator>();
    world_pointer() = comm_.get();
  }
  void TearDown() override {
    world_pointer() = nullptr;
    comm_->destroy();
    comm_.reset();
  }

 private:
  std::unique_ptr<mncl::Communicator> comm_;
};

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is kept here: OnTestPartResult runs under GoogleTest's own lock, so asking
  // UnitTest::current_test_info() there deadlocks.
  void OnTestStart(const ::testing::TestInfo &info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (!r.failed()) return;
    std::printf("[  FAILED  ] rank %d: %s\n%s:%d: %s\n", rank_, test_.c_str(),
                r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stdout);
  }
  void OnTestProgramEnd(const ::testing::UnitTest &u) override {
    std::printf("rank %d: %d tests, %d passed, %d failed\n", rank_, u.test_to_run_count(),
                u.successful_test_count(), u.failed_test_count());
    std::fflush(stdout);
  }

 private:
  int rank_;
  std::string test_;
};

// The launcher's rank of this process (before any communicator exists), else 0.
inline int launcher_rank() {
  for (const char *name : {"MNCL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char *value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

// Call after ::testing::InitGoogleTest: the world for the tests, quiet ranks but rank 0.
inline void install_spmd() {
  ::testing::AddGlobalTestEnvironment(new WorldEnvironment);
  const int rank = launcher_rank();
  if (rank != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
}

}  // namespace spmd

#endif  // MNCL_TESTS_FRONTENDS_SPMD_GTEST_HPP

// mncl_comm_split_type and mncl_comm_split_config across real processes (MNCL_1.4).
//
// Started by mncl-run (or mpirun) with MNCL_SPLIT_TEST_RANKS_PER_HOST=M: ranks r*M .. r*M+M-1
// pose as host r through MNCL_HOSTID (mncl-run --ranks-per-host M); 0: every rank on one host.
// Every rank checks the groups it lands in against that layout, with exact integer data, and
// that a wrong call fails on every rank alike while the parent keeps working.
#include <gtest/gtest.h>
#include <mncl/mncl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

mncl_comm_t g_world = nullptr;
int g_rank = 0, g_size = 1, g_per_host = 1;
std::string g_expect_auto_host;  // the backend "auto" must give a one-host group ("" = any)

#define MNCL_OK_OR_FAIL(call) ASSERT_EQ((call), MNCL_OK) << #call << ": " << mncl_last_error()

// World ranks sharing my host / my position on a host, in world order.
std::vector<int> host_members(int rank) {
  std::vector<int> out;
  for (int r = 0; r < g_size; ++r)
    if (r / g_per_host == rank / g_per_host) out.push_back(r);
  return out;
}
std::vector<int> cross_host_members(int rank) {
  std::vector<int> out;
  for (int r = 0; r < g_size; ++r)
    if (r % g_per_host == rank % g_per_host) out.push_back(r);
  return out;
}

// The world ranks of `sub`'s members in its rank order (an allgather), and a sum check.
void expect_group(mncl_comm_t sub, const std::vector<int> &members) {
  ASSERT_NE(sub, nullptr);
  int rank = -1, size = -1;
  MNCL_OK_OR_FAIL(mncl_comm_rank(sub, &rank));
  MNCL_OK_OR_FAIL(mncl_comm_size(sub, &size));
  ASSERT_EQ(size, static_cast<int>(members.size()));
  EXPECT_EQ(members[rank], g_rank);
  const int32_t mine = g_rank;
  std::vector<int32_t> all(members.size(), -1);
  MNCL_OK_OR_FAIL(mncl_allgather(sub, &mine, all.data(), 1, MNCL_INT32, nullptr));
  EXPECT_EQ(std::vector<int>(all.begin(), all.end()), members);
  int64_t value = 1000 + g_rank, sum = 0, want = 0;
  for (int r : members) want += 1000 + r;
  MNCL_OK_OR_FAIL(mncl_allreduce(sub, &value, &sum, 1, MNCL_INT64, MNCL_SUM, nullptr));
  EXPECT_EQ(sum, want);
}

std::string backend_of(mncl_comm_t comm) {
  const char *name = nullptr;
  EXPECT_EQ(mncl_comm_backend(comm, &name), MNCL_OK);
  return name ? name : "";
}

// The failed call's message names what was wrong.
void expect_last_error_mentions(const std::string &text) {
  const std::string message = mncl_last_error();
  EXPECT_NE(message.find(text), std::string::npos) << "'" << text << "' not in: " << message;
}

// The parent is still in step after a failed split.
void expect_world_usable() {
  int32_t one = 1, total = 0;
  ASSERT_EQ(mncl_allreduce(g_world, &one, &total, 1, MNCL_INT32, MNCL_SUM, nullptr), MNCL_OK)
      << mncl_last_error();
  EXPECT_EQ(total, g_size);
}

TEST(SplitType, HostGroupsKeepTheParentsBackend) {
  mncl_comm_t host = nullptr;
  MNCL_OK_OR_FAIL(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_HOST, 0, nullptr, &host));
  expect_group(host, host_members(g_rank));
  EXPECT_EQ(backend_of(host), backend_of(g_world));
  MNCL_OK_OR_FAIL(mncl_comm_destroy(host));
}

// mncl_comm_host_info (MNCL_1.5) tells, without a collective, what the host split gives: this
// rank's place on its host, the host's size, the host's number, and how many hosts.
TEST(SplitType, HostInfoAgreesWithTheHostSplit) {
  int local_rank = -1, local_size = -1, host_index = -1, num_hosts = -1;
  MNCL_OK_OR_FAIL(mncl_comm_host_info(g_world, &local_rank, &local_size, &host_index, &num_hosts));
  const std::vector<int> host = host_members(g_rank);
  EXPECT_EQ(local_rank,
            static_cast<int>(std::find(host.begin(), host.end(), g_rank) - host.begin()));
  EXPECT_EQ(local_size, static_cast<int>(host.size()));
  EXPECT_EQ(host_index, g_rank / g_per_host);
  EXPECT_EQ(num_hosts, (g_size + g_per_host - 1) / g_per_host);
  // Each pointer may be NULL.
  int only = -1;
  MNCL_OK_OR_FAIL(mncl_comm_host_info(g_world, nullptr, nullptr, nullptr, &only));
  EXPECT_EQ(only, num_hosts);
  MNCL_OK_OR_FAIL(mncl_comm_host_info(g_world, nullptr, nullptr, nullptr, nullptr));
  // The same answer as the host split's rank and size.
  mncl_comm_t split = nullptr;
  MNCL_OK_OR_FAIL(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_HOST, 0, nullptr, &split));
  int rank = -1, size = -1;
  MNCL_OK_OR_FAIL(mncl_comm_rank(split, &rank));
  MNCL_OK_OR_FAIL(mncl_comm_size(split, &size));
  EXPECT_EQ(rank, local_rank);
  EXPECT_EQ(size, local_size);
  // On the host group itself: one host, this rank's place in it.
  int sub_rank = -1, sub_size = -1, sub_host = -1, sub_hosts = -1;
  MNCL_OK_OR_FAIL(mncl_comm_host_info(split, &sub_rank, &sub_size, &sub_host, &sub_hosts));
  EXPECT_EQ(sub_rank, rank);
  EXPECT_EQ(sub_size, size);
  EXPECT_EQ(sub_host, 0);
  EXPECT_EQ(sub_hosts, 1);
  MNCL_OK_OR_FAIL(mncl_comm_destroy(split));
  // A destroyed handle is refused.
  EXPECT_EQ(mncl_comm_host_info(split, &only, nullptr, nullptr, nullptr),
            MNCL_ERR_INVALID_ARGUMENT);
}

TEST(SplitType, CrossHostGroupsOneRankPerHost) {
  mncl_comm_t cross = nullptr;
  MNCL_OK_OR_FAIL(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_CROSS_HOST, 0, nullptr, &cross));
  expect_group(cross, cross_host_members(g_rank));
  MNCL_OK_OR_FAIL(mncl_comm_destroy(cross));
}

// key reverses the order inside each host group.
TEST(SplitType, KeyOrdersTheGroup) {
  mncl_comm_t host = nullptr;
  MNCL_OK_OR_FAIL(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_HOST, -g_rank, nullptr, &host));
  std::vector<int> members = host_members(g_rank);
  std::reverse(members.begin(), members.end());
  expect_group(host, members);
  MNCL_OK_OR_FAIL(mncl_comm_destroy(host));
}

// ChainerMN's hierarchical layout: the host groups on the backend "auto" picks for one host
// (shm where it is built), the hosts' first ranks on the parent's backend, both used at once.
TEST(SplitType, HostGroupsOnAutoAndLeadersOnTheParentsBackend) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = "auto";
  mncl_comm_t host = nullptr, cross = nullptr;
  MNCL_OK_OR_FAIL(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_HOST, 0, &config, &host));
  MNCL_OK_OR_FAIL(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_CROSS_HOST, 0, nullptr, &cross));
  if (!g_expect_auto_host.empty()) {
    EXPECT_EQ(backend_of(host), g_expect_auto_host);
  }
  EXPECT_EQ(backend_of(cross), backend_of(g_world));
  // reduce to the host's first rank, allreduce across hosts, bcast within the host.
  const std::vector<int> local = host_members(g_rank);
  int32_t value = 3 * g_rank + 1, host_sum = 0;
  MNCL_OK_OR_FAIL(mncl_reduce(host, &value, &host_sum, 1, MNCL_INT32, MNCL_SUM, 0, nullptr));
  int32_t total = 0;
  if (g_rank == local.front()) {
    MNCL_OK_OR_FAIL(mncl_allreduce(cross, &host_sum, &total, 1, MNCL_INT32, MNCL_SUM, nullptr));
  }
  MNCL_OK_OR_FAIL(mncl_bcast(host, &total, 1, MNCL_INT32, 0, nullptr));
  EXPECT_EQ(total, 3 * g_size * (g_size - 1) / 2 + g_size);
  MNCL_OK_OR_FAIL(mncl_comm_destroy(cross));
  MNCL_OK_OR_FAIL(mncl_comm_destroy(host));
}

TEST(SplitConfig, NamedBackendAndParentsBackendSideBySide) {
  // Even world ranks on naive, odd ones on the parent's backend.
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = "naive";
  const int color = g_rank % 2;
  mncl_comm_t sub = nullptr;
  MNCL_OK_OR_FAIL(mncl_comm_split_config(g_world, color, 0, color == 0 ? &config : nullptr, &sub));
  std::vector<int> members;
  for (int r = color; r < g_size; r += 2) members.push_back(r);
  expect_group(sub, members);
  EXPECT_EQ(backend_of(sub), color == 0 ? std::string("naive") : backend_of(g_world));
  MNCL_OK_OR_FAIL(mncl_comm_destroy(sub));
  // MNCL_SPLIT_NONE gives NULL, also with a config.
  mncl_comm_t none = reinterpret_cast<mncl_comm_t>(&g_rank);
  MNCL_OK_OR_FAIL(
      mncl_comm_split_config(g_world, g_rank == 0 ? MNCL_SPLIT_NONE : 1, 0, &config, &none));
  if (g_rank == 0) {
    EXPECT_EQ(none, nullptr);
  } else {
    std::vector<int> rest;
    for (int r = 1; r < g_size; ++r) rest.push_back(r);
    expect_group(none, rest);
    MNCL_OK_OR_FAIL(mncl_comm_destroy(none));
  }
}

// The child's own timeout: a receive nobody sends ends in MNCL_ERR_TIMEOUT after 3 s, while
// the world (MNCL_TIMEOUT=20 in the tests) would wait 20 s (and a receive that outlives its
// timeout is also what the plugins' own checks report: the status tells the two apart).
TEST(SplitConfig, OwnTimeout) {
  if (g_size < 2) GTEST_SKIP() << "needs a peer";
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.timeout_ms = 3000;
  mncl_comm_t sub = nullptr;
  MNCL_OK_OR_FAIL(mncl_comm_split_config(g_world, 0, 0, &config, &sub));
  if (g_rank == 0) {
    int32_t never = 0;
    EXPECT_EQ(mncl_recv(sub, &never, 1, MNCL_INT32, 1, nullptr), MNCL_ERR_TIMEOUT)
        << mncl_last_error();
  }
  // The peers keep the communicator up until rank 0's wait ended (a closing gloo peer would
  // end it early, as a lost connection).
  ASSERT_EQ(mncl_barrier(g_world, nullptr), MNCL_OK) << mncl_last_error();
  (void)mncl_comm_abort(sub);  // no rank waits for the others to leave a broken communicator
  (void)mncl_comm_destroy(sub);
  expect_world_usable();
}

// A rank's mistake fails the split on every rank (naming it); the parent stays usable.
TEST(SplitErrors, OneRanksBadConfigFailsEveryRank) {
  mncl_config_t bad = MNCL_CONFIG_INIT;
  bad.rank = 5;
  mncl_comm_t sub = reinterpret_cast<mncl_comm_t>(&g_rank);
  const mncl_status_t st =
      mncl_comm_split_config(g_world, 0, 0, g_rank == g_size - 1 ? &bad : nullptr, &sub);
  EXPECT_EQ(st, MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(sub, nullptr);
  const std::string message = mncl_last_error();
  EXPECT_NE(message.find("rank " + std::to_string(g_size - 1) + ": "), std::string::npos)
      << message;
  EXPECT_NE(message.find("config.rank"), std::string::npos) << message;
  expect_world_usable();

  mncl_config_t bad_magic = MNCL_CONFIG_INIT;
  bad_magic.magic = 0;
  EXPECT_EQ(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_HOST, 0, &bad_magic, &sub),
            MNCL_ERR_INVALID_ARGUMENT);
  mncl_config_t bad_store = MNCL_CONFIG_INIT;
  bad_store.bootstrap = "tcp://127.0.0.1:1";
  EXPECT_EQ(mncl_comm_split_config(g_world, 0, 0, &bad_store, &sub), MNCL_ERR_INVALID_ARGUMENT);
  expect_last_error_mentions("config.bootstrap");
  EXPECT_EQ(mncl_comm_split_type(g_world, static_cast<mncl_split_type_t>(7), 0, nullptr, &sub),
            MNCL_ERR_INVALID_ARGUMENT);
  expect_last_error_mentions("type 7");
  EXPECT_EQ(mncl_comm_split_type(g_world, static_cast<mncl_split_type_t>(-1), 0, nullptr, &sub),
            MNCL_ERR_INVALID_ARGUMENT);  // not taken for a split by color
  expect_last_error_mentions("type -1");
  // A newer caller's config with a non-zero field this library does not know: that rank's
  // status (MNCL_ERR_NOT_SUPPORTED, as mncl_comm_create gives) on every rank.
  struct {
    mncl_config_t known;
    uint64_t newer_field;
  } newer = {MNCL_CONFIG_INIT, 1};
  newer.known.struct_size = sizeof newer;
  EXPECT_EQ(mncl_comm_split_config(g_world, 0, 0, g_rank == 0 ? &newer.known : nullptr, &sub),
            MNCL_ERR_NOT_SUPPORTED)
      << mncl_last_error();
  EXPECT_EQ(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_HOST, 0, nullptr, nullptr),
            MNCL_ERR_INVALID_ARGUMENT);
  expect_last_error_mentions("newcomm is NULL");
  expect_world_usable();
}

// One rank passing no newcomm fails the split on every rank, naming it, at once (before, that
// rank alone refused it: the others timed out, and the ranks' split numbers then differed, so
// the next split paired up stale records); the next split works.
TEST(SplitErrors, OneRanksNullNewcommFailsEveryRank) {
  mncl_comm_t sub = reinterpret_cast<mncl_comm_t>(&g_rank);
  const bool last = g_rank == g_size - 1;
  EXPECT_EQ(mncl_comm_split(g_world, 0, 0, last ? nullptr : &sub), MNCL_ERR_INVALID_ARGUMENT);
  expect_last_error_mentions("rank " + std::to_string(g_size - 1) +
                             ": mncl_comm_split: newcomm is NULL");
  if (!last) {
    EXPECT_EQ(sub, nullptr);
  }
  ASSERT_EQ(mncl_comm_split(g_world, 0, g_size - g_rank, &sub), MNCL_OK) << mncl_last_error();
  std::vector<int> reversed;
  for (int r = g_size - 1; r >= 0; --r) reversed.push_back(r);
  expect_group(sub, reversed);
  EXPECT_EQ(mncl_comm_destroy(sub), MNCL_OK) << mncl_last_error();
  expect_world_usable();
}

TEST(SplitErrors, RanksSplittingDifferentlyFailEveryRank) {
  if (g_size < 2) GTEST_SKIP() << "needs two ranks";
  mncl_comm_t sub = nullptr;
  const mncl_split_type_t type = g_rank == 0 ? MNCL_SPLIT_TYPE_HOST : MNCL_SPLIT_TYPE_CROSS_HOST;
  EXPECT_EQ(mncl_comm_split_type(g_world, type, 0, nullptr, &sub), MNCL_ERR_INVALID_ARGUMENT);
  expect_last_error_mentions(
      "MNCL_SPLIT_TYPE_CROSS_HOST, rank 0 by "
      "MNCL_SPLIT_TYPE_HOST");
  expect_world_usable();
}

TEST(SplitErrors, GroupDisagreeingOnTheBackendFails) {
  if (g_size < 2) GTEST_SKIP() << "needs two ranks";
  mncl_config_t naive = MNCL_CONFIG_INIT;
  naive.backend = "naive";
  mncl_comm_t sub = nullptr;
  EXPECT_EQ(mncl_comm_split_config(g_world, 0, 0, g_rank == 0 ? &naive : nullptr, &sub),
            MNCL_ERR_INVALID_ARGUMENT);
  expect_last_error_mentions("disagree on the backend");
  expect_world_usable();
  mncl_config_t longer = MNCL_CONFIG_INIT;
  longer.timeout_ms = 30000;
  EXPECT_EQ(mncl_comm_split_config(g_world, 0, 0, g_rank == 0 ? &longer : nullptr, &sub),
            MNCL_ERR_INVALID_ARGUMENT);
  expect_last_error_mentions(
      "disagree on config.timeout_ms: rank 0 passes "
      "30000, rank 1 -1");
  expect_world_usable();
}

TEST(SplitErrors, UnknownBackendFailsTheGroup) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = "no-such-backend";
  mncl_comm_t sub = nullptr;
  EXPECT_EQ(mncl_comm_split_type(g_world, MNCL_SPLIT_TYPE_HOST, 0, &config, &sub), MNCL_ERR_PLUGIN);
  expect_last_error_mentions("no-such-backend");
  EXPECT_EQ(sub, nullptr);
  expect_world_usable();
}

// Under mpirun, a flat group of some of the job's processes split from a parent on another
// backend: flat cannot start MPI for part of a job (MPI_Init waits for every process), so that
// group is refused at once while the other group (the parent's backend) is made.
TEST(SplitErrors, FlatGroupOfANonFlatParentIsRefused) {
  if (std::getenv("MNCL_SPLIT_TEST_FLAT_GROUP") == nullptr || g_size < 2) {
    GTEST_SKIP() << "only under mpirun with MNCL_SPLIT_TEST_FLAT_GROUP=1 (tests/flat)";
  }
  ASSERT_NE(backend_of(g_world), "flat");
  mncl_config_t flat = MNCL_CONFIG_INIT;
  flat.backend = "flat";
  const int color = g_rank % 2;
  mncl_comm_t sub = nullptr;
  const mncl_status_t st =
      mncl_comm_split_config(g_world, color, 0, color == 0 ? &flat : nullptr, &sub);
  if (color == 0) {
    EXPECT_EQ(st, MNCL_ERR_PLUGIN);
    expect_last_error_mentions("cannot start MPI");
  } else {
    ASSERT_EQ(st, MNCL_OK) << mncl_last_error();
    std::vector<int> members;
    for (int r = 1; r < g_size; r += 2) members.push_back(r);
    expect_group(sub, members);
    MNCL_OK_OR_FAIL(mncl_comm_destroy(sub));
  }
  expect_world_usable();
  // "auto" for groups of part of the job gives them gloo, shm or naive, never flat (which would
  // refuse them as above), also as an item of a list.
  for (const char *spec : {"auto", " auto , gloo"}) {
    SCOPED_TRACE(spec);
    mncl_config_t automatic = MNCL_CONFIG_INIT;
    automatic.backend = spec;
    MNCL_OK_OR_FAIL(mncl_comm_split_config(g_world, color, 0, &automatic, &sub));
    EXPECT_NE(backend_of(sub), "flat");
    std::vector<int> members;
    for (int r = color; r < g_size; r += 2) members.push_back(r);
    expect_group(sub, members);
    MNCL_OK_OR_FAIL(mncl_comm_destroy(sub));
  }
}

// A communicator of every rank (a split of the world: a second job-wide one cannot share the
// world's TCP store address), on naive, with its own timeout.
mncl_comm_t all_ranks(int64_t timeout_ms) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = "naive";
  config.timeout_ms = timeout_ms;
  mncl_comm_t comm = nullptr;
  EXPECT_EQ(mncl_comm_split_config(g_world, 0, g_rank, &config, &comm), MNCL_OK)
      << mncl_last_error();
  return comm;
}

// An abort of the parent while the split creates the new communicator's backend fails the
// split with MNCL_ERR_ABORTED on that rank (before, it returned the new communicator once the
// backend was made, or timed out waiting for it): rank 0's backend (the slow mock) marks its
// creation, during which another thread aborts the parent.
TEST(Abort, AbortDuringTheSplitsBackendCreationFailsTheSplit) {
  const char *slow = std::getenv("MNCL_SPLIT_TEST_SLOW_PLUGIN");
  if (slow == nullptr || *slow == '\0') GTEST_SKIP() << "the slow mock plugin is not built";
  mncl_comm_t parent = all_ranks(60000);
  ASSERT_NE(parent, nullptr);
  char dir[] = "/tmp/mncl-split-abort-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string marker = std::string(dir) + "/creating";
  const std::string release = std::string(dir) + "/aborted";
  if (g_rank == 0) {
    // The mock's creation waits until the abort has come (at most 60 s).
    setenv("MNCL_MOCK_CREATE_MARKER", marker.c_str(), 1);
    setenv("MNCL_MOCK_CREATE_RELEASE", release.c_str(), 1);
    setenv("MNCL_MOCK_CREATE_DELAY_MS", "60000", 1);
  }
  std::thread aborter;
  if (g_rank == 0) {
    aborter = std::thread([parent, marker, release] {
      for (int i = 0; i < 60000 && access(marker.c_str(), F_OK) != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      mncl_comm_abort(parent);
      std::ofstream(release) << "aborted\n";
    });
  }
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = slow;
  mncl_comm_t sub = nullptr;
  const mncl_status_t st = mncl_comm_split_config(parent, 0, 0, &config, &sub);
  const std::string message = st == MNCL_OK ? "" : mncl_last_error();
  if (aborter.joinable()) aborter.join();
  unsetenv("MNCL_MOCK_CREATE_MARKER");
  unsetenv("MNCL_MOCK_CREATE_RELEASE");
  unsetenv("MNCL_MOCK_CREATE_DELAY_MS");
  if (g_rank == 0) {
    EXPECT_EQ(st, MNCL_ERR_ABORTED) << message;
    EXPECT_NE(message.find("aborted during the split"), std::string::npos) << message;
    EXPECT_EQ(sub, nullptr);
  } else {
    EXPECT_EQ(st, MNCL_OK) << message;  // their own backend communicators were made
  }
  if (sub != nullptr) {
    EXPECT_EQ(mncl_comm_destroy(sub), MNCL_OK) << mncl_last_error();
  }
  (void)mncl_comm_destroy(parent);
  std::remove(marker.c_str());
  std::remove(release.c_str());
  rmdir(dir);
  expect_world_usable();
}

// A rank that aborted a communicator and destroys it still tells rank 0 it has left: rank 0's
// destroy returns at once instead of waiting the communicator's timeout for it (ten minutes
// here, past the test's limit).
TEST(Abort, ARankThatAbortedDoesNotHoldUpTheOthersDestroy) {
  if (g_size < 2) GTEST_SKIP() << "needs two ranks";
  mncl_comm_t comm = all_ranks(600000);
  ASSERT_NE(comm, nullptr);
  if (g_rank != 0) {
    EXPECT_EQ(mncl_comm_abort(comm), MNCL_OK);
  }
  EXPECT_EQ(mncl_comm_destroy(comm), MNCL_OK) << mncl_last_error();
  expect_world_usable();
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char *m = std::getenv("MNCL_SPLIT_TEST_RANKS_PER_HOST")) g_per_host = std::atoi(m);
  if (const char *b = std::getenv("MNCL_SPLIT_TEST_AUTO_HOST")) g_expect_auto_host = b;
  if (mncl_comm_create(nullptr, &g_world) != MNCL_OK) {
    std::fprintf(stderr, "split_test: mncl_comm_create: %s\n", mncl_last_error());
    return 1;
  }
  mncl_comm_rank(g_world, &g_rank);
  mncl_comm_size(g_world, &g_size);
  if (g_per_host <= 0) g_per_host = g_size;
  if (g_rank != 0) {  // one rank prints the report; every rank's failures still fail the run
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  const mncl_status_t st = mncl_comm_destroy(g_world);
  if (st != MNCL_OK) std::fprintf(stderr, "split_test: destroy: %s\n", mncl_last_error());
  return failed != 0 || st != MNCL_OK ? 1 : 0;
}

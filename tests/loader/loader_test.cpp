// White-box tests of the plugin loader against the mock plugins and bad files in the test-only
// folder MNCL_MOCK_PLUGIN_DIR (see CMakeLists.txt). main() points MNCL_PLUGIN_PATH there.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/filesystem.hpp>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/coll.h"  // the plugin kit's descriptor builders
#include "common/error.h"
#include "common/log.h"
#include "core/comm.h"
#include "core/launch_env.h"
#include "core/selection.h"
#include "loader/plugin_abi.h"
#include "loader/plugin_loader.h"
#include "mncl_plugin_v6_test.h"

namespace mncl::loader {
namespace {

// The hypothetical v6 only appends: its v5 part must match v5 field for field.
static_assert(offsetof(mncl_plugin_v6_test_t, base) == 0);
static_assert(offsetof(mncl_plugin_v6_test_t, comm_shrink) == sizeof(mncl_plugin_v5_t));
static_assert(MNCL_PLUGIN_ABI_V6_TEST == MNCL_PLUGIN_ABI_V5 + 1);
// The core's table is v5 today; the adapter tests below fill one.
static_assert(std::is_same_v<abi::Table, mncl_plugin_v5_t>);
static_assert(abi::kNewest == MNCL_PLUGIN_ABI_V5);

// The mocks' coll_mask (mock_plugin.c): every v1 kind but send/recv, plus v3's two kinds in
// their v3 tables, v4's batch kind too in their v4 tables, and v5's gatherv and scatterv too in
// their v5 (and v6) tables.
constexpr uint32_t kMockColls =
    MNCL_COLL_MASK_ALL_V1 & ~(MNCL_COLL_BIT(MNCL_COLL_SEND) | MNCL_COLL_BIT(MNCL_COLL_RECV));
constexpr uint32_t kV3Kinds =
    MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV);
static_assert(kV3Kinds == ((1u << 12) | (1u << 13)));
constexpr uint32_t kV4Kind = MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH);
static_assert(kV4Kind == (1u << 14));
static_assert(MNCL_COLL_MASK_ALL_V4 == (MNCL_COLL_MASK_ALL_V3 | kV4Kind));
constexpr uint32_t kV5Kinds = MNCL_COLL_BIT(MNCL_COLL_GATHERV) | MNCL_COLL_BIT(MNCL_COLL_SCATTERV);
static_assert(kV5Kinds == ((1u << 15) | (1u << 16)));
static_assert(MNCL_COLL_MASK_ALL_V5 == (MNCL_COLL_MASK_ALL_V4 | kV5Kinds));

const std::string kMockDir = MNCL_MOCK_PLUGIN_DIR;

std::string mock_path(const std::string &name) {
  return kMockDir + "/libmncl-" + name + ".so";
}

std::string events_path() {
  return std::string(MNCL_LOADER_TEST_TMP) + "/events." + std::to_string(getpid());
}

// Lines "<name> init" / "<name> finalize" the mocks appended, for one mock name.
std::vector<std::string> events(const std::string &name) {
  std::vector<std::string> out;
  std::ifstream in(events_path());
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, name.size() + 1, name + " ") == 0)
      out.push_back(line.substr(name.size() + 1));
  }
  return out;
}
void clear_events() {
  std::ofstream(events_path(), std::ios::trunc);
}

// Whether the dynamic linker still has the file mapped (RTLD_NOLOAD never loads).
bool is_mapped(const std::string &path) {
  void *handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected to find: " << (needle) << "\n                 in: " << (haystack)

// Runs f, which must throw mncl::Error; returns its message.
template <class F>
std::string error_of(F f, mncl_status_t expected = MNCL_ERR_PLUGIN) {
  try {
    f();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), expected) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no mncl::Error thrown";
  return {};
}

const PluginReport *find_report(const std::vector<PluginReport> &reports, const std::string &path) {
  for (const auto &r : reports) {
    if (r.path == path) return &r;
  }
  return nullptr;
}

// ----------------------------------------------------------------------------------------------
// Every bad variant is refused, with the reason, by path, by name and in discover().

struct Refusal {
  std::string file;    // libmncl-<file>.so in the mock folder
  std::string reason;  // expected substring
};

void PrintTo(const Refusal &r, std::ostream *os) {
  *os << r.file;
}

std::vector<Refusal> refusals() {
  return {
      {"text", "not an ELF file (starts with \"This is not"},
      {"empty", "not an ELF file (empty file)"},
      {"elf32", sizeof(void *) == 8 ? "32-bit ELF (ELFCLASS32) but this process is 64-bit"
                                    : "64-bit ELF (ELFCLASS64) but this process is 32-bit"},
      {"foreign", ") but this process is "},
      {"truncated", "dlopen failed: "},
      {"dir", "not a regular file"},
      {"nosym", "no mncl_plugin_v1..mncl_plugin_v16 symbol exported"},
      {"v6only", "offers plugin ABI v6 only; this core supports v1..v5"},
      {"badabi", "mncl_plugin_v1 declares abi_version 7 but the symbol name promises 1"},
      {"v2badabi", "mncl_plugin_v2 declares abi_version 1 but the symbol name promises 2"},
      {"badmagic", "mncl_plugin_v1 has magic 0xdeadbeef, expected 0x504c4e4d"},
      {"small", format("mncl_plugin_v1 struct_size %zu is smaller than mncl_plugin_v1_t (%zu "
                       "bytes)",
                       offsetof(mncl_plugin_v1_t, execute), sizeof(mncl_plugin_v1_t))},
      {"initfail",
       "init() refused with MNCL_ERR_NOT_SUPPORTED: mock driver missing (built "
       "with MOCK_INIT_FAILS)"},
      {"nomem", "capability mismatch: no memory type"},
      {"nocoll", "capability mismatch: coll_mask 0x0 has no collective"},
      {"noexec", "missing mandatory functions: execute"},
      {"halfasync", "advertises MNCL_CAP_NATIVE_ASYNC but post or test is NULL"},
      {"misnamed", "table name 'other' differs from the file name 'misnamed'"},
  };
}

class RefusedPlugin : public ::testing::TestWithParam<Refusal> {};

TEST_P(RefusedPlugin, ByPath) {
  const std::string path = mock_path(GetParam().file);
  const std::string message = error_of([&] { load(path); });
  EXPECT_CONTAINS(message, "cannot load plugin " + path + ": ");
  EXPECT_CONTAINS(message, GetParam().reason);
  EXPECT_FALSE(is_mapped(path));  // a refused plugin does not stay loaded
}

TEST_P(RefusedPlugin, ByName) {
  const std::string message = error_of([&] { load(GetParam().file); });
  EXPECT_CONTAINS(message, "backend '" + GetParam().file + "' (" + mock_path(GetParam().file));
  EXPECT_CONTAINS(message, GetParam().reason);
}

TEST_P(RefusedPlugin, InDiscover) {
  const auto reports = discover();
  const PluginReport *r = find_report(reports, mock_path(GetParam().file));
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->loaded);
  EXPECT_EQ(r->plugin, nullptr);
  EXPECT_EQ(r->name, GetParam().file);
  EXPECT_CONTAINS(r->reason, GetParam().reason);
}

// The first refusal of a file in this process is logged at warn, naming the file and the
// reason; a later one of the same file for the same reason only at info (every communicator's
// creation searches the folders again), while the error still carries the reason. The file is
// copied to a folder of its own first: the tests above have met the mock folder's already.
TEST_P(RefusedPlugin, LoggedAtWarnOnceWithFileAndReason) {
  if (log::level() < log::kWarn) GTEST_SKIP() << "MNCL_DEBUG hides warnings";
  const std::string dir = std::string(MNCL_LOADER_TEST_TMP) + "/warned." +
                          std::to_string(getpid()) + "." + GetParam().file;
  ASSERT_EQ(system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "' && cp -R '" +
                    mock_path(GetParam().file) + "' '" + dir + "/'")
                       .c_str()),
            0);
  const std::string path = dir + "/libmncl-" + GetParam().file + ".so";
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(load(path), Error);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(err, " WARN ");
  EXPECT_CONTAINS(err, "skipping plugin " + path + ": ");
  EXPECT_CONTAINS(err, GetParam().reason);
  ::testing::internal::CaptureStderr();
  EXPECT_CONTAINS(error_of([&] { load(path); }), GetParam().reason);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find(" WARN "), std::string::npos) << err;
  ASSERT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, RefusedPlugin, ::testing::ValuesIn(refusals()),
                         [](const auto &info) { return info.param.file; });

// ----------------------------------------------------------------------------------------------
// Good plugins

TEST(Loader, GoodMockLoadsByName) {
  auto p = load("mock");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name(), "mock");
  EXPECT_EQ(p->path(), mock_path("mock"));
  EXPECT_EQ(p->abi_version(), 1u);
  // Adapted to the core's (newest) table; abi_version() keeps what the plugin was built for.
  const abi::Table &t = p->table();
  EXPECT_EQ(t.struct_size, sizeof(abi::Table));
  EXPECT_EQ(t.magic, MNCL_PLUGIN_MAGIC);
  EXPECT_EQ(t.abi_version, MNCL_PLUGIN_ABI_V1);
  EXPECT_STREQ(t.version, "0.0.1-test (mock)");
  EXPECT_EQ(t.caps, MNCL_CAP_HOST_MEMORY);
  EXPECT_EQ(t.comm_split, nullptr);
}

// A one-rank communicator of a mock plugin's table (the mocks serve one rank unless built with
// MOCK_ANY_SIZE).
mncl_status_t create_single_rank(const abi::Table &t, void **comm) {
  mncl_bootstrap_v1_t bs = {};
  bs.struct_size = sizeof bs;
  bs.size = 1;
  return t.comm_create(&bs, comm);
}

// A p2p-lanes mock that exports only the table of `version` loads with that version's facts.
void expect_loaded_as(const char *name, uint32_t version, size_t struct_size, uint32_t colls) {
  auto p = load(name);
  EXPECT_EQ(p->name(), name);
  EXPECT_EQ(p->abi_version(), version);
  const abi::Table &t = p->table();
  EXPECT_EQ(t.struct_size, struct_size);
  EXPECT_EQ(t.abi_version, version);
  EXPECT_EQ(t.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(t.coll_mask, colls);
  EXPECT_EQ(std::string(t.version), std::string("0.0.1-test (") + name + ")");
}

TEST(Loader, GoodMockProbesAndRunsASingleRankAllreduce) {
  auto p = load("mock");
  const abi::Table &t = p->table();

  mncl_probe_v1_t info = {sizeof info, 1, 1, 1, 0, 0, 0};
  int32_t score = -1;
  char reason[128] = "";
  ASSERT_EQ(t.probe(&info, &score, reason, sizeof reason), MNCL_OK);
  EXPECT_GT(score, 0);
  info.size = 4;
  ASSERT_EQ(t.probe(&info, &score, reason, sizeof reason), MNCL_OK);
  EXPECT_EQ(score, 0);
  EXPECT_STREQ(reason, "mock serves single-rank jobs only");

  void *comm = nullptr;
  ASSERT_EQ(create_single_rank(t, &comm), MNCL_OK);
  int32_t in[3] = {1, 2, 3}, out[3] = {};
  mncl_coll_v1_t coll = {};
  coll.struct_size = sizeof coll;
  coll.kind = MNCL_COLL_ALLREDUCE;
  coll.dtype = MNCL_INT32;
  coll.op = MNCL_SUM;
  coll.root = -1;
  coll.sendbuf = in;
  coll.recvbuf = out;
  coll.count = 3;
  ASSERT_EQ(t.execute(comm, &coll), MNCL_OK);
  EXPECT_EQ(out[2], 3);
  EXPECT_EQ(t.comm_destroy(comm), MNCL_OK);

  // A size the mock cannot serve: refused through host->set_error.
  mncl_bootstrap_v1_t bs = {};
  bs.struct_size = sizeof bs;
  bs.size = 2;
  set_last_error("");
  EXPECT_EQ(t.comm_create(&bs, &comm), MNCL_ERR_NOT_SUPPORTED);
  EXPECT_CONTAINS(last_error(), "only size 1 is supported");
}

TEST(Loader, NoopMockLoads) {
  auto p = load(mock_path("noop"));
  EXPECT_EQ(p->name(), "noop");
  mncl_bootstrap_v1_t bs = {};
  bs.size = 8;
  void *comm = nullptr;
  ASSERT_EQ(p->table().comm_create(&bs, &comm), MNCL_OK);
  mncl_coll_v1_t coll = {};
  coll.kind = MNCL_COLL_BARRIER;
  EXPECT_EQ(p->table().execute(comm, &coll), MNCL_OK);
  EXPECT_EQ(p->table().comm_destroy(comm), MNCL_OK);
}

TEST(Loader, V2OnlyPluginLoadsWithItsConcurrentP2pCapability) {
  expect_loaded_as("v2only", 2, sizeof(mncl_plugin_v2_t), kMockColls);
}

TEST(Loader, V3OnlyPluginLoadsWithItsV3Kinds) {
  expect_loaded_as("v3only", 3, sizeof(mncl_plugin_v3_t), kMockColls | kV3Kinds);
}

TEST(Loader, V3OnlyPluginRunsASingleRankAllgathervAndAlltoallv) {
  // The descriptor as mncl_plugin_v3.h lays it out: counts = recvcounts, displs (allgatherv)
  // and sendcounts, sdispls, recvcounts, rdispls (alltoallv), one entry per rank.
  auto p = load("v3only");
  const abi::Table &t = p->table();
  void *comm = nullptr;
  ASSERT_EQ(create_single_rank(t, &comm), MNCL_OK);

  int32_t in[3] = {7, 8, 9};
  int32_t out[6] = {-1, -1, -1, -1, -1, -1};
  const size_t gv_counts[2] = {3, 2};  // recvcounts[0], displs[0]
  mncl_coll_v1_t coll =
      mncl::kit::make_v_coll(MNCL_COLL_ALLGATHERV, MNCL_INT32, in, out, 3, 1, gv_counts);
  ASSERT_EQ(t.execute(comm, &coll), MNCL_OK);
  EXPECT_EQ(std::vector<int32_t>(out, out + 6), (std::vector<int32_t>{-1, -1, 7, 8, 9, -1}));

  std::fill(out, out + 6, -1);
  const size_t av_counts[4] = {2, 1, 2, 3};  // sendcounts, sdispls, recvcounts, rdispls
  coll.kind = MNCL_COLL_ALLTOALLV;
  coll.count = 0;
  coll.counts = av_counts;
  coll.seq = 1;
  ASSERT_EQ(t.execute(comm, &coll), MNCL_OK);
  EXPECT_EQ(std::vector<int32_t>(out, out + 6), (std::vector<int32_t>{-1, -1, -1, 8, 9, -1}));
  EXPECT_EQ(t.comm_destroy(comm), MNCL_OK);
}

TEST(Loader, V4OnlyPluginLoadsWithItsBatchKind) {
  expect_loaded_as("v4only", 4, sizeof(mncl_plugin_v4_t), kMockColls | kV3Kinds | kV4Kind);
}

TEST(Loader, V4OnlyPluginTakesAnEmptyBatchAndRefusesABadOne) {
  // The descriptor as mncl_plugin_v4.h lays it out (kit::make_batch_coll): at one rank only an
  // empty batch is possible, since every peer must differ from the rank.
  auto p = load("v4only");
  const abi::Table &t = p->table();
  void *comm = nullptr;
  ASSERT_EQ(create_single_rank(t, &comm), MNCL_OK);
  clear_events();
  mncl_coll_v1_t coll = mncl::kit::make_batch_coll(nullptr, 0);
  EXPECT_EQ(coll.kind, MNCL_COLL_SENDRECV_BATCH);
  ASSERT_EQ(t.execute(comm, &coll), MNCL_OK) << last_error();
  EXPECT_EQ(events("v4only"), std::vector<std::string>{"batch rank 0: empty"});
  // An op to the rank itself, which the core never hands over: the mock says so.
  int32_t x = 0;
  const mncl_p2p_v4_t self = {MNCL_COLL_SEND, 0, MNCL_INT32, 0, &x, 1, 0};
  coll = mncl::kit::make_batch_coll(&self, 1);
  set_last_error("");
  EXPECT_EQ(t.execute(comm, &coll), MNCL_ERR_INTERNAL);
  EXPECT_CONTAINS(last_error(), "batch op 0 breaks what the core promises");
  EXPECT_EQ(t.comm_destroy(comm), MNCL_OK);
}

TEST(Loader, V5OnlyPluginLoadsWithItsGathervAndScattervKinds) {
  expect_loaded_as("v5only", 5, sizeof(mncl_plugin_v5_t),
                   kMockColls | kV3Kinds | kV4Kind | kV5Kinds);
}

TEST(Loader, V5OnlyPluginRunsASingleRankGathervAndScatterv) {
  // The descriptors as mncl_plugin_v5.h lays them out (kit::make_rooted_v_coll): on the root,
  // counts = recvcounts (sendcounts), then displs, one entry per rank.
  auto p = load("v5only");
  const abi::Table &t = p->table();
  void *comm = nullptr;
  ASSERT_EQ(create_single_rank(t, &comm), MNCL_OK);
  clear_events();

  int32_t in[3] = {7, 8, 9};
  int32_t out[6] = {-1, -1, -1, -1, -1, -1};
  const size_t arrays[2] = {3, 2};  // counts[0], displs[0]
  mncl_coll_v1_t coll =
      mncl::kit::make_rooted_v_coll(MNCL_COLL_GATHERV, MNCL_INT32, in, out, 3, 0, 1, arrays);
  EXPECT_EQ(coll.nbufs, 1u);
  EXPECT_EQ(coll.op, -1);
  ASSERT_EQ(t.execute(comm, &coll), MNCL_OK) << last_error();
  EXPECT_EQ(std::vector<int32_t>(out, out + 6), (std::vector<int32_t>{-1, -1, 7, 8, 9, -1}));
  // In place: the block is already at recvbuf + displs[root].
  coll.sendbuf = out + 2;
  coll.seq = 1;
  ASSERT_EQ(t.execute(comm, &coll), MNCL_OK) << last_error();
  EXPECT_EQ(std::vector<int32_t>(out, out + 6), (std::vector<int32_t>{-1, -1, 7, 8, 9, -1}));

  // scatterv: the root's block at sendbuf + displs[0] lands in recvbuf.
  const int32_t blocks[6] = {0, 0, 4, 5, 6, 0};
  int32_t got[4] = {-1, -1, -1, -1};
  coll =
      mncl::kit::make_rooted_v_coll(MNCL_COLL_SCATTERV, MNCL_INT32, blocks, got, 3, 0, 1, arrays);
  coll.seq = 2;
  ASSERT_EQ(t.execute(comm, &coll), MNCL_OK) << last_error();
  EXPECT_EQ(std::vector<int32_t>(got, got + 4), (std::vector<int32_t>{4, 5, 6, -1}));
  EXPECT_EQ(events("v5only"), (std::vector<std::string>{"gatherv rank 0 root 0 count 3",
                                                        "gatherv rank 0 root 0 count 3 in place",
                                                        "scatterv rank 0 root 0 count 3"}));

  // What the core never hands over: the root without its arrays, a count that is not
  // counts[root], a root out of range. The mock says so and records nothing.
  clear_events();
  coll.counts = nullptr;
  set_last_error("");
  EXPECT_EQ(t.execute(comm, &coll), MNCL_ERR_INTERNAL);
  EXPECT_CONTAINS(last_error(), "SCATTERV descriptor not laid out as mncl_plugin_v5.h says");
  coll.counts = arrays;
  coll.count = 2;
  EXPECT_EQ(t.execute(comm, &coll), MNCL_ERR_INTERNAL);
  coll.count = 3;
  coll.root = 1;
  EXPECT_EQ(t.execute(comm, &coll), MNCL_ERR_INTERNAL);
  coll = mncl::kit::make_rooted_v_coll(MNCL_COLL_GATHERV, MNCL_INT32, in, out, 3, 0, 1, arrays);
  coll.nbufs = 2;
  set_last_error("");
  EXPECT_EQ(t.execute(comm, &coll), MNCL_ERR_INTERNAL);
  EXPECT_CONTAINS(last_error(), "GATHERV descriptor not laid out as mncl_plugin_v5.h says");
  EXPECT_TRUE(events("v5only").empty());
  EXPECT_EQ(t.comm_destroy(comm), MNCL_OK);
}

TEST(Loader, NewestKnownVersionWinsWhenSeveralAreExported) {
  // v1 + v2: the v2 table, told apart from the v1 copy by MNCL_CAP_CONCURRENT_P2P, which only
  // the v2 table carries (as with the plugin kit's as_v1).
  auto p = load("v1v2");
  EXPECT_EQ(p->abi_version(), 2u);
  EXPECT_EQ(p->table().abi_version, MNCL_PLUGIN_ABI_V2);
  EXPECT_EQ(p->table().caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(p->table().coll_mask, kMockColls);
  // v2 + v3: the v3 table, told apart from the v2 copy by v3's kinds, which only it carries.
  auto p23 = load("v2v3");
  EXPECT_EQ(p23->abi_version(), 3u);
  EXPECT_EQ(p23->table().abi_version, MNCL_PLUGIN_ABI_V3);
  EXPECT_EQ(p23->table().caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(p23->table().coll_mask, kMockColls | kV3Kinds);
  // v3 + v4: the v4 table, told apart from the v3 copy by the batch kind, which only it carries.
  auto p34 = load("v3v4");
  EXPECT_EQ(p34->abi_version(), 4u);
  EXPECT_EQ(p34->table().abi_version, MNCL_PLUGIN_ABI_V4);
  EXPECT_EQ(p34->table().caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(p34->table().coll_mask, kMockColls | kV3Kinds | kV4Kind);
}

TEST(Loader, NewerUnknownVersionIsPassedOverForTheNewestKnownOne) {
  // v5 + hypothetical v6: v5, cut to the v5 table, with v5's kinds; v1 + v6 (no v2..v5): v1,
  // whose table can promise neither concurrency nor a later kind.
  auto p56 = load("v5v6");
  EXPECT_EQ(p56->abi_version(), 5u);
  EXPECT_EQ(p56->table().abi_version, MNCL_PLUGIN_ABI_V5);
  EXPECT_EQ(p56->table().struct_size, sizeof(abi::Table));
  EXPECT_EQ(p56->table().caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(p56->table().coll_mask, kMockColls | kV3Kinds | kV4Kind | kV5Kinds);
  auto p16 = load("v1v6");
  EXPECT_EQ(p16->abi_version(), 1u);
  EXPECT_EQ(p16->table().abi_version, MNCL_PLUGIN_ABI_V1);
  EXPECT_EQ(p16->table().caps, MNCL_CAP_HOST_MEMORY);
  EXPECT_EQ(p16->table().coll_mask, kMockColls);
}

TEST(Loader, V1TableLosesTheV2OnlyCapabilityBit) {
  // Bit 4 means nothing in v1: a v1 plugin setting it must not get concurrent execute() calls.
  auto p = load("v1p2p");
  EXPECT_EQ(p->abi_version(), 1u);
  EXPECT_EQ(p->table().caps, MNCL_CAP_HOST_MEMORY);
  EXPECT_EQ(p->table().caps & (1ull << 4), 0u);
  const auto reports = discover();
  const PluginReport *r = find_report(reports, mock_path("v1p2p"));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->loaded) << r->reason;
  EXPECT_EQ(r->caps, MNCL_CAP_HOST_MEMORY);  // what mncl-info shows
}

TEST(Loader, V2TableLosesTheV3Kinds) {
  // Bits 12 and 13 mean nothing in v2: a v2 plugin setting them is never handed ALLGATHERV or
  // ALLTOALLV (the core answers MNCL_ERR_NOT_SUPPORTED instead).
  auto p = load("v2allv");
  EXPECT_EQ(p->abi_version(), 2u);
  EXPECT_EQ(p->table().coll_mask, kMockColls);
  EXPECT_EQ(p->table().coll_mask & kV3Kinds, 0u);
  const auto reports = discover();
  const PluginReport *r = find_report(reports, mock_path("v2allv"));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->loaded) << r->reason;
  EXPECT_EQ(r->coll_mask, kMockColls);  // what mncl-info shows
}

TEST(Loader, V3TableLosesTheV4Kind) {
  // Bit 14 means nothing in v3: a v3 plugin setting it is never handed a SENDRECV_BATCH (the
  // core runs a batch as sends and receives instead, or refuses it when those are missing too).
  auto p = load("v3batch");
  EXPECT_EQ(p->abi_version(), 3u);
  EXPECT_EQ(p->table().coll_mask, kMockColls | kV3Kinds);
  EXPECT_EQ(p->table().coll_mask & kV4Kind, 0u);
  const auto reports = discover();
  const PluginReport *r = find_report(reports, mock_path("v3batch"));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->loaded) << r->reason;
  EXPECT_EQ(r->coll_mask, kMockColls | kV3Kinds);  // what mncl-info shows
}

TEST(Loader, V4TableLosesTheV5Kinds) {
  // Bits 15 and 16 mean nothing in v4: a v4 plugin setting them is never handed a GATHERV or
  // SCATTERV (the core runs those as an alltoallv instead).
  auto p = load("v4rootedv");
  EXPECT_EQ(p->abi_version(), 4u);
  EXPECT_EQ(p->table().coll_mask, kMockColls | kV3Kinds | kV4Kind);
  EXPECT_EQ(p->table().coll_mask & kV5Kinds, 0u);
  const auto reports = discover();
  const PluginReport *r = find_report(reports, mock_path("v4rootedv"));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->loaded) << r->reason;
  EXPECT_EQ(r->coll_mask, kMockColls | kV3Kinds | kV4Kind);  // what mncl-info shows
  // No other loaded table below v5 shows them either.
  for (const char *older : {"v3only", "v3batch", "v4only", "v3v4", "v2allv", "mock"}) {
    EXPECT_EQ(load(older)->table().coll_mask & kV5Kinds, 0u) << older;
  }
}

TEST(Loader, LargerStructSizeIsCutToTheKnownTable) {
  auto p = load("padded");
  EXPECT_EQ(p->table().struct_size, sizeof(abi::Table));
}

// ----------------------------------------------------------------------------------------------
// Names, paths, search path

TEST(Loader, UnknownNameListsTheAvailableBackends) {
  const std::string message = error_of([] { load("gloooo"); });
  EXPECT_EQ(message.rfind("unknown backend 'gloooo'; available: ", 0), 0u) << message;
  for (const char *good :
       {"mock", "noop", "padded", "v2only", "v1v2", "v1p2p", "v2v3", "v3only", "v2allv", "v4only",
        "v3v4", "v3batch", "v5only", "v4rootedv", "v5v6", "v1v6"}) {
    EXPECT_CONTAINS(message, good);
  }
  for (const char *bad : {"initfail", "text", "v6only", "v2badabi"}) {
    EXPECT_EQ(message.find(std::string(bad) + ","), std::string::npos) << message;
  }
  EXPECT_CONTAINS(message, kMockDir);
}

TEST(Loader, AvailableNamesAreTheLoadableOnes) {
  const auto names = available_names();
  auto has = [&names](const std::string &n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  EXPECT_TRUE(has("mock"));
  EXPECT_TRUE(has("noop"));
  EXPECT_TRUE(has("v2only"));
  EXPECT_TRUE(has("v1v2"));
  EXPECT_TRUE(has("v1p2p"));
  EXPECT_TRUE(has("v2v3"));
  EXPECT_TRUE(has("v3only"));
  EXPECT_TRUE(has("v2allv"));
  EXPECT_TRUE(has("v4only"));
  EXPECT_TRUE(has("v3v4"));
  EXPECT_TRUE(has("v3batch"));
  EXPECT_TRUE(has("v5only"));
  EXPECT_TRUE(has("v4rootedv"));
  EXPECT_TRUE(has("v5v6"));
  EXPECT_TRUE(has("v1v6"));
  EXPECT_FALSE(has("v6only"));
  EXPECT_FALSE(has("v4v5"));  // retired names: no stale file left behind
  EXPECT_FALSE(has("v1v5"));
  EXPECT_FALSE(has("v2badabi"));
  EXPECT_FALSE(has("initfail"));
  EXPECT_FALSE(has("misnamed"));
  EXPECT_FALSE(has("other"));
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST(Loader, EmptyNameIsUnknown) {
  EXPECT_CONTAINS(error_of([] { load(""); }), "unknown backend ''");
}

TEST(Loader, MissingPathIsRefused) {
  EXPECT_CONTAINS(error_of([] { load(kMockDir + "/libmncl-absent.so"); }),
                  "cannot stat: No such file or directory");
}

TEST(Loader, NameAndPathShareOneInstance) {
  auto by_name = load("mock");
  auto by_path = load(mock_path("mock"));
  auto by_odd_path = load(kMockDir + "/../mock_plugins/./libmncl-mock.so");
  EXPECT_EQ(by_name.get(), by_path.get());
  EXPECT_EQ(by_name.get(), by_odd_path.get());
}

// This program links the static core, as mncl-info does: after MNCL_PLUGIN_PATH come the
// install tree's plugin folder relative to its bin folder (<bindir>/../<CMAKE_INSTALL_LIBDIR>/
// mncl/plugins, computed by sdk/CMakeLists.txt), then the build tree's (bin/../lib/mncl/plugins)
// when that differs; never <bindir>/mncl/plugins, which only libmncl.so's rule would give.
TEST(Loader, SearchPathStartsWithThePluginPathThenTheProgramsPluginFolders) {
  const auto dirs = search_path();
  ASSERT_GE(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], kMockDir);
  char exe[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof exe - 1), 0);
  const std::string exe_dir = std::string(exe).substr(0, std::string(exe).rfind('/'));
  const auto normal = [](const std::string &p) {
    return boost::filesystem::path(p).lexically_normal().string();
  };
  const std::string installed = normal(exe_dir + "/" MNCL_PLUGIN_DIR_FROM_BINDIR);
  const std::string built = normal(exe_dir + "/" MNCL_BUILD_PLUGIN_DIR_FROM_BINDIR);
  EXPECT_EQ(dirs[1], installed);
  if (built == installed) {
    EXPECT_EQ(dirs.size(), 2u);
  } else {
    ASSERT_EQ(dirs.size(), 3u);
    EXPECT_EQ(dirs[2], built);
  }
  EXPECT_EQ(built, boost::filesystem::canonical(MNCL_BUILD_DIR).string() + "/lib/mncl/plugins");
  for (const auto &dir : dirs) EXPECT_NE(dir, exe_dir + "/mncl/plugins");
}

// The build folder as named, or with its symbolic links resolved (this program's folder is
// read from /proc/self/exe).
bool in_build_tree(const std::string &path) {
  const std::string build = MNCL_BUILD_DIR;
  const std::string real = boost::filesystem::canonical(build).string();
  return path.rfind(build + "/", 0) == 0 || path.rfind(real + "/", 0) == 0;
}

TEST(Loader, NothingOutsideTheBuildTreeIsSearched) {
  for (const auto &dir : search_path()) EXPECT_TRUE(in_build_tree(dir)) << dir;
  for (const auto &r : discover()) EXPECT_TRUE(in_build_tree(r.path)) << r.path;
}

TEST(Loader, FirstFolderWinsAndEmptyEntriesAreIgnored) {
  // A folder before the mock folder holding another libmncl-mock.so (a link to the same file).
  const std::string first =
      std::string(MNCL_LOADER_TEST_TMP) + "/first." + std::to_string(getpid());
  ASSERT_EQ(system(("rm -rf '" + first + "' && mkdir -p '" + first + "'").c_str()), 0);
  ASSERT_EQ(symlink(mock_path("mock").c_str(), (first + "/libmncl-mock.so").c_str()), 0);
  const std::string saved = getenv("MNCL_PLUGIN_PATH");
  setenv("MNCL_PLUGIN_PATH", ("::" + first + ":" + kMockDir + ":").c_str(), 1);
  {
    EXPECT_EQ(search_path()[0], first);
    EXPECT_EQ(search_path()[1], kMockDir);
    auto p = load("mock");
    EXPECT_EQ(p->path(), first + "/libmncl-mock.so");
    EXPECT_EQ(load(mock_path("mock")).get(), p.get());  // same file: one instance
    const auto reports = discover();
    EXPECT_NE(find_report(reports, first + "/libmncl-mock.so"), nullptr);
    EXPECT_EQ(find_report(reports, mock_path("mock")), nullptr);
  }
  setenv("MNCL_PLUGIN_PATH", saved.c_str(), 1);
  ASSERT_EQ(system(("rm -rf '" + first + "'").c_str()), 0);
}

TEST(Loader, PathNotNamedLikeAPluginTakesTheTableName) {
  // Explicit paths need not follow libmncl-<name>.so; the table's name is used instead.
  const std::string link =
      std::string(MNCL_LOADER_TEST_TMP) + "/custom." + std::to_string(getpid()) + ".so";
  std::remove(link.c_str());
  ASSERT_EQ(symlink(mock_path("mock").c_str(), link.c_str()), 0);
  {
    auto p = load(link);
    EXPECT_EQ(p->name(), "mock");
    EXPECT_EQ(p->path(), link);
    EXPECT_EQ(load("mock").get(), p.get());  // same file underneath: one instance
  }
  std::remove(link.c_str());
}

TEST(Loader, DiscoverReportsEveryFileOnce) {
  const auto reports = discover();
  size_t in_mock_dir = 0;
  for (const auto &r : reports) {
    if (r.path.rfind(kMockDir + "/", 0) != 0) continue;
    ++in_mock_dir;
    EXPECT_EQ(r.loaded, r.reason.empty()) << r.path << ": " << r.reason;
    EXPECT_EQ(r.loaded, r.plugin != nullptr) << r.path;
  }
  // 28 mock variants + 6 bad files.
  EXPECT_EQ(in_mock_dir, 34u);
  const PluginReport *mock = find_report(reports, mock_path("mock"));
  ASSERT_NE(mock, nullptr);
  EXPECT_TRUE(mock->loaded);
  EXPECT_EQ(mock->version, "0.0.1-test (mock)");
  EXPECT_EQ(mock->abi_version, 1u);
  EXPECT_EQ(mock->caps, MNCL_CAP_HOST_MEMORY);
  EXPECT_NE(mock->coll_mask, 0u);
  // A plugin refused after its table was read still shows what it offered.
  const PluginReport *nomem = find_report(reports, mock_path("nomem"));
  ASSERT_NE(nomem, nullptr);
  EXPECT_EQ(nomem->version, "0.0.1-test (nomem)");
  EXPECT_EQ(nomem->abi_version, 1u);
  // The ABI version a plugin was built for, and its v2 capability.
  const PluginReport *v2only = find_report(reports, mock_path("v2only"));
  ASSERT_NE(v2only, nullptr);
  EXPECT_TRUE(v2only->loaded) << v2only->reason;
  EXPECT_EQ(v2only->abi_version, 2u);
  EXPECT_EQ(v2only->caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(v2only->coll_mask, kMockColls);
  const PluginReport *v3only = find_report(reports, mock_path("v3only"));
  ASSERT_NE(v3only, nullptr);
  EXPECT_TRUE(v3only->loaded) << v3only->reason;
  EXPECT_EQ(v3only->abi_version, 3u);
  EXPECT_EQ(v3only->coll_mask, kMockColls | kV3Kinds);
  const PluginReport *v4only = find_report(reports, mock_path("v4only"));
  ASSERT_NE(v4only, nullptr);
  EXPECT_TRUE(v4only->loaded) << v4only->reason;
  EXPECT_EQ(v4only->abi_version, 4u);
  EXPECT_EQ(v4only->coll_mask, kMockColls | kV3Kinds | kV4Kind);
  const PluginReport *v5only = find_report(reports, mock_path("v5only"));
  ASSERT_NE(v5only, nullptr);
  EXPECT_TRUE(v5only->loaded) << v5only->reason;
  EXPECT_EQ(v5only->abi_version, 5u);
  EXPECT_EQ(v5only->coll_mask, kMockColls | kV3Kinds | kV4Kind | kV5Kinds);
  const PluginReport *v6only = find_report(reports, mock_path("v6only"));
  ASSERT_NE(v6only, nullptr);
  EXPECT_FALSE(v6only->loaded);
  const PluginReport *v2badabi = find_report(reports, mock_path("v2badabi"));
  ASSERT_NE(v2badabi, nullptr);
  EXPECT_FALSE(v2badabi->loaded);
  EXPECT_EQ(v2badabi->abi_version, 2u);  // the symbol it was looked up by
}

// ----------------------------------------------------------------------------------------------
// Lifetime: one load shared, finalize + unload after the last reference

TEST(Loader, LoadingTwiceSharesOneInitializedInstance) {
  clear_events();
  ASSERT_FALSE(is_mapped(mock_path("mock")));
  auto a = load("mock");
  auto b = load("mock");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(events("mock"), std::vector<std::string>{"init"});
  EXPECT_TRUE(is_mapped(mock_path("mock")));
}

TEST(Loader, LastReferenceFinalizesAndUnloads) {
  clear_events();
  auto a = load("mock");
  auto b = load(mock_path("mock"));
  a.reset();
  EXPECT_EQ(events("mock"), std::vector<std::string>{"init"});
  EXPECT_TRUE(is_mapped(mock_path("mock")));
  b.reset();
  EXPECT_EQ(events("mock"), (std::vector<std::string>{"init", "finalize"}));
  EXPECT_FALSE(is_mapped(mock_path("mock")));
  // And loads afresh afterwards.
  auto c = load("mock");
  EXPECT_EQ(events("mock"), (std::vector<std::string>{"init", "finalize", "init"}));
}

TEST(Loader, InitFailureIsNotFinalizedAndUnloads) {
  clear_events();
  EXPECT_THROW(load("initfail"), Error);
  EXPECT_EQ(events("initfail"), std::vector<std::string>{"init"});
  EXPECT_FALSE(is_mapped(mock_path("initfail")));
}

TEST(Loader, ConcurrentUsersShareOneLoad) {
  clear_events();
  constexpr int kThreads = 8;
  std::vector<std::shared_ptr<Plugin>> got(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      got[i] = load("mock");
    });
  }
  for (auto &t : threads) t.join();
  for (const auto &p : got) EXPECT_EQ(p.get(), got[0].get());
  EXPECT_EQ(events("mock"), std::vector<std::string>{"init"});
}

TEST(Loader, ConcurrentLoadAndReleaseNeverOverlapInitAndFinalize) {
  clear_events();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([] {
      for (int j = 0; j < 50; ++j) load("mock").reset();
    });
  }
  for (auto &t : threads) t.join();
  const auto ev = events("mock");
  ASSERT_FALSE(ev.empty());
  ASSERT_EQ(ev.size() % 2, 0u);
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i], i % 2 ? "finalize" : "init") << i;
  EXPECT_FALSE(is_mapped(mock_path("mock")));
}

TEST(Loader, RefusedInitKeepsTheCallersLastError) {
  set_last_error("earlier error");
  EXPECT_THROW(load("initfail"), Error);
  EXPECT_STREQ(last_error(), "earlier error");
}

// ----------------------------------------------------------------------------------------------
// Probes that misbehave, and plugins refused at load, in the backend choice (core/selection.h).
// Their mocks live in folders of their own, searched only here.

const std::string kProbeDir = MNCL_PROBE_MOCK_DIR;
const std::string kRefusedDir = MNCL_REFUSED_MOCK_DIR;
const std::string kSettingsDir = MNCL_SETTINGS_MOCK_DIR;

// MNCL_PLUGIN_PATH=<folder> for the scope (the build tree's real plugins stay reachable through
// this program's folder).
class PluginPath {
 public:
  explicit PluginPath(const std::string &folder) : saved_(kMockDir) {
    if (const char *now = getenv("MNCL_PLUGIN_PATH")) saved_ = now;
    setenv("MNCL_PLUGIN_PATH", folder.c_str(), 1);
  }
  ~PluginPath() { setenv("MNCL_PLUGIN_PATH", saved_.c_str(), 1); }

 private:
  std::string saved_;
};

core::LaunchSettings one_rank(const std::string &spec) {
  core::LaunchSettings settings;
  settings.backend_spec = spec;
  settings.memory = "host";
  return settings;
}

const core::ProbeResult *find_probed(const core::Selection &s, const std::string &name) {
  for (const auto &p : s.probed) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

TEST(Probe, ThrowingProbeIsUnusableWithWhatItThrew) {
  auto plugin = load(kProbeDir + "/libmncl-pthrow.so");
  core::ProbeResult r;
  ASSERT_NO_THROW(r = core::probe(*plugin, core::probe_info(one_rank("pthrow"))));
  EXPECT_EQ(r.name, "pthrow");
  EXPECT_EQ(r.score, 0);
  EXPECT_EQ(r.reason, "probe threw: probe of pthrow threw");
}

TEST(Probe, ProbeThrowingWhatIsNotAStdExceptionIsUnusable) {
  auto plugin = load(kProbeDir + "/libmncl-pthrowint.so");
  core::ProbeResult r;
  ASSERT_NO_THROW(r = core::probe(*plugin, core::probe_info(one_rank("pthrowint"))));
  EXPECT_EQ(r.score, 0);
  EXPECT_EQ(r.reason, "probe threw: an exception that is not a std::exception");
}

TEST(Probe, SilentFailureShowsNoEarlierMessageAndKeepsTheCallers) {
  auto plugin = load(kProbeDir + "/libmncl-psilent.so");
  set_last_error("earlier error");
  const core::ProbeResult r = core::probe(*plugin, core::probe_info(one_rank("psilent")));
  EXPECT_EQ(r.score, 0);
  EXPECT_EQ(r.reason, "probe failed: MNCL_ERR_INTERNAL: (no message)");
  EXPECT_STREQ(last_error(), "earlier error");
}

TEST(Probe, ThrowingProbeKeepsTheCallersLastError) {
  auto plugin = load(kProbeDir + "/libmncl-pthrow.so");
  set_last_error("earlier error");
  core::probe(*plugin, core::probe_info(one_rank("pthrow")));
  EXPECT_STREQ(last_error(), "earlier error");
}

TEST(Selection, AutoPassesOverThrowingProbes) {
  PluginPath path(kProbeDir);
  const auto settings = one_rank("auto");
  core::Selection s;
  ASSERT_NO_THROW(s = core::select_backend(settings, core::probe_info(settings)));
  ASSERT_NE(s.plugin, nullptr);
  for (const char *name : {"pthrow", "pthrowint", "psilent"}) {
    const core::ProbeResult *p = find_probed(s, name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->score, 0) << name;
    EXPECT_NE(s.plugin->name(), name);
  }
  EXPECT_EQ(find_probed(s, "pthrow")->reason, "probe threw: probe of pthrow threw");
}

TEST(Selection, NamedThrowingProbesFailWithTheirReasons) {
  PluginPath path(kProbeDir);
  const auto settings = one_rank("pthrow,pthrowint");
  const std::string message =
      error_of([&] { core::select_backend(settings, core::probe_info(settings)); });
  EXPECT_CONTAINS(message, "pthrow: unusable here: probe threw: probe of pthrow threw");
  EXPECT_CONTAINS(message,
                  "pthrowint: unusable here: probe threw: an exception that is not a "
                  "std::exception");
}

TEST(Selection, RefusedPluginNamedByAnOverrideIsReportedWithItsReason) {
  PluginPath path(kRefusedDir);
  auto settings = one_rank("auto");
  settings.backend_host = "undef";
  const std::string message =
      error_of([&] { core::select_backend(settings, core::probe_info(settings)); });
  EXPECT_CONTAINS(message,
                  "MNCL_BACKEND_HOST=undef: nothing in it is usable here; undef refused: "
                  "dlopen failed: " +
                      kRefusedDir +
                      "/libmncl-undef.so: undefined symbol: mncl_mock_missing_symbol");
  EXPECT_EQ(message.find("not installed"), std::string::npos) << message;
}

TEST(Selection, RefusedPluginIsAnUnusableCandidateInAuto) {
  PluginPath path(kRefusedDir);
  const auto settings = one_rank("auto");
  const core::Selection s = core::select_backend(settings, core::probe_info(settings));
  const core::ProbeResult *undef = find_probed(s, "undef");
  ASSERT_NE(undef, nullptr);
  EXPECT_EQ(undef->score, 0);
  EXPECT_EQ(undef->reason.rfind("refused: dlopen failed: ", 0), 0u) << undef->reason;
  ASSERT_NE(s.plugin, nullptr);
  EXPECT_NE(s.plugin->name(), "undef");
}

// Plugin names in another case (MNCL_BACKEND=MOCK, MNCL_BACKEND_HOST=Mock) find the plugin:
// they failed with "unknown backend". An exact match wins (a plugin may be named MyNet).
TEST(Selection, PluginNamesAreMatchedInAnyCase) {
  auto plugin = load("MOCK");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name(), "mock");
  auto settings = one_rank("Mock");
  core::Selection s;
  ASSERT_NO_THROW(s = core::select_backend(settings, core::probe_info(settings)));
  EXPECT_EQ(s.plugin->name(), "mock");
  settings = one_rank("auto");
  settings.backend_host = "MOCK";
  ASSERT_NO_THROW(s = core::select_backend(settings, core::probe_info(settings)));
  EXPECT_EQ(s.plugin->name(), "mock");
}

// A plugin's bad setting of its own (MNCL_SHM_CHUNK=1K) fails the choice with
// MNCL_ERR_INVALID_ARGUMENT naming it: auto used to pass the plugin over and run the job on
// another backend, and a named one fell through to the next of the list.
TEST(Selection, PluginRefusingItsOwnSettingIsAnErrorNotABackendPassedOver) {
  PluginPath path(kSettingsDir);
  setenv("MNCL_MOCK_SETTING", "bad", 1);
  const std::string expected =
      "backend 'badsetting' refused its settings: MNCL_MOCK_SETTING='bad' is not ok; correct "
      "or unset them (" +
      kSettingsDir + "/libmncl-badsetting.so)";
  for (const char *spec : {"auto", "badsetting,naive"}) {
    const auto settings = one_rank(spec);
    const std::string message =
        error_of([&] { core::select_backend(settings, core::probe_info(settings)); },
                 MNCL_ERR_INVALID_ARGUMENT);
    if (std::string(spec) == "auto") {
      EXPECT_EQ(message, expected);
    } else {
      EXPECT_CONTAINS(message, "MNCL_MOCK_SETTING='bad' is not ok");
    }
  }
  // A good value: the plugin loads and auto chooses among the others as before.
  setenv("MNCL_MOCK_SETTING", "ok", 1);
  const auto settings = one_rank("auto");
  core::Selection s;
  ASSERT_NO_THROW(s = core::select_backend(settings, core::probe_info(settings)));
  EXPECT_NE(find_probed(s, "badsetting"), nullptr);
  unsetenv("MNCL_MOCK_SETTING");
}

// A folder of its own (no other test searches it) holding a plugin the loader refuses,
// libmncl-junk.so (not an ELF file), and a link to the good mock, whose init and finalize are
// counted in the events file.
std::string folder_with_a_refused_plugin(const std::string &what) {
  const std::string dir =
      std::string(MNCL_LOADER_TEST_TMP) + "/" + what + "." + std::to_string(getpid());
  EXPECT_EQ(system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  std::ofstream(dir + "/libmncl-junk.so") << "This is not a plugin\n";
  EXPECT_EQ(symlink(mock_path("mock").c_str(), (dir + "/libmncl-mock.so").c_str()), 0);
  return dir;
}

// The lines of err that warn about the refusal of the plugin at path.
size_t refusal_warnings(const std::string &err, const std::string &path) {
  size_t count = 0;
  std::istringstream lines(err);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" WARN ") != std::string::npos &&
        line.find("skipping plugin " + path + ": ") != std::string::npos) {
      ++count;
    }
  }
  return count;
}

size_t count_of(const std::vector<std::string> &items, const std::string &item) {
  return static_cast<size_t>(std::count(items.begin(), items.end(), item));
}

// One backend choice searches the plugin folders once (each search loads and initializes every
// plugin): for its whole list, "auto" and the list of available backends that an unknown name's
// message gives alike. A plugin the loader refuses is warned about once in this process, not
// at every choice, and each choice still reports why it was passed over.
TEST(Selection, OneChoiceSearchesOnceAndARefusalIsWarnedAboutOnce) {
  if (log::level() < log::kWarn) GTEST_SKIP() << "MNCL_DEBUG hides warnings";
  const std::string dir = folder_with_a_refused_plugin("choice");
  const std::string junk = dir + "/libmncl-junk.so";
  PluginPath path(dir);
  const auto settings = one_rank("absent,auto");
  constexpr size_t kChoices = 2;
  std::vector<std::string> refused_because;
  clear_events();
  ::testing::internal::CaptureStderr();
  for (size_t i = 0; i < kChoices; ++i) {
    try {
      // Released before the next choice, which then loads the mock afresh.
      const core::Selection choice = core::select_backend(settings, core::probe_info(settings));
      const core::ProbeResult *refused = find_probed(choice, "junk");
      refused_because.push_back(refused ? refused->reason : "(not among the candidates)");
    } catch (const std::exception &e) {
      ADD_FAILURE() << "choice " << i << ": " << e.what();
    }
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(refusal_warnings(err, junk), 1u) << err;
  EXPECT_EQ(count_of(events("mock"), "init"), kChoices) << "searched more than once";
  ASSERT_EQ(refused_because.size(), kChoices);
  for (const std::string &reason : refused_because) {
    EXPECT_EQ(reason.rfind("refused: not an ELF file", 0), 0u) << reason;
  }
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

// The same through communicators: each creation (the choice and the agreement) searches once,
// and the refusal is warned about at the first creation only.
TEST(Selection, EachCommunicatorCreationSearchesOnceAndARefusalIsWarnedAboutOnce) {
  if (log::level() < log::kWarn) GTEST_SKIP() << "MNCL_DEBUG hides warnings";
  const std::string dir = folder_with_a_refused_plugin("creation");
  const std::string junk = dir + "/libmncl-junk.so";
  PluginPath path(dir);
  const std::string memory = getenv("MNCL_MEMORY") ? getenv("MNCL_MEMORY") : "";
  setenv("MNCL_MEMORY", "host", 1);
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = "absent,auto";
  config.rank = 0;
  config.size = 1;
  constexpr size_t kCreations = 2;
  clear_events();
  ::testing::internal::CaptureStderr();
  for (size_t i = 0; i < kCreations; ++i) {
    try {
      core::Comm::create(&config)->destroy();
    } catch (const std::exception &e) {
      ADD_FAILURE() << "creation " << i << ": " << e.what();
    }
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (memory.empty()) {
    unsetenv("MNCL_MEMORY");
  } else {
    setenv("MNCL_MEMORY", memory.c_str(), 1);
  }
  EXPECT_EQ(refusal_warnings(err, junk), 1u) << err;
  EXPECT_EQ(count_of(events("mock"), "init"), kCreations) << "searched more than once";
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

// ----------------------------------------------------------------------------------------------
// The adapters, on tables in memory: each fills the core's table (abi::Table, v5)

// A table of type T with a valid header for `version`, every other field zero.
template <class T>
T table_for(uint32_t version) {
  T t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.magic = MNCL_PLUGIN_MAGIC;
  t.abi_version = version;
  return t;
}

// What every adapter of a version laid out like the core's table does with the header: a table
// declaring the version before (same layout, older meaning) is refused under this symbol, as
// are a bad magic and a struct_size that ends before the fields the adapter reads.
template <class T>
void expect_header_checks(abi::AdaptFn adapt, uint32_t version) {
  const std::string symbol = abi::symbol_for(version);
  T in = table_for<T>(version - 1);
  abi::Table out;
  EXPECT_CONTAINS(adapt(&in, &out), format("%s declares abi_version %u but the symbol name "
                                           "promises %u",
                                           symbol.c_str(), version - 1, version));
  in.abi_version = version;
  in.magic = 0x12345678u;
  EXPECT_CONTAINS(adapt(&in, &out), symbol + " has magic 0x12345678");
  in.magic = MNCL_PLUGIN_MAGIC;
  in.struct_size = offsetof(T, test);
  EXPECT_CONTAINS(adapt(&in, &out),
                  format("%s struct_size %zu is smaller than %s_t (%zu bytes)", symbol.c_str(),
                         offsetof(T, test), symbol.c_str(), sizeof(T)));
}

// A table of the core's size and layout, every bit it sets defined by its version: copied
// byte for byte.
template <class T>
void expect_exact_copy(abi::AdaptFn adapt, uint32_t version, uint32_t colls) {
  T in = table_for<T>(version);
  in.name = "exact";
  in.caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P;
  in.coll_mask = colls;
  in.dtype_mask = 9;
  abi::Table out;
  std::memset(&out, 0xff, sizeof out);
  EXPECT_EQ(adapt(&in, &out), "");
  static_assert(sizeof in == sizeof out);
  EXPECT_EQ(std::memcmp(&in, &out, sizeof in), 0);
  EXPECT_EQ(out.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  EXPECT_EQ(out.coll_mask, colls);
}

// A later table exported under `version`'s symbol (fields appended, struct_size covering them):
// the adapter copies what it knows and ignores the rest.
void expect_appended_fields_ignored(abi::AdaptFn adapt, uint32_t version, uint32_t kinds) {
  mncl_plugin_v6_test_t in;
  std::memset(&in, 0, sizeof in);
  in.base.struct_size = sizeof in;
  in.base.magic = MNCL_PLUGIN_MAGIC;
  in.base.abi_version = version;
  in.base.op_mask = 3;
  in.base.coll_mask = kinds;
  in.caps2 = ~0ull;
  abi::Table out;
  EXPECT_EQ(adapt(&in, &out), "");
  EXPECT_EQ(out.struct_size, sizeof(abi::Table));
  EXPECT_EQ(out.op_mask, 3u);
  EXPECT_EQ(out.coll_mask, kinds);
}

TEST(V1Adapter, CopiesAKnownSizeTable) {
  mncl_plugin_v1_t in = table_for<mncl_plugin_v1_t>(MNCL_PLUGIN_ABI_V1);
  in.name = "x";
  in.caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_NATIVE_ASYNC;
  in.coll_mask = 5;
  abi::Table out;
  std::memset(&out, 0xff, sizeof out);
  EXPECT_EQ(abi::adapt_v1(&in, &out), "");
  // v5 has v1's layout, so the copy is byte for byte (abi_version stays 1).
  static_assert(sizeof in == sizeof out);
  EXPECT_EQ(std::memcmp(&in, &out, sizeof in), 0);
}

TEST(V1Adapter, ClearsCapabilityBitsV1DoesNotDefine) {
  mncl_plugin_v1_t in = table_for<mncl_plugin_v1_t>(MNCL_PLUGIN_ABI_V1);
  in.caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY | MNCL_CAP_NATIVE_ASYNC |
            MNCL_CAP_STREAM_ORDERED | (1ull << 4) | (1ull << 63);
  abi::Table out;
  EXPECT_EQ(abi::adapt_v1(&in, &out), "");
  EXPECT_EQ(out.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY | MNCL_CAP_NATIVE_ASYNC |
                          MNCL_CAP_STREAM_ORDERED);
  static_assert(MNCL_CAP_CONCURRENT_P2P == (1ull << 4));
}

TEST(V1Adapter, ClearsCollectiveKindsV1DoesNotDefine) {
  // v3's ALLGATHERV and ALLTOALLV, v4's SENDRECV_BATCH, v5's GATHERV and SCATTERV (and
  // anything above) mean nothing in a v1 table.
  mncl_plugin_v1_t in = table_for<mncl_plugin_v1_t>(MNCL_PLUGIN_ABI_V1);
  in.coll_mask = MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED) | kV3Kinds |
                 kV4Kind | kV5Kinds | (1u << 17) | (1u << 31);
  abi::Table out;
  EXPECT_EQ(abi::adapt_v1(&in, &out), "");
  EXPECT_EQ(out.coll_mask, MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED));
  EXPECT_EQ(out.coll_mask & MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV), 0u);
  EXPECT_EQ(out.coll_mask & MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV), 0u);
  EXPECT_EQ(out.coll_mask & kV4Kind, 0u);
  EXPECT_EQ(out.coll_mask & kV5Kinds, 0u);
}

TEST(V1Adapter, IgnoresBytesBeyondTheKnownTable) {
  struct {
    mncl_plugin_v1_t v1;
    char extra[32];
  } in;
  std::memset(&in, 0, sizeof in);
  std::memset(in.extra, 0x5a, sizeof in.extra);
  in.v1.struct_size = sizeof in;
  in.v1.magic = MNCL_PLUGIN_MAGIC;
  in.v1.abi_version = MNCL_PLUGIN_ABI_V1;
  in.v1.op_mask = 3;
  abi::Table out;
  EXPECT_EQ(abi::adapt_v1(&in, &out), "");
  EXPECT_EQ(out.struct_size, sizeof(abi::Table));
  EXPECT_EQ(out.op_mask, 3u);
}

TEST(V1Adapter, RefusesASmallerStructSize) {
  mncl_plugin_v1_t in = table_for<mncl_plugin_v1_t>(MNCL_PLUGIN_ABI_V1);
  in.struct_size = offsetof(mncl_plugin_v1_t, post);
  abi::Table out;
  EXPECT_CONTAINS(abi::adapt_v1(&in, &out),
                  format("struct_size %zu is smaller than mncl_plugin_v1_t (%zu bytes)",
                         offsetof(mncl_plugin_v1_t, post), sizeof(mncl_plugin_v1_t)));
}

TEST(V1Adapter, RefusesAWrongVersionOrMagic) {
  mncl_plugin_v1_t in = table_for<mncl_plugin_v1_t>(2);
  abi::Table out;
  EXPECT_CONTAINS(abi::adapt_v1(&in, &out),
                  "mncl_plugin_v1 declares abi_version 2 but the symbol name promises 1");
  in.abi_version = 1;
  in.magic = 0;
  EXPECT_CONTAINS(abi::adapt_v1(&in, &out), "has magic 0x00000000");
}

TEST(V2Adapter, CopiesAKnownSizeTableWithItsConcurrentP2pBit) {
  mncl_plugin_v2_t in = table_for<mncl_plugin_v2_t>(MNCL_PLUGIN_ABI_V2);
  in.name = "y";
  in.caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P;
  in.dtype_mask = 9;
  abi::Table out;
  std::memset(&out, 0xff, sizeof out);
  EXPECT_EQ(abi::adapt_v2(&in, &out), "");
  EXPECT_EQ(std::memcmp(&in, &out, sizeof in), 0);
  EXPECT_EQ(out.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
}

TEST(V2Adapter, ClearsCollectiveKindsV2DoesNotDefine) {
  // v2 defines v1's kinds only: a v2 plugin is never handed a v3, v4 or v5 kind.
  mncl_plugin_v2_t in = table_for<mncl_plugin_v2_t>(MNCL_PLUGIN_ABI_V2);
  in.caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P;
  in.coll_mask = MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE) | kV3Kinds | kV4Kind | kV5Kinds | (1u << 20);
  abi::Table out;
  EXPECT_EQ(abi::adapt_v2(&in, &out), "");
  EXPECT_EQ(out.coll_mask, MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE));
  EXPECT_EQ(out.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
}

TEST(V2Adapter, IgnoresBytesBeyondTheKnownTable) {
  expect_appended_fields_ignored(&abi::adapt_v2, MNCL_PLUGIN_ABI_V2, 0);
}

TEST(V2Adapter, RefusesAV1HeaderABadMagicAndASmallerStructSize) {
  expect_header_checks<mncl_plugin_v2_t>(&abi::adapt_v2, MNCL_PLUGIN_ABI_V2);
}

TEST(V3Adapter, CopiesAKnownSizeTableWithItsKinds) {
  expect_exact_copy<mncl_plugin_v3_t>(&abi::adapt_v3, MNCL_PLUGIN_ABI_V3, MNCL_COLL_MASK_ALL_V3);
}

TEST(V3Adapter, KeepsTheV3KindsAndClearsUndefinedBits) {
  // v4's batch kind (bit 14) and v5's gatherv and scatterv (bits 15, 16) among them: a v3
  // plugin is never handed a SENDRECV_BATCH, a GATHERV or a SCATTERV.
  mncl_plugin_v3_t in = table_for<mncl_plugin_v3_t>(MNCL_PLUGIN_ABI_V3);
  in.caps = MNCL_CAP_HOST_MEMORY | (1ull << 40);
  in.coll_mask = MNCL_COLL_BIT(MNCL_COLL_BARRIER) | kV3Kinds | kV4Kind | kV5Kinds | (1u << 31);
  abi::Table out;
  EXPECT_EQ(abi::adapt_v3(&in, &out), "");
  EXPECT_EQ(out.coll_mask, MNCL_COLL_BIT(MNCL_COLL_BARRIER) | kV3Kinds);
  EXPECT_EQ(out.caps, MNCL_CAP_HOST_MEMORY);
  static_assert(MNCL_COLL_MASK_ALL_V3 == (1u << 14) - 1u);
}

TEST(V3Adapter, IgnoresBytesBeyondTheKnownTable) {
  expect_appended_fields_ignored(&abi::adapt_v3, MNCL_PLUGIN_ABI_V3, kV3Kinds);
}

TEST(V3Adapter, RefusesAV2HeaderABadMagicAndASmallerStructSize) {
  expect_header_checks<mncl_plugin_v3_t>(&abi::adapt_v3, MNCL_PLUGIN_ABI_V3);
}

TEST(V4Adapter, CopiesAKnownSizeTableWithItsKinds) {
  expect_exact_copy<mncl_plugin_v4_t>(&abi::adapt_v4, MNCL_PLUGIN_ABI_V4, MNCL_COLL_MASK_ALL_V4);
  static_assert((MNCL_COLL_MASK_ALL_V4 & kV4Kind) != 0);
}

TEST(V4Adapter, KeepsTheV4KindsAndClearsUndefinedBits) {
  // v5's gatherv and scatterv (bits 15, 16) among them: a v4 plugin is never handed either.
  mncl_plugin_v4_t in = table_for<mncl_plugin_v4_t>(MNCL_PLUGIN_ABI_V4);
  in.caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P | (1ull << 40);
  in.coll_mask = MNCL_COLL_BIT(MNCL_COLL_BARRIER) | kV3Kinds | kV4Kind | kV5Kinds | (1u << 31);
  abi::Table out;
  EXPECT_EQ(abi::adapt_v4(&in, &out), "");
  EXPECT_EQ(out.coll_mask, MNCL_COLL_BIT(MNCL_COLL_BARRIER) | kV3Kinds | kV4Kind);
  EXPECT_EQ(out.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  static_assert(MNCL_COLL_MASK_ALL_V4 == (1u << 15) - 1u);
}

TEST(V4Adapter, IgnoresBytesBeyondTheKnownTable) {
  expect_appended_fields_ignored(&abi::adapt_v4, MNCL_PLUGIN_ABI_V4, kV3Kinds | kV4Kind);
}

TEST(V4Adapter, RefusesAV3HeaderABadMagicAndASmallerStructSize) {
  expect_header_checks<mncl_plugin_v4_t>(&abi::adapt_v4, MNCL_PLUGIN_ABI_V4);
}

TEST(V5Adapter, CopiesAKnownSizeTableWithItsKinds) {
  expect_exact_copy<mncl_plugin_v5_t>(&abi::adapt_v5, MNCL_PLUGIN_ABI_V5, MNCL_COLL_MASK_ALL_V5);
  static_assert((MNCL_COLL_MASK_ALL_V5 & kV5Kinds) == kV5Kinds);
}

TEST(V5Adapter, KeepsTheV5KindsAndClearsUndefinedBits) {
  mncl_plugin_v5_t in = table_for<mncl_plugin_v5_t>(MNCL_PLUGIN_ABI_V5);
  in.caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P | (1ull << 40);
  in.coll_mask =
      MNCL_COLL_BIT(MNCL_COLL_BARRIER) | kV3Kinds | kV4Kind | kV5Kinds | (1u << 17) | (1u << 31);
  abi::Table out;
  EXPECT_EQ(abi::adapt_v5(&in, &out), "");
  EXPECT_EQ(out.coll_mask, MNCL_COLL_BIT(MNCL_COLL_BARRIER) | kV3Kinds | kV4Kind | kV5Kinds);
  EXPECT_EQ(out.caps, MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P);
  static_assert(MNCL_COLL_MASK_ALL_V5 == (1u << 17) - 1u);
}

TEST(V5Adapter, IgnoresBytesBeyondTheKnownTable) {
  expect_appended_fields_ignored(&abi::adapt_v5, MNCL_PLUGIN_ABI_V5, kV3Kinds | kV4Kind | kV5Kinds);
}

TEST(V5Adapter, RefusesAV4HeaderABadMagicAndASmallerStructSize) {
  expect_header_checks<mncl_plugin_v5_t>(&abi::adapt_v5, MNCL_PLUGIN_ABI_V5);
}

TEST(Adapters, NewestFirst) {
  // The loader takes the first symbol found: v5 must be tried before v4, v4 before v3, v3
  // before v2, v2 before v1.
  ASSERT_EQ(std::size(abi::kAdapters), 5u);
  EXPECT_EQ(abi::kAdapters[0].version, MNCL_PLUGIN_ABI_V5);
  EXPECT_STREQ(abi::kAdapters[0].symbol, "mncl_plugin_v5");
  EXPECT_EQ(abi::kAdapters[1].version, MNCL_PLUGIN_ABI_V4);
  EXPECT_STREQ(abi::kAdapters[1].symbol, "mncl_plugin_v4");
  EXPECT_EQ(abi::kAdapters[2].version, MNCL_PLUGIN_ABI_V3);
  EXPECT_STREQ(abi::kAdapters[2].symbol, "mncl_plugin_v3");
  EXPECT_EQ(abi::kAdapters[3].version, MNCL_PLUGIN_ABI_V2);
  EXPECT_STREQ(abi::kAdapters[3].symbol, "mncl_plugin_v2");
  EXPECT_EQ(abi::kAdapters[4].version, MNCL_PLUGIN_ABI_V1);
  EXPECT_STREQ(abi::kAdapters[4].symbol, "mncl_plugin_v1");
  EXPECT_EQ(abi::symbol_for(6), MNCL_PLUGIN_V6_TEST_SYMBOL);
}

// ----------------------------------------------------------------------------------------------
// Host services

TEST(HostServices, DescribeThemselves) {
  const mncl_host_v1_t *host = host_services();
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(host->struct_size, sizeof(mncl_host_v1_t));
  EXPECT_EQ(host->version, MNCL_VERSION);
  EXPECT_EQ(host->log_level, log::level());
  EXPECT_EQ(host, host_services());
}

TEST(HostServices, SetErrorFormatsIntoTheLastError) {
  host_services()->set_error("rank %d failed: %s", 3, "boom");
  EXPECT_STREQ(last_error(), "rank 3 failed: boom");
}

TEST(HostServices, GetEnvReadsThroughTheCore) {
  const char *value = host_services()->get_env("MNCL_PLUGIN_PATH");
  ASSERT_NE(value, nullptr);
  EXPECT_STREQ(value, kMockDir.c_str());
  unsetenv("MNCL_DEVICE");
  EXPECT_EQ(host_services()->get_env("MNCL_DEVICE"), nullptr);
  EXPECT_EQ(host_services()->get_env(nullptr), nullptr);
}

TEST(HostServices, LogIsTaggedAndLeveled) {
  const mncl_host_v1_t *host = host_services();
  if (host->log_level < MNCL_LOG_ERROR) GTEST_SKIP() << "logging is off";
  ::testing::internal::CaptureStderr();
  host->log(MNCL_LOG_ERROR, "plugins/x/x.c", 7, "hello %d", 42);
  host->log(MNCL_LOG_TRACE + 1, "plugins/x/x.c", 8, "never shown");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(err, " ERROR plugins/x/x.c:7] plugin: hello 42");
  EXPECT_EQ(err.find("never shown"), std::string::npos);
}

}  // namespace
}  // namespace mncl::loader

int main(int argc, char **argv) {
  // Only the build tree's mock folder, whatever the caller's environment (ctest sets the same).
  setenv("MNCL_PLUGIN_PATH", MNCL_MOCK_PLUGIN_DIR, 1);
  setenv("MNCL_MOCK_EVENTS", mncl::loader::events_path().c_str(), 1);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::remove(mncl::loader::events_path().c_str());
  return rc;
}

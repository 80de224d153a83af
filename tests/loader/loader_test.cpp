// White-box tests of the plugin loader against the mock plugins and bad files in the test-only
// folder MNCL_MOCK_PLUGIN_DIR (see CMakeLists.txt). main() points MNCL_PLUGIN_PATH there.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "loader/plugin_abi.h"
#include "loader/plugin_loader.h"
#include "mncl_plugin_v2_test.h"

namespace mncl::loader {
namespace {

// The hypothetical v2 only appends: its v1 part must match v1 field for field.
static_assert(offsetof(mncl_plugin_v2_test_t, test) == offsetof(mncl_plugin_v1_t, test));
static_assert(offsetof(mncl_plugin_v2_test_t, comm_shrink) == sizeof(mncl_plugin_v1_t));

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
      {"v2only", "offers plugin ABI v2 only; this core supports v1..v1"},
      {"badabi", "mncl_plugin_v1 declares abi_version 7 but the symbol name promises 1"},
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

TEST_P(RefusedPlugin, LoggedAtWarnWithFileAndReason) {
  if (log::level() < log::kWarn) GTEST_SKIP() << "MNCL_DEBUG hides warnings";
  const std::string path = mock_path(GetParam().file);
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(load(path), Error);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(err, " WARN ");
  EXPECT_CONTAINS(err, "skipping plugin " + path + ": ");
  EXPECT_CONTAINS(err, GetParam().reason);
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
  const mncl_plugin_v1_t &t = p->table();
  EXPECT_EQ(t.struct_size, sizeof(mncl_plugin_v1_t));
  EXPECT_EQ(t.magic, MNCL_PLUGIN_MAGIC);
  EXPECT_STREQ(t.version, "0.0.1-test (mock)");
  EXPECT_TRUE(t.caps & MNCL_CAP_HOST_MEMORY);
  EXPECT_EQ(t.comm_split, nullptr);
}

TEST(Loader, GoodMockProbesAndRunsASingleRankAllreduce) {
  auto p = load("mock");
  const mncl_plugin_v1_t &t = p->table();

  mncl_probe_v1_t info = {sizeof info, 1, 1, 1, 0, 0, 0};
  int32_t score = -1;
  char reason[128] = "";
  ASSERT_EQ(t.probe(&info, &score, reason, sizeof reason), MNCL_OK);
  EXPECT_GT(score, 0);
  info.size = 4;
  ASSERT_EQ(t.probe(&info, &score, reason, sizeof reason), MNCL_OK);
  EXPECT_EQ(score, 0);
  EXPECT_STREQ(reason, "mock serves single-rank jobs only");

  mncl_bootstrap_v1_t bs = {};
  bs.struct_size = sizeof bs;
  bs.size = 1;
  void *comm = nullptr;
  ASSERT_EQ(t.comm_create(&bs, &comm), MNCL_OK);
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

TEST(Loader, NewestKnownVersionWinsWhenSeveralAreExported) {
  auto p = load("v1v2");
  EXPECT_EQ(p->abi_version(), 1u);
  EXPECT_EQ(p->table().abi_version, MNCL_PLUGIN_ABI_V1);
}

TEST(Loader, LargerStructSizeIsCutToTheKnownTable) {
  auto p = load("padded");
  EXPECT_EQ(p->table().struct_size, sizeof(mncl_plugin_v1_t));
}

// ----------------------------------------------------------------------------------------------
// Names, paths, search path

TEST(Loader, UnknownNameListsTheAvailableBackends) {
  const std::string message = error_of([] { load("gloooo"); });
  EXPECT_EQ(message.rfind("unknown backend 'gloooo'; available: ", 0), 0u) << message;
  for (const char *good : {"mock", "noop", "padded", "v1v2"}) EXPECT_CONTAINS(message, good);
  for (const char *bad : {"initfail", "text", "v2only"}) {
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
  EXPECT_TRUE(has("v1v2"));
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

TEST(Loader, SearchPathStartsWithThePluginPathThenTheModuleFolders) {
  const auto dirs = search_path();
  ASSERT_GE(dirs.size(), 3u);
  EXPECT_EQ(dirs[0], kMockDir);
  char exe[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof exe - 1), 0);
  const std::string exe_dir = std::string(exe).substr(0, std::string(exe).rfind('/'));
  EXPECT_EQ(dirs[1], exe_dir + "/mncl/plugins");
  EXPECT_EQ(dirs[2].substr(dirs[2].size() - std::strlen("/lib/mncl/plugins")), "/lib/mncl/plugins");
}

TEST(Loader, NothingOutsideTheBuildTreeIsSearched) {
  const std::string build = MNCL_BUILD_DIR;
  for (const auto &dir : search_path()) EXPECT_EQ(dir.rfind(build + "/", 0), 0u) << dir;
  for (const auto &r : discover()) EXPECT_EQ(r.path.rfind(build + "/", 0), 0u) << r.path;
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
  // 15 mock variants + 6 bad files.
  EXPECT_EQ(in_mock_dir, 21u);
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
// The v1 adapter, on tables in memory

TEST(V1Adapter, CopiesAKnownSizeTable) {
  mncl_plugin_v1_t in = {};
  in.struct_size = sizeof in;
  in.magic = MNCL_PLUGIN_MAGIC;
  in.abi_version = MNCL_PLUGIN_ABI_V1;
  in.name = "x";
  in.coll_mask = 5;
  mncl_plugin_v1_t out;
  std::memset(&out, 0xff, sizeof out);
  EXPECT_EQ(abi::adapt_v1(&in, &out), "");
  EXPECT_EQ(std::memcmp(&in, &out, sizeof in), 0);
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
  mncl_plugin_v1_t out;
  EXPECT_EQ(abi::adapt_v1(&in, &out), "");
  EXPECT_EQ(out.struct_size, sizeof(mncl_plugin_v1_t));
  EXPECT_EQ(out.op_mask, 3u);
}

TEST(V1Adapter, RefusesASmallerStructSize) {
  mncl_plugin_v1_t in = {};
  in.struct_size = offsetof(mncl_plugin_v1_t, post);
  in.magic = MNCL_PLUGIN_MAGIC;
  in.abi_version = MNCL_PLUGIN_ABI_V1;
  mncl_plugin_v1_t out;
  EXPECT_CONTAINS(abi::adapt_v1(&in, &out),
                  format("struct_size %zu is smaller than mncl_plugin_v1_t (%zu bytes)",
                         offsetof(mncl_plugin_v1_t, post), sizeof(mncl_plugin_v1_t)));
}

TEST(V1Adapter, RefusesAWrongVersionOrMagic) {
  mncl_plugin_v1_t in = {};
  in.struct_size = sizeof in;
  in.magic = MNCL_PLUGIN_MAGIC;
  in.abi_version = 2;
  mncl_plugin_v1_t out;
  EXPECT_CONTAINS(abi::adapt_v1(&in, &out), "declares abi_version 2");
  in.abi_version = 1;
  in.magic = 0;
  EXPECT_CONTAINS(abi::adapt_v1(&in, &out), "has magic 0x00000000");
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

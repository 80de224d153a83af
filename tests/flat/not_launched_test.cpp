// A job of several ranks started without mpirun/srun cannot use the flat backend, and must be
// told so, with how to launch it, instead of hanging or coming up as separate MPI singletons.
//
//   not_launched_test <path to libmncl-flat.so>
//
// PluginLevel loads the plugin directly and checks probe() and comm_create() (which must
// refuse before MPI_Init). EndToEnd forks two ranks that share a file store and asks libmncl
// for MNCL_BACKEND=flat; both must fail with MNCL_ERR_PLUGIN and the launch hint.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mncl/mncl.h>
#include <mncl/mncl_plugin.h>
#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace {

const char *g_plugin_path = nullptr;
std::string g_error;  // the last host->set_error() message

// Whatever launched this test, it must look like a plain process.
void forget_launcher() {
  for (const char *name : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK",
                           "PMIX_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    unsetenv(name);
  }
}

void host_log(int32_t, const char *, int32_t, const char *, ...) {}
void host_set_error(const char *fmt, ...) {
  char buf[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  g_error = buf;
}
const char *host_get_env(const char *name) {
  return std::getenv(name);
}

TEST(NotLaunched, PluginLevel) {
  ASSERT_NE(g_plugin_path, nullptr);
  void *lib = dlopen(g_plugin_path, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const auto *table = static_cast<const mncl_plugin_v1_t *>(dlsym(lib, MNCL_PLUGIN_V1_SYMBOL));
  ASSERT_NE(table, nullptr);
  EXPECT_STREQ(table->name, "flat");

  static const mncl_host_v1_t host = {sizeof(mncl_host_v1_t), MNCL_VERSION, MNCL_LOG_NONE, host_log,
                                      host_set_error,         host_get_env};
  ASSERT_EQ(table->init(&host), MNCL_OK) << g_error;

  mncl_probe_v1_t info{};
  info.struct_size = sizeof info;
  info.size = 4;
  info.local_size = 4;
  info.num_hosts = 1;
  info.launched_by_mpi = 0;
  int32_t score = -1;
  char reason[512] = "";
  ASSERT_EQ(table->probe(&info, &score, reason, sizeof reason), MNCL_OK);
  EXPECT_EQ(score, 0);
  EXPECT_NE(std::strstr(reason, "not launched by mpirun/srun (OMPI_COMM_WORLD_SIZE unset)"),
            nullptr)
      << reason;
  EXPECT_NE(std::strstr(reason, "mpirun -np 4"), nullptr) << reason;

  info.launched_by_mpi = 1;
  ASSERT_EQ(table->probe(&info, &score, reason, sizeof reason), MNCL_OK);
  EXPECT_GE(score, 50) << "launched by mpirun, flat should be a strong choice";

  // comm_create refuses on its own too (MNCL_BACKEND given as a path skips nothing).
  mncl_bootstrap_v1_t bs{};
  bs.struct_size = sizeof bs;
  bs.rank = 1;
  bs.size = 2;
  bs.local_rank = bs.local_size = bs.num_hosts = bs.device = -1;
  bs.timeout_ms = 1000;
  bs.comm_id = "w";
  void *comm = nullptr;
  g_error.clear();
  EXPECT_EQ(table->comm_create(&bs, &comm), MNCL_ERR_PLUGIN);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(g_error.find("not launched by mpirun/srun"), std::string::npos) << g_error;
  EXPECT_NE(g_error.find("mpirun -np 2"), std::string::npos) << g_error;
  int initialized = 1;
  MPI_Initialized(&initialized);
  EXPECT_EQ(initialized, 0) << "the refusal must come before MPI_Init";

  table->finalize();
  dlclose(lib);
}

// One rank of the forked job: 0 if mncl_comm_create failed the documented way.
int run_rank(int rank, const std::string &store) {
  setenv("MNCL_RANK", std::to_string(rank).c_str(), 1);
  setenv("MNCL_SIZE", "2", 1);
  setenv("MNCL_STORE", store.c_str(), 1);
  setenv("MNCL_BACKEND", "flat", 1);
  setenv("MNCL_TIMEOUT", "20", 1);
  mncl_comm_t comm = nullptr;
  const mncl_status_t st = mncl_comm_create(nullptr, &comm);
  const std::string message = mncl_last_error();
  bool ok = st == MNCL_ERR_PLUGIN && comm == nullptr &&
            message.find("not launched by mpirun/srun") != std::string::npos &&
            message.find("mpirun -np 2") != std::string::npos;
  if (!ok) {
    std::fprintf(stderr, "rank %d: mncl_comm_create returned %s: %s\n", rank,
                 mncl_status_string(st), message.c_str());
  }
  if (comm != nullptr) mncl_comm_destroy(comm);
  return ok ? 0 : 1;
}

TEST(NotLaunched, EndToEnd) {
  const std::string dir = "/tmp/mncl-flat-not-launched-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    ASSERT_GE(pids[rank], 0);
    if (pids[rank] == 0) {
      alarm(60);  // never outlive a broken test
      _exit(run_rank(rank, "file://" + dir));
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[rank], &status, 0), pids[rank]);
    EXPECT_TRUE(WIFEXITED(status)) << "rank " << rank << " died (status " << status << ")";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << rank << " did not get the launch hint";
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <path to libmncl-flat.so>\n", argv[0]);
    return 2;
  }
  g_plugin_path = argv[1];
  forget_launcher();
  return RUN_ALL_TESTS();
}

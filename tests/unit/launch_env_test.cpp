// Tests of the launcher environment (sdk/core/launch_env.cpp): which launcher's variables give
// the rank, the size and the local rank, when they disagree, whether the job counts as launched
// by MPI, and the bootstrap store it needs; and of env::get's logging (sdk/common/env.cpp):
// secrets are never printed, and only unknown MNCL_* names draw a warning.
#include "core/launch_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "../common/expect_error.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "loader/plugin_loader.h"

namespace mncl::core {
namespace {

using mncl::testing::error_of;

// env::get logs at info level: set before anything in this process reads the level.
const bool kInfoLogs = [] {
  setenv("MNCL_DEBUG", "info", 1);
  return true;
}();

// Every variable these tests set, or that would change what they resolve.
constexpr const char *kVariables[] = {"MNCL_RANK",
                                      "MNCL_SIZE",
                                      "MNCL_LOCAL_RANK",
                                      "MNCL_LOCAL_SIZE",
                                      "MNCL_STORE",
                                      "RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "OMPI_COMM_WORLD_RANK",
                                      "OMPI_COMM_WORLD_SIZE",
                                      "OMPI_COMM_WORLD_LOCAL_RANK",
                                      "OMPI_COMM_WORLD_LOCAL_SIZE",
                                      "OMPI_MCA_ess_base_jobid",
                                      "OMPI_MCA_orte_precondition_transports",
                                      "PMIX_NAMESPACE",
                                      "SLURM_JOB_ID",
                                      "PMI_RANK",
                                      "PMI_SIZE",
                                      "PMIX_RANK",
                                      "SLURM_PROCID",
                                      "SLURM_NTASKS",
                                      "SLURM_LOCALID",
                                      "SLURM_STEP_ID",
                                      "SLURM_STEPID",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "TORCHELASTIC_RUN_ID",
                                      "TORCHELASTIC_USE_AGENT_STORE",
                                      "MNCL_BACKEND",
                                      "MNCL_DEVICE",
                                      "MNCL_BIND",
                                      "MNCL_MEMORY",
                                      "MNCL_BACKEND_HOST",
                                      "MNCL_LANE_LINGER_US",
                                      "MNCL_DEBUG_CHECKS"};

// Starts every test from an environment without any launcher, and puts it back after.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char *name : kVariables) {
      if (const char *value = getenv(name)) saved_[name] = value;
    }
    clear();
  }
  void TearDown() override {
    clear();
    for (const auto &[name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  // Back to an environment without any launcher, within a test; with a store named (not
  // opened here), so jobs of several ranks resolve, except in the store's own tests.
  static void clear() {
    for (const char *name : kVariables) unsetenv(name);
    setenv("MNCL_STORE", "file:///tmp/mncl-launch-env-test-never-opened", 1);
  }
  static void set(const char *name, const std::string &value) { setenv(name, value.c_str(), 1); }
  static LaunchSettings resolve() {
    const mncl_config_t config = MNCL_CONFIG_INIT;
    return resolve_launch_settings(config);
  }
  static void mpirun(int rank, int size, int local_rank, int local_size) {
    set("OMPI_COMM_WORLD_RANK", std::to_string(rank));
    set("OMPI_COMM_WORLD_SIZE", std::to_string(size));
    set("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local_rank));
    set("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size));
    set("PMIX_RANK", std::to_string(rank));
  }
  // A RANK/WORLD_SIZE pair (torchrun's variables), and srun's task variables.
  static void torchrun_pair(int rank, int size) {
    set("RANK", std::to_string(rank));
    set("WORLD_SIZE", std::to_string(size));
  }
  // A task of an srun step (step 0).
  static void srun(int procid, int ntasks, int localid = -1) {
    set("SLURM_STEP_ID", "0");
    set("SLURM_PROCID", std::to_string(procid));
    set("SLURM_NTASKS", std::to_string(ntasks));
    if (localid >= 0) set("SLURM_LOCALID", std::to_string(localid));
  }
  // An sbatch script of `ntasks` tasks (the batch step: task 0 of the allocation, no step id).
  static void sbatch_script(int ntasks) {
    set("SLURM_PROCID", "0");
    set("SLURM_NTASKS", std::to_string(ntasks));
    set("SLURM_LOCALID", "0");
  }

 private:
  std::map<std::string, std::string> saved_;
};

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// Rank and size.
// ---------------------------------------------------------------------------------------------

// RANK=0 WORLD_SIZE=1 left in the shell under mpirun made each process a job of one rank.
TEST_F(LaunchEnv, StaleTorchrunPairUnderMpirunIsRefusedNamingBoth) {
  torchrun_pair(0, 1);
  for (int rank = 0; rank < 2; ++rank) {
    mpirun(rank, 2, rank, 2);
    const auto message = error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(message, "RANK=0 WORLD_SIZE=1 (torchrun)")) << message;
    EXPECT_TRUE(contains(message, "OMPI_COMM_WORLD_RANK=" + std::to_string(rank) +
                                      " OMPI_COMM_WORLD_SIZE=2 (Open MPI)"))
        << message;
    EXPECT_TRUE(contains(message, "Unset")) << message;
    EXPECT_TRUE(contains(message, "MNCL_RANK and MNCL_SIZE")) << message;
  }
}

// The launcher looked at later disagreeing is as much an error as the one looked at earlier.
TEST_F(LaunchEnv, DisagreementIsRefusedWhicheverLauncherComesFirst) {
  mpirun(0, 2, 0, 2);
  set("PMI_RANK", "1");
  set("PMI_SIZE", "3");
  const auto message = error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(message, "PMI_RANK=1 PMI_SIZE=3 (PMI)")) << message;
  EXPECT_TRUE(contains(message, "(Open MPI)")) << message;

  // A RANK/WORLD_SIZE pair typed by hand (no torchrun agent) beside the srun of a larger job
  // (one of fewer ranks than Slurm's tasks cannot have been started by them).
  clear();
  torchrun_pair(3, 4);
  srun(0, 8);
  const auto slurm = error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(slurm, "SLURM_PROCID=0 SLURM_NTASKS=8 (Slurm)")) << slurm;
}

TEST_F(LaunchEnv, ExplicitMnclRankAndSizeWinSilently) {
  torchrun_pair(0, 1);
  mpirun(1, 2, 1, 2);
  set("MNCL_RANK", "1");
  set("MNCL_SIZE", "2");
  const auto s = resolve();
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.size, 2);
  EXPECT_EQ(s.rank_origin, "MNCL_RANK");
  // The local rank of the launcher whose rank and size they are.
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_size, 2);
  EXPECT_TRUE(s.launched_by_mpi);
}

TEST_F(LaunchEnv, AgreeingLaunchersAreFine) {
  mpirun(1, 2, 1, 2);
  set("PMI_RANK", "1");
  set("PMI_SIZE", "2");
  torchrun_pair(1, 2);
  const auto s = resolve();
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.size, 2);
}

// An allocation's Slurm variables around mpirun (in an sbatch script) or around torchrun (srun
// torchrun: one Slurm task per node) describe the launcher that started this one's.
TEST_F(LaunchEnv, SlurmAroundMpirunOrTorchrunIsNoDisagreement) {
  mpirun(3, 4, 1, 2);
  sbatch_script(4);
  auto s = resolve();
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.size, 4);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_size, 2);
  // mpirun in an sbatch script of 4 nodes starts its daemons with srun: its ranks inherit the
  // daemons' step (SLURM_PROCID the node, SLURM_NTASKS the nodes), whatever -np.
  for (const auto &[rank, size, node] : {std::array<int, 3>{1, 2, 1}, {0, 1, 0}, {3, 4, 2}}) {
    clear();
    mpirun(rank, size, 0, 1);
    srun(node, 4, 0);
    s = resolve();
    EXPECT_EQ(s.rank, rank);
    EXPECT_EQ(s.size, size);
  }
  // srun -n 1 mpirun -np 4: one Slurm task started the 4 ranks.
  clear();
  mpirun(3, 4, 1, 2);
  srun(0, 1, 0);
  s = resolve();
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.size, 4);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_size, 2);

  clear();
  torchrun_pair(5, 8);
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "4");
  set("TORCHELASTIC_RUN_ID", "job7");
  srun(1, 2, 0);
  s = resolve();
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.size, 8);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_size, 4);
  EXPECT_EQ(s.rank_origin, "RANK");

  // One Slurm task per node starting 4 workers without torchrun (DeepSpeed's launcher,
  // mp.spawn): fewer Slurm tasks than ranks, so Slurm started them.
  clear();
  torchrun_pair(6, 8);
  srun(1, 2);
  s = resolve();
  EXPECT_EQ(s.rank, 6);
  EXPECT_EQ(s.size, 8);

  // A stale pair of a smaller job under srun -n 2 is still refused.
  clear();
  torchrun_pair(0, 1);
  srun(1, 2);
  error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT);
}

// An sbatch script's own variables (the batch step: SLURM_PROCID=0, SLURM_NTASKS of the whole
// allocation, no step id) made a program it runs rank 0 of a job of N that waited for ranks
// that never come, and refused every hand-launched rank but 0 as "left by another launch".
TEST_F(LaunchEnv, SbatchScriptIsNoLauncher) {
  sbatch_script(4);
  auto s = resolve();
  EXPECT_EQ(s.rank, 0);
  EXPECT_EQ(s.size, 1);
  EXPECT_EQ(s.rank_origin, "the default");
  EXPECT_EQ(s.local_rank, -1);  // SLURM_LOCALID is no local rank there either
  // Workers started by a launcher of its own, as many as the allocation's tasks.
  for (int rank = 0; rank < 4; ++rank) {
    torchrun_pair(rank, 4);
    s = resolve();
    EXPECT_EQ(s.rank, rank);
    EXPECT_EQ(s.size, 4);
  }
  // The special steps (salloc's interactive step, the extern step) are no srun step either;
  // the older SLURM_STEPID counts like SLURM_STEP_ID.
  clear();
  sbatch_script(4);
  set("SLURM_STEP_ID", std::to_string(0xfffffffaLL));
  EXPECT_EQ(resolve().size, 1);
  unsetenv("SLURM_STEP_ID");
  set("SLURM_STEPID", "3");
  EXPECT_EQ(resolve().size, 4);
}

// ---------------------------------------------------------------------------------------------
// Local rank and size.
// ---------------------------------------------------------------------------------------------

TEST_F(LaunchEnv, LocalRankComesFromTheLauncherThatGaveTheRank) {
  set("LOCAL_RANK", "0");  // left in the shell: not mpirun's
  set("LOCAL_WORLD_SIZE", "1");
  mpirun(1, 2, 1, 2);
  auto s = resolve();
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_size, 2);

  // Slurm has a local rank, no local size (grouping by host gives it: -1).
  clear();
  set("LOCAL_RANK", "0");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "1");
  srun(3, 4, 1);
  s = resolve();
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_size, -1);

  // The user's own win.
  set("MNCL_LOCAL_RANK", "0");
  set("MNCL_LOCAL_SIZE", "3");
  s = resolve();
  EXPECT_EQ(s.local_rank, 0);
  EXPECT_EQ(s.local_size, 3);
}

TEST_F(LaunchEnv, LocalRankOutOfRangeNamesItsVariables) {
  mpirun(1, 2, 2, 2);
  const auto message = error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(message, "OMPI_COMM_WORLD_LOCAL_RANK")) << message;
  EXPECT_TRUE(contains(message, "OMPI_COMM_WORLD_LOCAL_SIZE")) << message;
}

// ---------------------------------------------------------------------------------------------
// Launched by MPI.
// ---------------------------------------------------------------------------------------------

TEST_F(LaunchEnv, LaunchedByMpiOnlyWhenRankAndSizeComeFromMpi) {
  mpirun(0, 2, 0, 2);
  EXPECT_TRUE(resolve().launched_by_mpi);

  // mncl-run started from a process mpirun launched: its own rank and size.
  clear();
  mpirun(0, 1, 0, 1);
  set("MNCL_RANK", "2");
  set("MNCL_SIZE", "4");
  EXPECT_FALSE(resolve().launched_by_mpi);

  // Only a lone Open MPI size, the rank from elsewhere.
  clear();
  set("RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "1");
  EXPECT_FALSE(resolve().launched_by_mpi);

  // srun --mpi=pmix: PMIx's rank is Slurm's.
  clear();
  srun(2, 4);
  set("PMIX_RANK", "2");
  EXPECT_TRUE(resolve().launched_by_mpi);
  set("PMIX_RANK", "0");
  EXPECT_FALSE(resolve().launched_by_mpi);
}

// ---------------------------------------------------------------------------------------------
// The bootstrap store.
// ---------------------------------------------------------------------------------------------

// torchrun --nproc-per-node=1 sets MASTER_ADDR/MASTER_PORT, where its agent's store listens.
// The store's token where MNCL_STORE_TOKEN is unset: the job id of the launcher that gave the
// rank and size, the same on all of its ranks; none for a rank the user gave, or a launcher
// that says none.
TEST_F(LaunchEnv, JobTokenIsTheIdOfTheLauncherThatGaveTheRank) {
  srun(1, 2);
  set("SLURM_JOB_ID", "4242");
  EXPECT_EQ(resolve().job_token, "slurm:4242.0");
  set("SLURM_STEP_ID", "3");
  EXPECT_EQ(resolve().job_token, "slurm:4242.3");

  // mpirun in an sbatch script (its daemons' step around it): Open MPI's job and key.
  clear();
  mpirun(1, 4, 1, 2);
  srun(0, 2, 0);
  set("SLURM_JOB_ID", "4242");
  set("OMPI_MCA_ess_base_jobid", "3917479937");
  set("OMPI_MCA_orte_precondition_transports", "0a1b2c3d-4e5f6a7b");
  EXPECT_EQ(resolve().job_token, "ompi:3917479937-0a1b2c3d-4e5f6a7b");
  unsetenv("OMPI_MCA_ess_base_jobid");  // Open MPI 5: PMIx's namespace
  set("PMIX_NAMESPACE", "prterun-node0-12345@1");
  EXPECT_EQ(resolve().job_token, "pmix:prterun-node0-12345@1");
  set("PMIX_RANK", "0");  // another rank's: inherited from around the launcher
  EXPECT_EQ(resolve().job_token, "");

  clear();
  torchrun_pair(1, 2);
  EXPECT_EQ(resolve().job_token, "");  // a pair by hand
  set("TORCHELASTIC_RUN_ID", "none");  // torchrun's default: says nothing
  EXPECT_EQ(resolve().job_token, "");
  set("TORCHELASTIC_RUN_ID", "job7");
  EXPECT_EQ(resolve().job_token, "torchrun:job7");

  // The user's own rank (mncl-run's, which sets a token of its own): none.
  set("MNCL_RANK", "1");
  set("MNCL_SIZE", "2");
  EXPECT_EQ(resolve().job_token, "");
}

TEST_F(LaunchEnv, OneRankJobNeedsNoStoreUnlessNamed) {
  unsetenv("MNCL_STORE");
  torchrun_pair(0, 1);
  set("MASTER_ADDR", "127.0.0.1");
  set("MASTER_PORT", "29500");
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  EXPECT_EQ(resolve().store_url, "");
  set("MNCL_STORE", "tcp://127.0.0.1:29501");
  EXPECT_EQ(resolve().store_url, "tcp://127.0.0.1:29501");
}

// MASTER_ADDR is checked where it makes the store's URL, naming it: "host:port" passed as an
// IPv6 address that resolved nowhere (every rank but 0 waited out the timeout), and other
// mistakes were reported as a URL the user never wrote.
TEST_F(LaunchEnv, MasterAddrMistakesNameTheVariable) {
  unsetenv("MNCL_STORE");
  torchrun_pair(1, 2);
  set("MASTER_PORT", "29500");
  for (const char *bad :
       {"127.0.0.1:29500", "node0 ", "[::1", "[node0]", "fe80::1::2", "[::1]:29500", "a]"}) {
    set("MASTER_ADDR", bad);
    const auto message = error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(message, std::string("MASTER_ADDR='") + bad + "'")) << message;
  }
  set("MASTER_ADDR", "127.0.0.1:29500");
  EXPECT_TRUE(contains(error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT), "MASTER_PORT"));
  const std::pair<const char *, const char *> good[] = {
      {"node0", "tcp://node0:29500"},
      {"10.0.0.1", "tcp://10.0.0.1:29500"},
      {"::1", "tcp://[::1]:29500"},
      {"[::1]", "tcp://[::1]:29500"},
      {"fe80::1%eth0", "tcp://[fe80::1%eth0]:29500"},
      {"[10.0.0.1]", "tcp://10.0.0.1:29500"}};
  for (const auto &[addr, url] : good) {
    set("MASTER_ADDR", addr);
    EXPECT_EQ(resolve().store_url, url) << addr;
  }
}

// Variables that give nothing to this job are not held against it: a malformed MASTER_PORT
// beside a named store or in a job of one rank, a malformed RANK beside MNCL_RANK/MNCL_SIZE
// (mncl-run's).
TEST_F(LaunchEnv, UnusedMalformedVariablesFailNothing) {
  set("MASTER_PORT", "abc");
  set("MASTER_ADDR", "127.0.0.1:1");
  torchrun_pair(1, 2);
  EXPECT_EQ(resolve().store_url, "file:///tmp/mncl-launch-env-test-never-opened");
  unsetenv("MNCL_STORE");
  error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT);  // now the store comes from them
  torchrun_pair(0, 1);
  EXPECT_EQ(resolve().store_url, "");
  // A lone malformed MASTER_PORT beside mpirun's private file store (one host).
  clear();
  unsetenv("MNCL_STORE");
  set("MASTER_PORT", "abc");
  mpirun(0, 2, 0, 2);
  set("OMPI_MCA_ess_base_jobid", "1234");
  EXPECT_EQ(resolve().store_url.rfind("file:///tmp/mncl-", 0), 0u) << resolve().store_url;

  clear();
  set("RANK", "abc");
  set("WORLD_SIZE", "2");
  set("MNCL_RANK", "1");
  set("MNCL_SIZE", "2");
  const auto s = resolve();
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.size, 2);
  unsetenv("MNCL_RANK");
  unsetenv("MNCL_SIZE");
  EXPECT_TRUE(contains(error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT), "RANK='abc'"));
}

// Every core setting is parsed here, before the rendezvous (and so by mncl-info): a malformed
// store url, MNCL_LANE_LINGER_US or MNCL_DEBUG_CHECKS failed only at the store's opening or in
// the communicator's creation, and mncl-info said nothing about them.
TEST_F(LaunchEnv, EveryCoreSettingIsCheckedNamingItsVariable) {
  set("MNCL_STORE", "http://x");
  EXPECT_TRUE(contains(error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT),
                       "MNCL_STORE: invalid store url 'http://x': unknown scheme"));
  set("MNCL_STORE", "file://relative/dir");
  EXPECT_TRUE(contains(error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT),
                       "the directory must be an absolute path"));
  set("MNCL_STORE", "tcp://127.0.0.1:29500");
  EXPECT_EQ(resolve().store_url, "tcp://127.0.0.1:29500");
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.bootstrap = "tcp://nohost";
  EXPECT_TRUE(
      contains(error_of([&] { resolve_launch_settings(config); }, MNCL_ERR_INVALID_ARGUMENT),
               "config->bootstrap: invalid store url 'tcp://nohost': no port"));

  set("MNCL_LANE_LINGER_US", "x");
  EXPECT_TRUE(contains(error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT),
                       "MNCL_LANE_LINGER_US='x' is not an integer"));
  set("MNCL_LANE_LINGER_US", "7");
  EXPECT_EQ(resolve().lane_linger_us, 7);
  unsetenv("MNCL_LANE_LINGER_US");
  EXPECT_EQ(resolve().lane_linger_us, 50);

  set("MNCL_DEBUG_CHECKS", "yes");
  EXPECT_TRUE(contains(error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT),
                       "MNCL_DEBUG_CHECKS='yes' is not an integer"));
  set("MNCL_DEBUG_CHECKS", "1");
  EXPECT_TRUE(resolve().debug_checks);
  unsetenv("MNCL_DEBUG_CHECKS");
  EXPECT_FALSE(resolve().debug_checks);
}

// Keywords in any case, as NCCL_DEBUG=INFO: MNCL_BIND=NUMA and MNCL_MEMORY=HOST were refused,
// MNCL_BACKEND=AUTO was taken for a plugin's name. Plugin names keep their case here (a plugin
// may be named MyNet): the loader and the selection match them in any case (loader_test).
TEST_F(LaunchEnv, KeywordValuesAreTakenInAnyCase) {
  set("MNCL_BACKEND", "Shm,AUTO,/opt/Plugins/libmncl-X.so");
  set("MNCL_BACKEND_HOST", "FLAT");
  set("MNCL_BIND", "NUMA");
  set("MNCL_MEMORY", "Host");
  const LaunchSettings s = resolve();
  EXPECT_EQ(s.backend_spec, "Shm,auto,/opt/Plugins/libmncl-X.so");
  EXPECT_EQ(s.backend_host, "FLAT");
  EXPECT_EQ(s.bind, "numa");
  EXPECT_EQ(s.memory, "host");
}

// A job the TCP store could never start (it waits for at most 2^20 keys at once) is refused
// by its variable, before rank 0 allocates for it.
TEST_F(LaunchEnv, SizeBeyondTheStoreIsRefusedByItsVariable) {
  torchrun_pair(0, (1 << 20) + 1);
  EXPECT_TRUE(contains(error_of([] { resolve(); }, MNCL_ERR_INVALID_ARGUMENT), "WORLD_SIZE"));
  torchrun_pair(0, 1 << 20);
  EXPECT_EQ(resolve().size, 1 << 20);
}

TEST_F(LaunchEnv, TorchrunAgentStorePortIsRefusedAtOnce) {
  unsetenv("MNCL_STORE");
  torchrun_pair(1, 2);
  set("MASTER_ADDR", "node0");
  set("MASTER_PORT", "29500");
  set("TORCHELASTIC_RUN_ID", "job7");
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  const auto message = error_of([] { resolve(); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_TRUE(contains(message, "torchrun")) << message;
  EXPECT_TRUE(contains(message, "MNCL_STORE=tcp://node0:<another")) << message;
  // Named outright, the same address is refused too.
  set("MNCL_STORE", "tcp://node0:29500");
  error_of([] { resolve(); }, MNCL_ERR_BOOTSTRAP);
  set("MNCL_STORE", "tcp://node0:29501");
  EXPECT_EQ(resolve().store_url, "tcp://node0:29501");
  unsetenv("MNCL_STORE");
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  EXPECT_EQ(resolve().store_url, "tcp://node0:29500");
}

TEST_F(LaunchEnv, MissingStoreSaysWhereTheSizeCameFromAndWhatIsMissing) {
  unsetenv("MNCL_STORE");
  srun(0, 4);
  auto message = error_of([] { resolve(); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_TRUE(contains(message, "a job of 4 ranks (from SLURM_NTASKS)")) << message;

  set("MASTER_ADDR", "node0");
  message = error_of([] { resolve(); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_TRUE(contains(message, "MASTER_ADDR is set (node0) but MASTER_PORT is not")) << message;

  unsetenv("MASTER_ADDR");
  set("MASTER_PORT", "29500");
  message = error_of([] { resolve(); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_TRUE(contains(message, "MASTER_PORT is set (29500) but MASTER_ADDR is not")) << message;
}

// ---------------------------------------------------------------------------------------------
// The variables' table and env::get's log lines.
// ---------------------------------------------------------------------------------------------

TEST(EnvTable, LocalSizeHelpNamesOnlyVariablesThatAreRead) {
  const auto *local_size = env::find("MNCL_LOCAL_SIZE");
  ASSERT_NE(local_size, nullptr);
  EXPECT_FALSE(contains(local_size->doc, "SLURM_NTASKS_PER_NODE")) << local_size->doc;
  for (const char *name : {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID"}) {
    EXPECT_NE(env::find(name), nullptr) << name;
  }
}

// What env::get logs the first time this process reads name.
std::string logged_by_get(const char *name) {
  ::testing::internal::CaptureStderr();
  env::get(name);
  return ::testing::internal::GetCapturedStderr();
}

TEST(EnvLog, SecretValuesAreNeverLogged) {
  ASSERT_GE(log::level(), log::kInfo) << "MNCL_DEBUG=info is set before main";
  setenv("MNCL_STORE_TOKEN", "3858b2a4c0ffee11", 1);
  const std::string text = logged_by_get("MNCL_STORE_TOKEN");
  EXPECT_TRUE(contains(text, "MNCL_STORE_TOKEN")) << text;
  EXPECT_FALSE(contains(text, "3858b2a4")) << text;
  // Any name that says it is one: a plugin's own.
  setenv("ACME_PLUGIN_API_KEY", "hunter2-topsecret", 1);
  const std::string plugin = logged_by_get("ACME_PLUGIN_API_KEY");
  EXPECT_FALSE(contains(plugin, "hunter2")) << plugin;
  // An ordinary value is still shown (a variable no other test of this program reads).
  setenv("MNCL_NAIVE_PART_BYTES", "77", 1);
  EXPECT_TRUE(contains(logged_by_get("MNCL_NAIVE_PART_BYTES"), "77"));
  unsetenv("MNCL_STORE_TOKEN");
  unsetenv("ACME_PLUGIN_API_KEY");
  unsetenv("MNCL_NAIVE_PART_BYTES");

  EXPECT_EQ(env::shown_value("MNCL_STORE_TOKEN", "abc"), "set (hidden)");
  EXPECT_EQ(env::shown_value("db_password", "abc"), "set (hidden)");
  EXPECT_EQ(env::shown_value("MNCL_TIMEOUT", "30"), "30");
  EXPECT_EQ(env::shown_value("MNCL_TIMEOUT", nullptr), "(unset)");
}

// A third-party plugin reads its own variables through the host's get_env: no warning for
// them; an MNCL_* name the table lacks (a typo) still gets one.
TEST(EnvLog, OnlyUnknownMnclNamesDrawAWarning) {
  const mncl_host_v1_t *host = loader::host_services();
  setenv("ACME_FABRIC_IFNAME", "eth9", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_STREQ(host->get_env("ACME_FABRIC_IFNAME"), "eth9");
  std::string text = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(text, "not a documented")) << text;

  setenv("MNCL_NO_SUCH_KNOB_FOR_TESTS", "1", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_STREQ(host->get_env("MNCL_NO_SUCH_KNOB_FOR_TESTS"), "1");
  text = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(text, "MNCL_NO_SUCH_KNOB_FOR_TESTS is not a documented MNCL variable"))
      << text;
  unsetenv("ACME_FABRIC_IFNAME");
  unsetenv("MNCL_NO_SUCH_KNOB_FOR_TESTS");
}

// A misspelt variable is never read, so no read could warn about it: the environment's MNCL_*
// names are compared with the table, each unknown one with the name it most likely meant.
TEST(EnvLog, UnknownNamesSetInTheEnvironmentAreFoundWithWhatTheyMeant) {
  const std::pair<const char *, const char *> cases[] = {
      {"MNCL_TIMOUT", "MNCL_TIMEOUT"},            // a letter missing
      {"MNCL_BAKCEND", "MNCL_BACKEND"},           // two swapped
      {"MNCL_LOG_LEVEL", "MNCL_DEBUG"},           // another library's name for it
      {"MNCL_SOCKET_IFNAME", "MNCL_GLOO_IFACE"},  // NCCL's
      {"MNCL_FROBNICATE", ""},                    // nothing near
  };
  for (const auto &[name, meant] : cases) setenv(name, "1", 1);
  setenv("MNCL_TEST_SOMETHING", "1", 1);  // the test suite's own hooks are not reported
  const auto unknown = env::unknown_variables();
  for (const auto &[name, meant] : cases) {
    const auto it = std::find_if(unknown.begin(), unknown.end(),
                                 [&](const env::Unknown &u) { return u.name == name; });
    ASSERT_NE(it, unknown.end()) << name;
    EXPECT_EQ(it->meant, meant) << name;
  }
  for (const auto &u : unknown) {
    EXPECT_EQ(env::find(u.name), nullptr) << u.name;
    EXPECT_NE(u.name, "MNCL_TEST_SOMETHING");
  }
  EXPECT_EQ(env::describe_unknown({"MNCL_TIMOUT", "MNCL_TIMEOUT"}),
            "MNCL_TIMOUT is not a documented MNCL variable and has no effect (did you mean "
            "MNCL_TIMEOUT?)");
  for (const auto &[name, meant] : cases) unsetenv(name);
  unsetenv("MNCL_TEST_SOMETHING");
}

// A third party's plugin on the search path (libmncl-my-net.so) reads MNCL_MY_NET_*, which the
// table cannot know: those are its own, not typos (each rank warned, and mncl-info exited 1).
// The built-in plugins' namespaces stay checked, and a name of no plugin is still unknown.
TEST(EnvLog, APluginsOwnVariablesAreNotUnknown) {
  char dir_template[] = "/tmp/mncl-env-plugins-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // Only the names count here: a third party's, a built-in's, one that overlaps MNCL_TIMEOUT.
  for (const char *file : {"libmncl-my-net.so", "libmncl-nccl.so", "libmncl-timeout.so"}) {
    std::ofstream(dir + "/" + file) << "only its name counts here\n";
  }
  const char *saved = std::getenv("MNCL_PLUGIN_PATH");
  const std::string saved_path = saved ? saved : "";
  setenv("MNCL_PLUGIN_PATH", dir.c_str(), 1);
  setenv("MNCL_MY_NET_RAILS", "4", 1);
  setenv("MNCL_GLOO_IFAC", "lo", 1);
  setenv("MNCL_OTHER_NET_RAILS", "4", 1);
  setenv("MNCL_NCCL_DEBUG", "INFO", 1);
  setenv("MNCL_TIMEOUT_S", "3", 1);
  // Links the loader into this test (libmncl.so always has it): its static initializer gives
  // env the plugins' names. And the search path is this folder.
  const auto dirs = loader::search_path();
  EXPECT_NE(std::find(dirs.begin(), dirs.end(), dir), dirs.end());
  const auto unknown = env::unknown_variables();
  const auto has = [&](const char *name) {
    return std::any_of(unknown.begin(), unknown.end(),
                       [&](const env::Unknown &u) { return u.name == name; });
  };
  EXPECT_FALSE(has("MNCL_MY_NET_RAILS"));
  EXPECT_TRUE(has("MNCL_GLOO_IFAC"));
  EXPECT_TRUE(has("MNCL_OTHER_NET_RAILS"));
  EXPECT_TRUE(has("MNCL_NCCL_DEBUG"));
  EXPECT_TRUE(has("MNCL_TIMEOUT_S"));
  for (const char *name : {"MNCL_MY_NET_RAILS", "MNCL_GLOO_IFAC", "MNCL_OTHER_NET_RAILS",
                           "MNCL_NCCL_DEBUG", "MNCL_TIMEOUT_S"}) {
    unsetenv(name);
  }
  if (saved) {
    setenv("MNCL_PLUGIN_PATH", saved_path.c_str(), 1);
  } else {
    unsetenv("MNCL_PLUGIN_PATH");
  }
  for (const char *file : {"libmncl-my-net.so", "libmncl-nccl.so", "libmncl-timeout.so"}) {
    std::remove((dir + "/" + file).c_str());
  }
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace mncl::core

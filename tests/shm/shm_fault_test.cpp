// Failure tests of the shm backend: real processes, a fresh file:// store, and /dev/shm checked
// for the job's segment (named /dev/shm/mncl-shm-<pid of rank 0>-...) after every scenario.
//
//   shm_fault_test --scenario S [--ranks 4] [--timeout 5]     the driver
//   shm_fault_test --worker                                   one rank (started by the driver)
//
// Scenarios (each rank loops over a small and a large allreduce; the driver acts once every
// rank has run 10 iterations):
//   normal   the ranks run 50 iterations, destroy and exit 0
//   kill     SIGKILL the last rank: every survivor fails with MNCL_ERR_REMOTE ("died")
//            within MNCL_TIMEOUT + 2 s
//   stop     SIGSTOP the last rank: every survivor fails with MNCL_ERR_TIMEOUT naming it
//            within MNCL_TIMEOUT + 2 s
//   abort    rank 0 calls mncl_comm_abort from a second thread: every rank's blocked call
//            fails with MNCL_ERR_ABORTED well before the timeout (the driver sets 60 s)
//   killall  SIGKILL every rank at once (the whole job killed)
//   twohosts the ranks pose as two hosts (MNCL_SHM_FAKE_HOST): every rank's mncl_comm_create
//            fails with MNCL_ERR_NOT_SUPPORTED saying "ranks span 2 hosts"
// and in all of them no segment of the job may be left in /dev/shm, during the run (it is
// unlinked as soon as every rank has mapped it) or after.
#include <dirent.h>
#include <mncl/mncl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Exit codes of a worker.
constexpr int kExitRemote = 0, kExitTimeout = 10, kExitAborted = 11, kExitOther = 2,
              kExitCreate = 3;

int worker() {
  const char *scenario = std::getenv("SHM_FAULT_SCENARIO");
  const int ready_fd = std::atoi(std::getenv("SHM_FAULT_READY_FD"));
  const bool normal = std::strcmp(scenario, "normal") == 0;
  mncl_comm_t comm = nullptr;
  mncl_status_t st = mncl_comm_create(nullptr, &comm);
  if (std::strcmp(scenario, "twohosts") == 0) {
    std::fprintf(stderr, "worker: mncl_comm_create: %s: %s\n", mncl_status_string(st),
                 mncl_last_error());
    const char byte = 'r';
    if (write(ready_fd, &byte, 1) != 1) return kExitOther;
    return st == MNCL_ERR_NOT_SUPPORTED && std::strstr(mncl_last_error(), "span 2 hosts")
               ? 0
               : kExitOther;
  }
  if (st != MNCL_OK) {
    std::fprintf(stderr, "worker: mncl_comm_create: %s\n", mncl_last_error());
    return kExitCreate;
  }
  int rank = -1;
  mncl_comm_rank(comm, &rank);
  std::vector<float> small(64, 1.0f), big(256 * 1024, 1.0f), out(big.size());
  std::thread aborter;
  const auto start = Clock::now();
  for (long it = 0;; ++it) {
    const auto t = Clock::now();
    std::vector<float> &in = it % 2 ? big : small;
    st = mncl_allreduce(comm, in.data(), out.data(), in.size(), MNCL_FLOAT32, MNCL_SUM, nullptr);
    if (st != MNCL_OK) {
      std::fprintf(stderr, "rank %d: call %ld failed after %.2f s: %s: %s\n", rank, it, since(t),
                   mncl_status_string(st), mncl_last_error());
      if (aborter.joinable()) aborter.join();
      switch (st) {  // no destroy: the point is how soon the failing call returned
        case MNCL_ERR_REMOTE:
          return std::strstr(mncl_last_error(), "died") ? kExitRemote : kExitOther;
        case MNCL_ERR_TIMEOUT:
          return kExitTimeout;
        case MNCL_ERR_ABORTED:
          return kExitAborted;
        default:
          return kExitOther;
      }
    }
    if (it == 10) {
      const char byte = 'r';
      if (write(ready_fd, &byte, 1) != 1) return kExitOther;
      close(ready_fd);
      if (std::strcmp(scenario, "abort") == 0 && rank == 0) {
        aborter = std::thread([comm] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          std::fprintf(stderr, "rank 0: calling mncl_comm_abort\n");
          mncl_comm_abort(comm);
        });
      }
    }
    if (normal && it == 50) {
      st = mncl_comm_destroy(comm);
      return st == MNCL_OK ? 0 : kExitOther;
    }
    if (since(start) > 300) return kExitOther;  // the driver has long given up
  }
}

// The job's segments still in /dev/shm.
std::vector<std::string> leftovers(pid_t rank0) {
  std::vector<std::string> found;
  const std::string prefix = "mncl-shm-" + std::to_string(rank0) + "-";
  if (DIR *d = opendir("/dev/shm")) {
    while (dirent *e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.push_back(e->d_name);
    }
    closedir(d);
  }
  return found;
}

bool check_leftovers(pid_t rank0, const char *when) {
  const std::vector<std::string> left = leftovers(rank0);
  for (const std::string &name : left) {
    std::printf("FAIL: /dev/shm/%s is still there %s\n", name.c_str(), when);
  }
  if (left.empty()) std::printf("/dev/shm: nothing of this job %s\n", when);
  return left.empty();
}

const char *expect_text(int expect) {
  switch (expect) {
    case kExitRemote:
      return " (FAIL: expected MNCL_ERR_REMOTE naming a dead rank: exit 0)";
    case kExitTimeout:
      return " (FAIL: expected MNCL_ERR_TIMEOUT: exit 10)";
    case kExitAborted:
      return " (FAIL: expected MNCL_ERR_ABORTED: exit 11)";
    default:
      return " (FAIL: unexpected exit)";
  }
}

int driver(const std::string &scenario, int ranks, int timeout_s, const char *self) {
  if (scenario == "abort") timeout_s = 60;  // abort must beat the timeout by far
  const double bound = scenario == "abort" ? 5.0 : timeout_s + 2.0;
  char dir_template[] = "/tmp/mncl-shm-fault-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string store = std::string("file://") + dir_template;
  int ready[2];
  if (pipe(ready) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      close(ready[0]);
      setenv("MNCL_RANK", std::to_string(r).c_str(), 1);
      setenv("MNCL_SIZE", std::to_string(ranks).c_str(), 1);
      setenv("MNCL_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MNCL_LOCAL_SIZE", std::to_string(ranks).c_str(), 1);
      setenv("MNCL_STORE", store.c_str(), 1);
      setenv("MNCL_TIMEOUT", std::to_string(timeout_s).c_str(), 1);
      setenv("MNCL_BACKEND", "shm", 1);
      setenv("SHM_FAULT_SCENARIO", scenario.c_str(), 1);
      setenv("SHM_FAULT_READY_FD", std::to_string(ready[1]).c_str(), 1);
      if (scenario == "twohosts") setenv("MNCL_SHM_FAKE_HOST", r < ranks / 2 ? "a" : "b", 1);
      execl(self, self, "--worker", static_cast<char *>(nullptr));
      std::perror("execl");
      _exit(127);
    }
    pids.push_back(pid);
  }
  close(ready[1]);
  auto kill_all = [&] {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) kill(p, SIGCONT);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    std::filesystem::remove_all(dir_template);
  };

  int got = 0;
  while (got < ranks) {
    char buf[16];
    const ssize_t n = read(ready[0], buf, sizeof buf);
    if (n <= 0) {
      std::printf("FAIL: a rank ended before the loop was running\n");
      kill_all();
      return 1;
    }
    got += static_cast<int>(n);
  }
  close(ready[0]);
  bool ok = check_leftovers(pids[0], "while the job runs");

  // The ranks whose outcome is checked, and the exit code each must give.
  std::vector<int> watched;
  int expect = 0;
  const auto acted = Clock::now();
  const pid_t victim = pids.back();
  if (scenario == "kill") {
    kill(victim, SIGKILL);
    waitpid(victim, nullptr, 0);
    std::printf("killed rank %d (pid %d); bound for the survivors %.1f s\n", ranks - 1,
                static_cast<int>(victim), bound);
    for (int r = 0; r < ranks - 1; ++r) watched.push_back(r);
    expect = kExitRemote;
  } else if (scenario == "stop") {
    kill(victim, SIGSTOP);
    std::printf("stopped rank %d (pid %d); bound for the others %.1f s\n", ranks - 1,
                static_cast<int>(victim), bound);
    for (int r = 0; r < ranks - 1; ++r) watched.push_back(r);
    expect = kExitTimeout;
  } else if (scenario == "abort") {
    std::printf("rank 0 aborts; bound for every rank %.1f s\n", bound);
    for (int r = 0; r < ranks; ++r) watched.push_back(r);
    expect = kExitAborted;
  } else if (scenario == "killall") {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    std::printf("killed all %d ranks\n", ranks);
  } else {  // normal, twohosts: every rank exits 0 by itself
    for (int r = 0; r < ranks; ++r) watched.push_back(r);
    expect = 0;
  }

  std::vector<bool> done(static_cast<size_t>(ranks), false);
  size_t remaining = watched.size();
  while (remaining > 0 && since(acted) < bound + 5) {
    for (int r : watched) {
      if (done[static_cast<size_t>(r)]) continue;
      int status = 0;
      if (waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) != pids[size_t(r)]) continue;
      done[static_cast<size_t>(r)] = true;
      --remaining;
      const double t = since(acted);
      const bool exited = WIFEXITED(status);
      const bool right = exited && WEXITSTATUS(status) == expect;
      const bool late = scenario != "normal" && scenario != "twohosts" && t > bound;
      std::printf("rank %d: %s %d after %.2f s%s\n", r, exited ? "exit" : "signal",
                  exited ? WEXITSTATUS(status) : WTERMSIG(status), t,
                  !right ? expect_text(expect)
                  : late ? " (FAIL: too late)"
                         : "");
      if (!right || late) ok = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (remaining > 0) {
    std::printf("FAIL: %zu rank(s) still running %.1f s after the event\n", remaining,
                since(acted));
    ok = false;
  }
  kill_all();
  ok = check_leftovers(pids[0], "after the job") && ok;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  int ranks = 4, timeout_s = 5;
  std::string scenario = "kill";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--worker") return worker();
    if (a == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::atoi(argv[++i]);
    } else if (a == "--scenario" && i + 1 < argc) {
      scenario = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s --scenario normal|kill|stop|abort|killall|twohosts [--ranks N] "
                   "[--timeout SECONDS]\n",
                   argv[0]);
      return 2;
    }
  }
  if (ranks < 2 || timeout_s < 1) {
    std::fprintf(stderr, "need --ranks >= 2 and --timeout >= 1\n");
    return 2;
  }
  return driver(scenario, ranks, timeout_s, "/proc/self/exe");
}

// gloo.kill_one_rank: SIGKILL one rank of an allreduce loop; every survivor must get an error
// (MNCL_ERR_REMOTE or MNCL_ERR_TIMEOUT) within MNCL_TIMEOUT + 2 s of the kill, never hang.
//
//   gloo_kill_test [--ranks 4] [--timeout 10]       the driver: starts the ranks, kills one
//   gloo_kill_test --worker                         one rank (started by the driver)
//
// The driver runs the ranks itself (fork/exec of this binary, a fresh file:// store), so it
// knows their pids and the instant of the kill. The victim is the last rank; rank 0 hosts
// nothing a file store needs, so any rank could be chosen.
#include <fcntl.h>
#include <mncl/mncl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

// One rank: allreduce forever; signal readiness after a few calls; exit 0 on the expected
// error, 2 on any other status.
int worker() {
  const char *ready_fd_text = std::getenv("GLOO_KILL_TEST_READY_FD");
  const int ready_fd = ready_fd_text ? std::atoi(ready_fd_text) : -1;
  mncl_comm_t comm = nullptr;
  mncl_status_t st = mncl_comm_create(nullptr, &comm);
  if (st != MNCL_OK) {
    std::fprintf(stderr, "worker: mncl_comm_create: %s\n", mncl_last_error());
    return 2;
  }
  int rank = -1;
  mncl_comm_rank(comm, &rank);
  std::vector<float> send(64 * 1024, 1.0f), recv(send.size());
  const auto start = Clock::now();
  for (long it = 0;; ++it) {
    const auto t = Clock::now();
    st = mncl_allreduce(comm, send.data(), recv.data(), send.size(), MNCL_FLOAT32, MNCL_SUM,
                        nullptr);
    if (st != MNCL_OK) {
      std::fprintf(stderr, "rank %d: call %ld failed after %.2f s: %s: %s\n", rank, it, since(t),
                   mncl_status_string(st), mncl_last_error());
      // No destroy: the point is how soon the failing call itself returned.
      return (st == MNCL_ERR_REMOTE || st == MNCL_ERR_TIMEOUT) ? 0 : 2;
    }
    if (it == 10 && ready_fd >= 0) {
      const char byte = 'r';
      if (write(ready_fd, &byte, 1) != 1) return 2;
      close(ready_fd);
    }
    if (since(start) > 300) return 3;  // the driver has long given up
  }
}

int driver(int ranks, int timeout_s, const char *self) {
  const double bound = timeout_s + 2.0;
  char dir_template[] = "/tmp/mncl-gloo-kill-XXXXXX";
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
      setenv("MNCL_BACKEND", "gloo", 0);
      setenv("GLOO_KILL_TEST_READY_FD", std::to_string(ready[1]).c_str(), 1);
      execl(self, self, "--worker", static_cast<char *>(nullptr));
      std::perror("execl");
      _exit(127);
    }
    pids.push_back(pid);
  }
  close(ready[1]);

  auto kill_all = [&] {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    std::filesystem::remove_all(dir_template);
  };
  // Every rank is in its loop once it has written its byte (EOF early means one died).
  int got = 0;
  while (got < ranks) {
    char buf[16];
    const ssize_t n = read(ready[0], buf, sizeof buf);
    if (n <= 0) {
      std::fprintf(stderr, "FAIL: a rank ended before the loop was running\n");
      kill_all();
      return 1;
    }
    got += static_cast<int>(n);
  }
  close(ready[0]);

  const pid_t victim = pids.back();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(victim, SIGKILL);
  const auto killed = Clock::now();
  waitpid(victim, nullptr, 0);
  std::printf("killed rank %d (pid %d) with SIGKILL; bound for the survivors: %.1f s\n", ranks - 1,
              static_cast<int>(victim), bound);

  bool ok = true;
  std::vector<bool> done(static_cast<size_t>(ranks) - 1, false);
  int remaining = ranks - 1;
  while (remaining > 0 && since(killed) < bound + 5) {
    for (int r = 0; r < ranks - 1; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      int status = 0;
      if (waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) != pids[static_cast<size_t>(r)]) {
        continue;
      }
      done[static_cast<size_t>(r)] = true;
      --remaining;
      const double t = since(killed);
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      std::printf("rank %d: %s %d after %.2f s%s\n", r, WIFEXITED(status) ? "exit" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), t,
                  !clean      ? " (FAIL: not the expected remote/timeout error)"
                  : t > bound ? " (FAIL: too late)"
                              : "");
      if (!clean || t > bound) ok = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (remaining > 0) {
    std::printf("FAIL: %d survivor(s) still blocked %.1f s after the kill\n", remaining,
                since(killed));
    ok = false;
  }
  kill_all();
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  int ranks = 4, timeout_s = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--worker") return worker();
    if (a == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--ranks N] [--timeout SECONDS]\n", argv[0]);
      return 2;
    }
  }
  if (ranks < 2 || timeout_s < 1) {
    std::fprintf(stderr, "need --ranks >= 2 and --timeout >= 1\n");
    return 2;
  }
  // /proc/self/exe: the driver re-executes itself whatever the working directory.
  return driver(ranks, timeout_s, "/proc/self/exe");
}

// Failure tests of the shm backend: real processes, a fresh file:// store, and /dev/shm checked
// for the job's segment (named /dev/shm/mncl-shm-<pid of rank 0>-...) after every scenario.
//
//   shm_fault_test --scenario S [--ranks 4] [--timeout 5]     the driver
//   shm_fault_test --worker                                   one rank (started by the driver)
//
// Scenarios (kill to twohosts: each rank loops over a small and a large allreduce, and the driver
// acts once every rank has run 10 iterations; pidns, revoke, mainexit run their own calls):
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
//   pidns    ranks 1 and 2 each run in a PID namespace of their own (clone(CLONE_NEWPID), as
//            `unshare --pid --fork`; each is pid 1 there), ranks 0 and 3 in the driver's, all
//            sharing /dev/shm (containers with --ipc=host): rank 0 enters three barriers late
//            and no rank may call it dead (its pid means nothing, or another process, in the
//            other namespaces); then every ordered pair exchanges a 4 MiB message (above the
//            single-copy threshold), which must arrive exactly. ASLR is off in the ranks
//            (personality), so a receiver that took a peer's pid 1 for the sender would read its
//            own buffer at the sender's address: the wrong data with MNCL_OK. Exits 77 (skipped)
//            when creating a PID namespace is not permitted (needs root or CAP_SYS_ADMIN).
//            The store is a TCP one served by rank 0: the file store's temp names (hostname and
//            pid) would collide between the two ranks that are each pid 1.
//   revoke   rank 1 sends rank 0 a 4 MiB message (offered for a single copy) from a buffer whose
//            pages are missing under userfaultfd, so rank 0's process_vm_readv blocks in it;
//            on that fault rank 1 calls mncl_comm_abort, its send revokes the offer and returns,
//            and only then are the pages filled: rank 0's receive finds the offer revoked after
//            reading and must end with MNCL_ERR_ABORTED like every other call (ranks 2, 3 in a
//            barrier), not MNCL_ERR_REMOTE "withdrew". Exits 77 (skipped) unless root with a
//            working userfaultfd (a fault from another process's read needs privilege).
//   mainexit the last rank runs MNCL on a second thread after its main thread called
//            pthread_exit (so /proc shows the process as 'Z', its main thread's state) and
//            enters three barriers late: no rank may call it dead
// and in all of them no segment of the job may be left in /dev/shm, during the run (it is
// unlinked as soon as every rank has mapped it) or after.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <mncl/mncl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../../sdk/common/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Exit codes of a worker.
constexpr int kExitRemote = 0, kExitTimeout = 10, kExitAborted = 11, kExitOther = 2,
              kExitCreate = 3;

// pidns, mainexit: each rank checks its own calls and exits 0 if all were right.
int checks_worker(const std::string &scenario, int ready_fd) {
  const int rank = std::atoi(std::getenv("MNCL_RANK")), n = std::atoi(std::getenv("MNCL_SIZE"));
  // Allocated before anything else, the same way on every rank: with ASLR off every rank has
  // them at the same addresses (see pidns above).
  constexpr size_t kBig = size_t{1} << 20;  // int32s: 4 MiB, far above two 32 KiB slots
  auto value = [](int r, size_t i) { return static_cast<int32_t>(r * 10000019 + i); };
  std::vector<int32_t> send(kBig), recv(kBig);
  for (size_t i = 0; i < kBig; ++i) send[i] = value(rank, i);
  mncl_comm_t comm = nullptr;
  mncl_status_t st = mncl_comm_create(nullptr, &comm);
  if (st != MNCL_OK) {
    std::fprintf(stderr, "rank %d: mncl_comm_create: %s\n", rank, mncl_last_error());
    return kExitCreate;
  }
  std::fprintf(stderr, "rank %d: pid %d here\n", rank, static_cast<int>(getpid()));
  const char byte = 'r';
  if (write(ready_fd, &byte, 1) != 1) return kExitOther;
  close(ready_fd);
  auto failed = [&](const char *what) {
    std::fprintf(stderr, "rank %d: %s: %s: %s\n", rank, what, mncl_status_string(st),
                 mncl_last_error());
    return kExitOther;
  };
  // The late rank: the others wait for it long enough to check whether it is alive.
  const int late = scenario == "pidns" ? 0 : n - 1;
  for (int i = 0; i < 3; ++i) {
    if (rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    if ((st = mncl_barrier(comm, nullptr)) != MNCL_OK) return failed("barrier");
  }
  if (scenario == "pidns") {
    for (int src = 0; src < n; ++src) {
      for (int dst = 0; dst < n; ++dst) {
        if (src == dst) continue;
        if (rank == src) {
          st = mncl_send(comm, send.data(), kBig, MNCL_INT32, dst, nullptr);
          if (st != MNCL_OK) return failed("send");
        } else if (rank == dst) {
          std::fill(recv.begin(), recv.end(), -1);
          st = mncl_recv(comm, recv.data(), kBig, MNCL_INT32, src, nullptr);
          if (st != MNCL_OK) return failed("recv");
          size_t wrong = 0;
          for (size_t i = 0; i < kBig; ++i) wrong += recv[i] != value(src, i);
          if (wrong > 0) {
            std::fprintf(stderr,
                         "rank %d: recv from rank %d: MNCL_OK but %zu of %zu elements wrong "
                         "([0] = %d, expected %d)\n",
                         rank, src, wrong, kBig, recv[0], value(src, 0));
            return kExitOther;
          }
        }
      }
    }
    if ((st = mncl_barrier(comm, nullptr)) != MNCL_OK) return failed("final barrier");
  }
  if ((st = mncl_comm_destroy(comm)) != MNCL_OK) return failed("destroy");
  std::fprintf(stderr, "rank %d: all calls right\n", rank);
  return 0;
}

// A userfaultfd that reports missing pages of `len` bytes at `addr`; -1 on failure.
int missing_pages_fd(void *addr, size_t len) {
  const int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC));
  if (fd < 0) return -1;
  uffdio_api api{};
  api.api = UFFD_API;
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<uintptr_t>(addr);
  reg.range.len = len;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  if (ioctl(fd, UFFDIO_API, &api) != 0 || ioctl(fd, UFFDIO_REGISTER, &reg) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int revoke_worker(int ready_fd) {
  mncl_comm_t comm = nullptr;
  if (mncl_comm_create(nullptr, &comm) != MNCL_OK) {
    std::fprintf(stderr, "worker: mncl_comm_create: %s\n", mncl_last_error());
    return kExitCreate;
  }
  int rank = -1;
  mncl_comm_rank(comm, &rank);
  const char byte = 'r';
  if (write(ready_fd, &byte, 1) != 1) return kExitOther;
  close(ready_fd);
  constexpr size_t kBytes = size_t{4} << 20;
  mncl_status_t st = MNCL_OK;
  if (rank == 1) {
    void *buf = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const int uffd = buf == MAP_FAILED ? -1 : missing_pages_fd(buf, kBytes);
    if (uffd < 0) {
      std::perror("rank 1: userfaultfd");
      return kExitOther;
    }
    std::atomic<bool> returned{false};
    std::thread pager([&] {
      pollfd p{uffd, POLLIN, 0};
      if (poll(&p, 1, 20000) == 1) {  // rank 0 is reading the offered buffer
        std::fprintf(stderr, "rank 1: rank 0 reads the offer: calling mncl_comm_abort\n");
        mncl_comm_abort(comm);
        const auto t = Clock::now();
        while (!returned.load() && since(t) < 20) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      } else {
        std::fprintf(stderr, "rank 1: FAIL: nobody read the offered buffer within 20 s\n");
      }
      uffdio_zeropage zero{};  // lets rank 0's read finish
      zero.range.start = reinterpret_cast<uintptr_t>(buf);
      zero.range.len = kBytes;
      ioctl(uffd, UFFDIO_ZEROPAGE, &zero);
    });
    st = mncl_send(comm, buf, kBytes / 4, MNCL_INT32, 0, nullptr);
    returned.store(true);
    pager.join();
  } else if (rank == 0) {
    std::vector<int32_t> out(kBytes / 4);
    st = mncl_recv(comm, out.data(), out.size(), MNCL_INT32, 1, nullptr);
  } else {
    st = mncl_barrier(comm, nullptr);
  }
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, mncl_status_string(st),
               st != MNCL_OK ? mncl_last_error() : "");
  return st == MNCL_ERR_ABORTED ? kExitAborted : kExitOther;
}

int worker() {
  const char *scenario = std::getenv("SHM_FAULT_SCENARIO");
  const int ready_fd = std::atoi(std::getenv("SHM_FAULT_READY_FD"));
  if (std::strcmp(scenario, "revoke") == 0) return revoke_worker(ready_fd);
  if (std::strcmp(scenario, "pidns") == 0) return checks_worker(scenario, ready_fd);
  if (std::strcmp(scenario, "mainexit") == 0) {
    if (std::atoi(std::getenv("MNCL_RANK")) != std::atoi(std::getenv("MNCL_SIZE")) - 1) {
      return checks_worker(scenario, ready_fd);
    }
    // The process lives on in this thread; the main thread's /proc state is 'Z' from here on.
    std::thread([scenario, ready_fd] {
      const int code = checks_worker(scenario, ready_fd);
      std::fflush(nullptr);
      _exit(code);
    }).detach();
    pthread_exit(nullptr);
  }
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

const char *expect_text(const std::string &scenario, int expect) {
  if (scenario == "normal" || scenario == "twohosts" || scenario == "pidns" ||
      scenario == "mainexit") {
    return " (FAIL: expected exit 0: every call right)";
  }
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

// Whether this process may create a PID namespace: a child tries.
bool can_create_pid_namespace(std::string *why) {
  const long pid = syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0);
  if (pid < 0) {
    *why = std::strerror(errno);
    return false;
  }
  if (pid == 0) _exit(getpid() == 1 ? 0 : 1);
  int status = 0;
  waitpid(static_cast<pid_t>(pid), &status, 0);
  *why = "the child was not pid 1 in its namespace";
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

constexpr int kSkipped = 77;  // ctest's SKIP_RETURN_CODE

// A loopback port free a moment ago (rank 0 binds it soon after).
int free_port() {
  return mncl::free_loopback_port();  // outside the ephemeral range (see there)
}

// Whether rank 1 can stall rank 0's process_vm_readv with userfaultfd: a fault raised by another
// process's read is a kernel-mode one, which only a privileged userfaultfd reports.
bool can_stall_remote_reads(std::string *why) {
  if (geteuid() != 0) {
    *why = "not root";
    return false;
  }
  void *page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const int fd = page == MAP_FAILED ? -1 : missing_pages_fd(page, 4096);
  if (fd < 0) *why = std::string("userfaultfd: ") + std::strerror(errno);
  if (fd >= 0) close(fd);
  if (page != MAP_FAILED) munmap(page, 4096);
  return fd >= 0;
}

int driver(const std::string &scenario, int ranks, int timeout_s, const char *self) {
  if (scenario == "revoke") {
    std::string why;
    if (!can_stall_remote_reads(&why)) {
      std::printf("SKIP: cannot stall a single-copy read (%s): needs root and userfaultfd\n",
                  why.c_str());
      return kSkipped;
    }
  }
  if (scenario == "pidns") {
    std::string why;
    if (ranks < 4) {
      std::fprintf(stderr, "pidns needs --ranks >= 4\n");
      return 2;
    }
    if (!can_create_pid_namespace(&why)) {
      std::printf("SKIP: cannot create a PID namespace (%s): needs root or CAP_SYS_ADMIN\n",
                  why.c_str());
      return kSkipped;
    }
  }
  const bool aborts = scenario == "abort" || scenario == "revoke";
  if (aborts) timeout_s = 60;  // abort must beat the timeout by far
  const double bound = aborts ? 5.0 : timeout_s + 2.0;
  char dir_template[] = "/tmp/mncl-shm-fault-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string store = std::string("file://") + dir_template;
  if (scenario == "pidns") {
    // The file store names its temp files by hostname and pid, which ranks that are each pid 1
    // of their own namespace share; rank 0 serves a TCP store instead (as mncl-run does).
    const int port = free_port();
    if (port < 0) {
      std::perror("free port");
      return 1;
    }
    store = "tcp://127.0.0.1:" + std::to_string(port);
  }
  int ready[2];
  if (pipe(ready) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    // pidns: ranks 1 and 2 start as pid 1 of a namespace of their own (clone with a null stack
    // is fork into it).
    const bool own_ns = scenario == "pidns" && (r == 1 || r == 2);
    const pid_t pid =
        own_ns ? static_cast<pid_t>(syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0))
               : fork();
    if (pid < 0) {
      std::perror(own_ns ? "clone(CLONE_NEWPID)" : "fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      if (scenario == "pidns" && personality(ADDR_NO_RANDOMIZE) == -1) {
        std::perror("personality(ADDR_NO_RANDOMIZE) (the check is weaker with ASLR on)");
      }
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
  } else if (aborts) {
    std::printf("rank %d aborts; bound for every rank %.1f s\n", scenario == "abort" ? 0 : 1,
                bound);
    for (int r = 0; r < ranks; ++r) watched.push_back(r);
    expect = kExitAborted;
  } else if (scenario == "killall") {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    std::printf("killed all %d ranks\n", ranks);
  } else {  // normal, twohosts, pidns, mainexit: every rank exits 0 by itself
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
      const bool late = (scenario == "kill" || scenario == "stop" || aborts) && t > bound;
      std::printf("rank %d: %s %d after %.2f s%s\n", r, exited ? "exit" : "signal",
                  exited ? WEXITSTATUS(status) : WTERMSIG(status), t,
                  !right ? expect_text(scenario, expect)
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
                   "usage: %s --scenario normal|kill|stop|abort|killall|twohosts|pidns|"
                   "mainexit|revoke [--ranks N] [--timeout SECONDS]\n",
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

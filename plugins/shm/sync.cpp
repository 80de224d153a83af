#include "shm/sync.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace mncl::shm {

namespace {

uint32_t *word(Flag &f) {
  return reinterpret_cast<uint32_t *>(&f.value);
}

}  // namespace

void post(Flag &f, uint32_t value) {
  f.value.store(value, std::memory_order_seq_cst);
  if (f.waiters.load(std::memory_order_seq_cst) != 0) wake_all(f);
}

void wake_all(Flag &f) {
  syscall(SYS_futex, word(f), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void futex_sleep(Flag &f, uint32_t seen, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
  f.waiters.fetch_add(1, std::memory_order_seq_cst);
  // Re-read after registering: a post in between either changed the value (no sleep: EAGAIN)
  // or saw us in `waiters` and will wake us.
  if (f.value.load(std::memory_order_seq_cst) == seen) {
    syscall(SYS_futex, word(f), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  f.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

namespace {

// True if /proc numbers processes as this process's PID namespace does: a process in a child
// namespace may still see its parent's procfs (unshare --pid without --mount-proc), where
// /proc/<pid> is some other process.
bool proc_is_ours() {
  char link[32];
  const ssize_t n = readlink("/proc/self", link, sizeof link - 1);
  if (n <= 0) return false;
  link[n] = '\0';
  return std::strtol(link, nullptr, 10) == static_cast<long>(getpid());
}

}  // namespace

bool pid_is_dead(pid_t pid) {
  if (pid <= 0) return false;  // unknown: never blame it
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  if (!proc_is_ours()) return false;  // kill() is all we can tell
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE *f = std::fopen(path, "r");
  if (f == nullptr) return false;  // no procfs: kill() is all we can tell
  // "pid (comm) S ...": comm may hold spaces and parentheses, so find the last ')'.
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char *close = nullptr;
  for (const char *p = buf; *p; ++p) {
    if (*p == ')') close = p;
  }
  if (close == nullptr || close[1] != ' ') return false;
  const char state = close[2];
  if (state == 'X') return true;
  if (state != 'Z') return false;
  // 'Z' is the main thread's state only: a process whose main thread called pthread_exit shows
  // it while its other threads run. Dead only when no thread but that zombie is left: field 20,
  // num_threads (17 fields after the state), counts the zombie leader too.
  const char *p = close + 3;
  for (int field = 4; field <= 20 && *p != '\0'; ++field) {
    while (*p == ' ') ++p;
    if (field == 20) {
      char *end = nullptr;
      const long threads = std::strtol(p, &end, 10);
      return end != p && threads <= 1;
    }
    while (*p != ' ' && *p != '\0') ++p;
  }
  return false;  // unreadable: never blame it
}

}  // namespace mncl::shm

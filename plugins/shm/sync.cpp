#include "shm/sync.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>

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

bool pid_is_dead(pid_t pid) {
  if (pid <= 0) return false;  // unknown: never blame it
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
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
  return close[2] == 'Z' || close[2] == 'X';
}

}  // namespace mncl::shm

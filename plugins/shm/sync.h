// Cross-process signalling in the shared segment: monotonic 32-bit counters ("flags") that one
// rank bumps and others wait on, with a short spin, then sched_yield, then a futex sleep.
//
// Why a counter and not a boolean: every wait names the value it needs ("rank 2 has posted at
// least 17 times"), so flags are never reset, a late reader cannot miss a pulse, and the value
// itself says how far a stalled peer got. Comparisons are wrap-aware (uint32 arithmetic).
//
// Sleeping: the waiter registers in `waiters` before it re-reads the value and calls FUTEX_WAIT
// (shared, not PRIVATE: the word lives in a MAP_SHARED segment that each process maps at its
// own address; the kernel keys shared futexes by page, not address). The poster bumps the value
// and calls FUTEX_WAKE only when someone registered, so the common spinning case costs no
// syscall. Both sides use seq_cst, which is what makes "either the waiter sees the new value or
// the poster sees the waiter" hold.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace mncl::shm {

struct Flag {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain uint32");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words must be uint32");

// a >= b on a 32-bit counter that may wrap.
inline bool reached(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) >= 0;
}

// Stores `value` (release) and wakes sleepers if there are any.
void post(Flag &f, uint32_t value);
// Wakes every sleeper on f whatever its value (abort, a peer found dead).
void wake_all(Flag &f);
// Sleeps until f.value changes from `seen` or `timeout_ns` passes (or a spurious wake-up).
void futex_sleep(Flag &f, uint32_t seen, int64_t timeout_ns);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// True if the process is gone: no such pid, or a zombie waiting to be reaped (kill(pid, 0)
// still succeeds on a zombie, and a killed rank whose parent has not waited yet is one) with no
// thread left (a live process whose main thread called pthread_exit shows 'Z' too). The pid is
// one of this process's PID namespace; /proc is read only if it numbers processes the same way.
bool pid_is_dead(pid_t pid);

}  // namespace mncl::shm

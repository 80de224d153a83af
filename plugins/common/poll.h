// Plugin kit: waiting on something that can only be polled (a CUDA stream's cuStreamQuery, an
// MPI test), within a deadline and until a stop flag, instead of in a call that may never
// return (cuStreamSynchronize). Shared by the core's CUDA staging and the flat plugin.
//
//   switch (kit::poll_until([&] { return query(stream) == 0; }, deadline, &aborted)) { ... }
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace mncl::kit {

enum class PollResult { kReady, kTimedOut, kStopped };

// Calls ready() until it returns true (kReady), `deadline` passes (kTimedOut), or *stop (may
// be null) is true (kStopped); ready() is asked first, so work already done is kReady past
// the deadline too. It may throw, which ends the wait. Between calls it yields for the first
// 64, then sleeps 10 µs more each time up to 1 ms: close to a spinning wait's latency for
// short waits, little CPU for long ones.
template <typename Ready>
PollResult poll_until(Ready &&ready, std::chrono::steady_clock::time_point deadline,
                      const std::atomic<bool> *stop) {
  for (unsigned polls = 0;; ++polls) {
    if (ready()) return PollResult::kReady;
    if (stop != nullptr && stop->load()) return PollResult::kStopped;
    if (std::chrono::steady_clock::now() >= deadline) return PollResult::kTimedOut;
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000u, 10 * (polls - 63))));
    }
  }
}

}  // namespace mncl::kit

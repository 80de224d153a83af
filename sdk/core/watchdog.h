// What the core knows about a communicator's operations when one goes wrong.
//
//   OpHistory  the last kOps collectives of one communicator on this rank (kind, sequence
//              number, bytes, state, duration): recorded on every call, dumped into messages.
//   Watchdog   one thread per communicator, started with its first operation. It enforces the
//              operation's timeout itself for plugins that do not (a plugin blocked past
//              timeout + grace): it logs the dump and calls `on_expired`, which aborts the
//              plugin communicator so the blocked call returns MNCL_ERR_TIMEOUT.
//              With a peer check (a communicator of several ranks) a second thread asks,
//              every kPeerPeriod, whether a rank exited or aborted while an operation waits
//              (Comm::watch_peers_while_waiting): backends that wait in MPI or on a GPU (flat,
//              nccl) hear of it from nothing else before their timeout.
//   diagnose   after a collective failed with a timeout or a remote error: every failing rank
//              publishes its state and history under "diag/<rank>", waits a short grace for
//              the others, and names the ranks that never reached the operation, with each
//              rank's last operations. Nothing is exchanged while operations succeed.
#pragma once

#include <mncl/mncl_plugin_v1.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.h"

namespace mncl::core {

class OpHistory {
 public:
  enum class State { kEmpty, kClaimed, kRunning, kDone, kFailed };
  struct Record {
    uint64_t seq = 0;
    int kind = 0;
    int peer = -1;  // send/recv: their sequence numbers count per peer
    size_t bytes = 0;
    State state = State::kRunning;
    std::chrono::steady_clock::time_point start;
    double seconds = 0;  // duration once finished
  };
  static constexpr size_t kOps = 16;  // finished operations kept, at least

  // Room for the last kOps operations plus `max_running` running at once (one per lane:
  // collectives, send/recv per peer and direction). Call before the first begin().
  void set_max_running(size_t max_running);

  // begin/end run on every call: they only store atomics (no lock, no allocation). Writers may
  // be concurrent (one per lane); each claims a slot of its own. A running operation's slot is
  // never reused, however many newer operations finish meanwhile, so the watchdog sees every
  // running operation. Readers (the watchdog, dumps) may see a finished slot mid-rewrite, which
  // only blurs that old entry.
  size_t begin(const mncl_coll_v1_t &coll);
  void end(size_t token, bool ok);
  // The oldest running operation, if any (the watchdog's view).
  bool running(Record *out) const;
  // Every running operation (the peer check's view: what each one waits for).
  std::vector<Record> all_running() const;
  // "allreduce #7 4096 B running 3.2 s; allreduce #6 4096 B done 0.001 s; ..." newest first,
  // at most `max` entries.
  std::string dump(size_t max = 6) const;

 private:
  struct Slot {
    std::atomic<uint64_t> seq{0};
    std::atomic<int> kind{0};
    std::atomic<int> peer{-1};
    std::atomic<size_t> bytes{0};
    std::atomic<State> state{State::kEmpty};
    std::atomic<int64_t> start_ns{0};    // steady_clock
    std::atomic<int64_t> elapsed_ns{0};  // once finished
  };
  Record read(const Slot &slot) const;

  size_t capacity_ = kOps + 1;
  std::unique_ptr<Slot[]> slots_{new Slot[kOps + 1]};
  std::atomic<size_t> next_{0};  // claims so far; slot (claim % capacity_) is tried next
};

class Watchdog {
 public:
  // on_expired(record) runs on the watchdog thread when an operation has run past
  // timeout_ms + grace; it is called at most once per communicator. peer_check, if given,
  // runs every kPeerPeriod on a thread of its own (it may read the store, which a cut link
  // holds up for the store's timeout: the timeout rule must not wait for it); it returns true
  // once it has aborted the communicator, and is not called again.
  // backend: its name, for the warning about a backend that does not end an operation on
  // comm_abort (after_abort_ms past on_expired, the operation still running).
  Watchdog(const OpHistory &history, int64_t timeout_ms,
           std::function<void(const OpHistory::Record &)> on_expired,
           std::function<bool()> peer_check = {}, std::string backend = "");
  ~Watchdog();
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;

  // How long past the timeout the watchdog waits for the plugin to report it itself.
  static int64_t grace_ms(int64_t timeout_ms);
  // How long after its abort an operation may still run before the backend is named as one
  // that does not honour comm_abort: the timeout, at least 1 s and at most 10 s.
  static int64_t after_abort_ms(int64_t timeout_ms);
  // As often as a plugin's store waits look (StoreBridge::kPeerCheckMs).
  static constexpr std::chrono::milliseconds kPeerPeriod{200};
  bool fired() const { return fired_.load(); }

 private:
  void loop();
  void peer_loop();

  const OpHistory &history_;
  const int64_t timeout_ms_;
  const std::string backend_;
  std::function<void(const OpHistory::Record &)> on_expired_;
  std::function<bool()> peer_check_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<bool> fired_{false};
  std::thread thread_;
  std::thread peer_thread_;  // only with a peer check
};

// The diagnosis after collective #op_seq (of kind op_kind, whose fingerprint is `call`, see
// debug_checks.h) failed on this rank (see the top of this file); `history` is this rank's
// OpHistory::dump. Returns
// text to append to the error message ("" when the store cannot be reached). Never throws.
// hosts_store: this process serves the TCP store, and so lingers until the others have read.
std::string diagnose_failure(bootstrap::Store &store, uint64_t op_seq, int op_kind,
                             const std::string &call, int rank, int size, int64_t timeout_ms,
                             const std::string &history, bool hosts_store);
// How long diagnose_failure waits for the other ranks' reports (it may take up to 3 times that
// on the store's host, plus store round trips).
int64_t diagnosis_grace_ms(int64_t timeout_ms);
// Keys diagnose_failure may leave behind, for the leave protocol's cleanup.
std::string diag_key(int rank);
std::string diag_read_key();

}  // namespace mncl::core

#include "core/watchdog.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "core/validate.h"

namespace mncl::core {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const char *state_name(OpHistory::State s) {
  switch (s) {
    case OpHistory::State::kEmpty:
    case OpHistory::State::kClaimed:
      return "starting";
    case OpHistory::State::kRunning:
      return "running";
    case OpHistory::State::kDone:
      return "done";
    case OpHistory::State::kFailed:
      return "failed";
  }
  return "?";
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// OpHistory
// ---------------------------------------------------------------------------------------------

void OpHistory::set_max_running(size_t max_running) {
  capacity_ = kOps + std::max<size_t>(max_running, 1);
  slots_.reset(new Slot[capacity_]);
  next_.store(0);
}

size_t OpHistory::begin(const mncl_coll_v1_t &coll) {
  // Claim the next slot that holds no running operation. kClaimed keeps readers off the slot
  // until its fields are the new operation's (a stale start time would look overdue). More
  // operations running than planned for: after one lap, take a slot regardless.
  Slot *slot = nullptr;
  size_t token = 0;
  for (size_t tries = 0; slot == nullptr; ++tries) {
    token = next_.fetch_add(1, std::memory_order_relaxed);
    Slot &s = slots_[token % capacity_];
    State seen = s.state.load(std::memory_order_relaxed);
    if (seen == State::kClaimed || (seen == State::kRunning && tries < capacity_)) continue;
    if (s.state.compare_exchange_strong(seen, State::kClaimed, std::memory_order_acquire)) {
      slot = &s;
    }
  }
  slot->seq.store(coll.seq, std::memory_order_relaxed);
  slot->kind.store(coll.kind, std::memory_order_relaxed);
  const bool p2p = coll.kind == MNCL_COLL_SEND || coll.kind == MNCL_COLL_RECV;
  slot->peer.store(p2p ? coll.root : -1, std::memory_order_relaxed);
  slot->bytes.store(coll_bytes(coll), std::memory_order_relaxed);
  slot->start_ns.store(now_ns(), std::memory_order_relaxed);
  slot->state.store(State::kRunning, std::memory_order_release);  // publishes the slot
  return token;
}

void OpHistory::end(size_t token, bool ok) {
  Slot &s = slots_[token % capacity_];
  s.elapsed_ns.store(now_ns() - s.start_ns.load(std::memory_order_relaxed),
                     std::memory_order_relaxed);
  s.state.store(ok ? State::kDone : State::kFailed, std::memory_order_release);
}

OpHistory::Record OpHistory::read(const Slot &slot) const {
  Record r;
  r.state = slot.state.load(std::memory_order_acquire);
  r.seq = slot.seq.load(std::memory_order_relaxed);
  r.kind = slot.kind.load(std::memory_order_relaxed);
  r.peer = slot.peer.load(std::memory_order_relaxed);
  r.bytes = slot.bytes.load(std::memory_order_relaxed);
  r.start = Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(slot.start_ns.load(std::memory_order_relaxed))));
  r.seconds = static_cast<double>(slot.elapsed_ns.load(std::memory_order_relaxed)) / 1e9;
  return r;
}

bool OpHistory::running(Record *out) const {
  // Several operations may run at once (one per lane): the oldest one is the watchdog's concern.
  bool found = false;
  for (size_t i = 0; i < capacity_; ++i) {
    const Record r = read(slots_[i]);
    if (r.state != State::kRunning || (found && r.start >= out->start)) continue;
    *out = r;
    found = true;
  }
  return found;
}

std::vector<OpHistory::Record> OpHistory::all_running() const {
  std::vector<Record> records;
  for (size_t i = 0; i < capacity_; ++i) {
    const Record r = read(slots_[i]);
    if (r.state == State::kRunning) records.push_back(r);
  }
  return records;
}

std::string OpHistory::dump(size_t max) const {
  // Slots are not in claim order (running ones are skipped over): order by start time.
  std::vector<Record> records;
  for (size_t i = 0; i < capacity_; ++i) {
    const Record r = read(slots_[i]);
    if (r.state != State::kEmpty && r.state != State::kClaimed) records.push_back(r);
  }
  std::sort(records.begin(), records.end(),
            [](const Record &a, const Record &b) { return a.start > b.start; });
  std::string out;
  for (size_t i = 0; i < std::min(max, records.size()); ++i) {
    const Record &r = records[i];
    const double s = r.state == State::kRunning ? seconds_since(r.start) : r.seconds;
    out += format("%s%s %zu B %s %.3f s", i ? "; " : "",
                  op_label(coll_kind_name(r.kind), r.kind, r.seq).c_str(), r.bytes,
                  state_name(r.state), s);
  }
  return out.empty() ? "no operations yet" : out;
}

// ---------------------------------------------------------------------------------------------
// Watchdog
// ---------------------------------------------------------------------------------------------

Watchdog::Watchdog(const OpHistory &history, int64_t timeout_ms,
                   std::function<void(const OpHistory::Record &)> on_expired,
                   std::function<bool()> peer_check, std::string backend)
    : history_(history),
      timeout_ms_(timeout_ms),
      backend_(std::move(backend)),
      on_expired_(std::move(on_expired)),
      peer_check_(std::move(peer_check)) {
  thread_ = std::thread([this] { loop(); });
  if (!peer_check_) return;
  try {
    peer_thread_ = std::thread([this] { peer_loop(); });
  } catch (...) {  // the first thread is joinable: stop it before the object fails
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    throw;
  }
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (peer_thread_.joinable()) peer_thread_.join();
}

void Watchdog::peer_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    cv_.wait_for(lock, kPeerPeriod, [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();  // the check may take a store round trip
    bool done = false;
    try {
      done = peer_check_();
    } catch (const std::exception &e) {
      MNCL_WARN("watchdog: looking at the other ranks failed: %s", e.what());
    } catch (...) {  // nothing may leave the thread
      MNCL_WARN("watchdog: looking at the other ranks failed");
    }
    if (done) return;  // the communicator is unusable now
    lock.lock();
  }
}

int64_t Watchdog::grace_ms(int64_t timeout_ms) {
  // Plugins report their own timeouts (better messages); the watchdog only catches hangs.
  return std::clamp<int64_t>(timeout_ms / 10, 100, 1000);
}

void Watchdog::loop() {
  // Polling at a fraction of the timeout keeps the hot path free of notifications.
  const auto tick = std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms_ / 16, 10, 500));
  const auto limit = std::chrono::milliseconds(timeout_ms_ + grace_ms(timeout_ms_));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    cv_.wait_for(lock, tick, [&] { return stopping_; });
    if (stopping_) break;
    OpHistory::Record r;
    if (!history_.running(&r) || Clock::now() - r.start < limit) continue;
    fired_.store(true);
    lock.unlock();
    MNCL_WARN(
        "watchdog: %s has run %.1f s, past its timeout of %.1f s; aborting the "
        "backend's communicator. Last operations: %s",
        op_label(coll_kind_name(r.kind), r.kind, r.seq).c_str(), seconds_since(r.start),
        timeout_ms_ / 1000.0, history_.dump().c_str());
    try {
      on_expired_(r);
    } catch (const std::exception &e) {
      MNCL_WARN("watchdog: %s", e.what());
    }
    // The communicator is unusable now; one thing is left to watch: that the backend ends
    // the operation, as comm_abort requires. One that does not holds its caller for good,
    // which the warning above does not explain.
    const auto aborted_at = Clock::now();
    const auto follow_up = std::chrono::milliseconds(after_abort_ms(timeout_ms_));
    lock.lock();
    while (!stopping_) {
      cv_.wait_for(lock, tick, [&] { return stopping_; });
      if (stopping_) break;
      OpHistory::Record now;
      if (!history_.running(&now) || now.seq != r.seq || now.kind != r.kind ||
          now.start != r.start) {
        return;  // it ended
      }
      if (Clock::now() - aborted_at < follow_up) continue;
      lock.unlock();
      MNCL_WARN(
          "watchdog: %s still runs %.1f s after the watchdog aborted the backend's "
          "communicator: backend '%s' does not end its operations on comm_abort, as the plugin "
          "ABI requires (mncl_plugin_v1.h), and this call returns only when the backend ends it",
          op_label(coll_kind_name(r.kind), r.kind, r.seq).c_str(), seconds_since(aborted_at),
          backend_.empty() ? "?" : backend_.c_str());
      return;
    }
    return;
  }
}

int64_t Watchdog::after_abort_ms(int64_t timeout_ms) {
  return std::clamp<int64_t>(timeout_ms, 1000, 10000);
}

// ---------------------------------------------------------------------------------------------
// Diagnosis
// ---------------------------------------------------------------------------------------------

std::string diag_key(int rank) {
  return "diag/" + std::to_string(rank);
}
int64_t diagnosis_grace_ms(int64_t timeout_ms) {
  return std::clamp<int64_t>(timeout_ms / 15, 50, 200);
}
std::string diag_read_key() {
  return "diag/read";
}

std::string diagnose_failure(bootstrap::Store &store, uint64_t op_seq, int op_kind,
                             const std::string &call, int rank, int size, int64_t timeout_ms,
                             const std::string &history, bool hosts_store) {
  if (size <= 1) return "";
  try {
    // "<seq>\n<call>\n<dump>": the operation this rank failed in, its call's fingerprint (kind,
    // counts, dtype, op, root), and its last operations.
    const std::string mine = std::to_string(op_seq) + "\n" + call + "\n" + history;
    store.set(diag_key(rank), mine.data(), mine.size());
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(diag_key(r));
    bootstrap::WaitOptions opts;
    // Every rank that is still alive fails at about the same time; the grace only bounds how
    // long we wait for the ones that are not.
    opts.timeout = std::chrono::milliseconds(diagnosis_grace_ms(timeout_ms));
    const auto absent = store.wait(keys, opts);
    std::vector<int> missing;
    std::vector<std::pair<int, uint64_t>> behind;  // (rank, the earlier op it failed in)
    std::string per_rank;
    // The ranks in this operation, by their call's fingerprint, in order of first appearance:
    // a backend that cannot tell a different call from a stalled peer (gloo, MPI, NCCL) times
    // out, and this names the difference.
    std::vector<std::pair<std::string, std::vector<int>>> calls;
    for (int r = 0; r < size; ++r) {
      if (std::find(absent.begin(), absent.end(), keys[r]) != absent.end()) {
        missing.push_back(r);
        continue;
      }
      bootstrap::WaitOptions now;
      now.timeout = std::chrono::milliseconds(0);
      const auto bytes = store.get(keys[r], now);
      const std::string text(bytes.begin(), bytes.end());
      const auto nl = text.find('\n');
      const auto nl2 = nl == std::string::npos ? nl : text.find('\n', nl + 1);
      const uint64_t seq = std::strtoull(text.substr(0, nl).c_str(), nullptr, 10);
      if (seq < op_seq) behind.emplace_back(r, seq);  // stuck in an earlier operation
      if (seq == op_seq && nl2 != std::string::npos) {
        const std::string call = text.substr(nl + 1, nl2 - nl - 1);
        auto group = std::find_if(calls.begin(), calls.end(),
                                  [&](const auto &c) { return c.first == call; });
        if (group == calls.end()) group = calls.insert(calls.end(), {call, {}});
        group->second.push_back(r);
      }
      per_rank += format("\n  rank %d: %s", r,
                         nl2 == std::string::npos ? "" : text.substr(nl2 + 1).c_str());
    }
    // Nobody leaves before every reporter has read the reports: the rank hosting the TCP
    // store typically exits right after its error, taking the store with it.
    // The host also waits for reports that arrive after its own grace (ranks whose timers
    // started later), at least one more grace and at most two.
    const auto start = Clock::now();
    int64_t reporters = size - static_cast<int64_t>(absent.size());
    for (int64_t n = store.add(diag_read_key(), 1);; n = store.add(diag_read_key(), 0)) {
      const auto waited = Clock::now() - start;
      if (hosts_store) {
        bootstrap::WaitOptions now;
        now.timeout = std::chrono::milliseconds(0);
        reporters = size - static_cast<int64_t>(store.wait(keys, now).size());
        if ((n >= reporters && waited >= opts.timeout) || waited >= 2 * opts.timeout) break;
      } else if (n >= reporters || waited >= opts.timeout) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::string out;
    if (!missing.empty()) {
      out += format("; missing: rank%s", missing.size() > 1 ? "s" : "");
      for (size_t i = 0; i < missing.size(); ++i) {
        out += format("%s%d", i ? ", " : " ", missing[i]);
      }
      out += format(" (no report of reaching %s #%llu: stopped, dead or elsewhere)",
                    coll_kind_name(op_kind), static_cast<unsigned long long>(op_seq));
    }
    if (calls.size() > 1) {
      out += "; the ranks called it differently:";
      constexpr size_t kShown = 4;
      for (size_t i = 0; i < std::min(calls.size(), kShown); ++i) {
        const std::vector<int> &ranks = calls[i].second;
        std::string who;
        for (size_t k = 0; k < std::min<size_t>(ranks.size(), 8); ++k) {
          who += (k > 0 ? "," : "") + std::to_string(ranks[k]);
        }
        if (ranks.size() > 8) who += format(",... (%zu ranks)", ranks.size());
        out += format("%s rank%s %s: %s", i > 0 ? ";" : "", ranks.size() > 1 ? "s" : "",
                      who.c_str(), calls[i].first.c_str());
      }
      if (calls.size() > kShown) out += format("; and %zu more calls", calls.size() - kShown);
    }
    for (const auto &[r, seq] : behind) {
      out += format("; rank %d failed in an earlier operation, #%llu", r,
                    static_cast<unsigned long long>(seq));
    }
    out += "; last operations per rank:" + per_rank;
    for (int r : missing) out += format("\n  rank %d: (no report)", r);
    return out;
  } catch (const std::exception &e) {
    MNCL_INFO("diagnosis after %s #%llu failed: %s", coll_kind_name(op_kind),
              static_cast<unsigned long long>(op_seq), e.what());
    return "";
  }
}

}  // namespace mncl::core

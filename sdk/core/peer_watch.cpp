#include "core/peer_watch.h"

#include <fcntl.h>
#include <mncl/mncl_plugin.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/log.h"

namespace mncl::core {

namespace {

// The fields of /proc/<pid>/stat this file needs.
struct ProcStat {
  char state = '?';
  long threads = 0;
  std::string start;  // field 22, clock ticks since boot
};
enum class StatRead { kRead, kNoProcess, kUnreadable };
StatRead read_proc_stat(pid_t pid, ProcStat *out) {
  // Only "no such file" means no such process: running out of descriptors, or a /proc that
  // refuses to show a process (hidepid=1), must never make a live rank look gone. (hidepid=2
  // answers "no such file": PeerWatch watches only the peers it sees running at first.)
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT || errno == ESRCH ? StatRead::kNoProcess : StatRead::kUnreadable;
  char buffer[1024];
  ssize_t n;
  do {
    n = ::read(fd, buffer, sizeof buffer - 1);
  } while (n < 0 && errno == EINTR);
  const int read_error = errno;
  ::close(fd);
  if (n < 0) return read_error == ESRCH ? StatRead::kNoProcess : StatRead::kUnreadable;
  const std::string line(buffer, static_cast<size_t>(n));
  // Fields counted after the command's closing parenthesis (the command may hold spaces).
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return StatRead::kUnreadable;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 3) out->state = field.empty() ? '?' : field[0];
    if (i == 20) out->threads = std::atol(field.c_str());
  }
  if (!fields) return StatRead::kUnreadable;
  out->start = field;
  return StatRead::kRead;
}

// "<boot id> <pid namespace>": what a pid means depends on both. "" where /proc is not this
// pid namespace's (a pid namespace entered without mounting its /proc): its pids are others'.
std::string pid_scope() {
  static std::mutex mutex;
  // Kept once known; never destroyed, as a detached thread may still ask after exit() ran the
  // static destructors (Comm::leave_abandoned's).
  static auto *known = new std::string;
  std::string &scope = *known;
  std::lock_guard<std::mutex> lock(mutex);
  if (!scope.empty()) return scope;
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char self[32] = "";
  const ssize_t n = ::readlink("/proc/self", self, sizeof self - 1);
  struct stat ns {};
  if (boot.empty() || n <= 0 || std::atoi(self) != static_cast<int>(::getpid()) ||
      ::stat("/proc/self/ns/pid", &ns) != 0) {
    return "";
  }
  // Not the time namespace, which shifts the start times /proc shows (ranks of one pid
  // namespace in different time namespaces, CRIU restores: not handled). The format is the
  // private store folders' owner file's too, which older libraries wrote.
  scope = format("%s %llu:%llu", boot.c_str(), static_cast<unsigned long long>(ns.st_dev),
                 static_cast<unsigned long long>(ns.st_ino));
  return scope;
}

}  // namespace

std::string process_identity(pid_t pid) {
  const std::string scope = pid_scope();
  ProcStat stat;
  if (scope.empty() || read_proc_stat(pid, &stat) != StatRead::kRead) return "";
  return format("%s %d %s", scope.c_str(), static_cast<int>(pid), stat.start.c_str());
}

Liveness liveness(const std::string &identity) {
  const std::string scope = pid_scope();
  if (identity.empty() || scope.empty() || identity.compare(0, scope.size(), scope) != 0 ||
      identity.size() <= scope.size() || identity[scope.size()] != ' ') {
    return Liveness::kUnknown;
  }
  int pid = 0;
  char start[32] = "";
  if (std::sscanf(identity.c_str() + scope.size(), " %d %31s", &pid, start) != 2 || pid <= 0) {
    return Liveness::kUnknown;
  }
  ProcStat now;
  switch (read_proc_stat(pid, &now)) {
    case StatRead::kNoProcess:
      return Liveness::kGone;
    case StatRead::kUnreadable:
      return Liveness::kUnknown;
    case StatRead::kRead:
      break;
  }
  if (now.start != start) return Liveness::kGone;  // the pid is another process's now
  // A zombie (exited, not yet reaped by its parent) is gone; a leader whose main thread ended
  // while others run shows 'Z' too, with more than one thread.
  if ((now.state == 'Z' || now.state == 'X') && now.threads <= 1) return Liveness::kGone;
  return Liveness::kRunning;
}

bool run_briefly(std::chrono::milliseconds wait, std::function<void()> fn) {
  struct Done {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  try {
    std::thread([done, fn = std::move(fn)] {
      try {
        fn();
      } catch (...) {  // nothing may leave a detached thread
      }
      std::lock_guard<std::mutex> lock(done->mutex);
      done->done = true;
      done->cv.notify_all();
    }).detach();
  } catch (const std::system_error &e) {  // no thread to be had: the call is skipped
    MNCL_INFO("could not start a thread for a store call: %s", e.what());
    return false;
  }
  std::unique_lock<std::mutex> lock(done->mutex);
  return done->cv.wait_for(lock, wait, [&] { return done->done; });
}

PeerWatch::PeerWatch(std::shared_ptr<bootstrap::Store> comm_store, int rank,
                     std::vector<Peer> peers, std::string job_tag)
    : store_(std::move(comm_store)), rank_(rank), tag_(std::move(job_tag)) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a: a key name of its own per job
  for (const char c : tag_) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  tag_hash_ = format("%016llx", static_cast<unsigned long long>(hash));
  note_key_ = "failed/" + tag_hash_;
  for (const Peer &peer : peers) {
    if (peer.rank < 0) continue;
    if (names_.size() <= static_cast<size_t>(peer.rank)) names_.resize(peer.rank + 1);
    names_[peer.rank] = format("rank %d (pid %d on %s)", peer.rank, peer.pid, peer.host.c_str());
  }
  for (Peer &peer : peers) {
    if (peer.rank == rank) {
      self_ = format("rank %d (pid %d on %s)", peer.rank, peer.pid, peer.host.c_str());
    } else if (liveness(peer.identity) == Liveness::kRunning) {
      // Running now, moments after it joined: a peer that already looks gone is one /proc
      // hides (hidepid=2 answers "no such file" for other users' processes), never judged.
      watched_.push_back(std::move(peer));
    }
  }
  if (self_.empty()) self_ = format("rank %d", rank);
  // The store's part of the watch, for every rank wherever it runs: should this process end
  // before close() (killed, crashed, exited without destroying the communicator), the store's
  // host sees its connection end and leaves this note for the others. The first cause stays:
  // an abort's note, written before, is kept.
  const std::string will =
      tag_ + "\n" + std::to_string(static_cast<int>(MNCL_ERR_REMOTE)) + "\n" +
      format(
          "%s is gone: its connection to the store closed before it destroyed the "
          "communicator (the process exited or was killed)",
          self_.c_str());
  try {
    willed_ = store_->set_on_close(note_key_, will.data(), will.size());
    // And a key of its own, which every rank that ends so sets: rank 0's destroy, waiting for
    // the others to leave, stops waiting for the ranks whose key is set (all_gone).
    if (willed_) store_->set_on_close(gone_key(rank_), "1", 1);
  } catch (const Error &e) {
    // The watch goes on without it: ranks of other hosts are then noticed at the timeout.
    MNCL_INFO("could not leave the store a note for this rank's end: %s", e.what());
  }
}

PeerWatch::~PeerWatch() {
  close();
}

PeerWatch::Finding PeerWatch::check(const Waiting *failed) {
  std::vector<Peer> watched;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (found_.status != MNCL_OK) return found_;
    watched = watched_;
  }
  // The note first: a rank that aborted and then exited is reported as aborted.
  Finding finding = read_note();
  // Every rank of this host found gone is named: which of them ended first cannot be told
  // (one that failed on the first one's end may have exited since, taking the note with it
  // when it hosted the store).
  std::vector<std::string> exited;
  for (size_t i = 0; finding.status == MNCL_OK && i < watched.size(); ++i) {
    const Peer &peer = watched[i];
    if (liveness(peer.identity) != Liveness::kGone) continue;
    // A rank that left (mncl_comm_destroy, which sets its leave key before it returns) is not
    // a failure: the others may still talk among themselves.
    const std::optional<bool> left = has_left(peer.rank);
    if (!left.has_value()) continue;  // the store did not tell (yet): judged at a later check
    if (*left) {
      std::lock_guard<std::mutex> lock(mutex_);
      watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                    [&](const Peer &p) { return p.rank == peer.rank; }),
                     watched_.end());
      continue;
    }
    if (exited.empty()) {
      finding = read_note();  // it may have aborted just before it exited
      if (finding.status != MNCL_OK) break;
    }
    exited.push_back(format("rank %d (pid %d on %s)", peer.rank, peer.pid, peer.host.c_str()));
  }
  if (finding.status == MNCL_OK && !exited.empty()) {
    std::string ranks = exited.front();
    for (size_t i = 1; i < exited.size(); ++i) {
      ranks += (i + 1 == exited.size() ? " and " : ", ") + exited[i];
    }
    const Finding gone{MNCL_ERR_REMOTE, ranks + " exited"};
    // Recorded first, and published only by the call that recorded it: this rank reports
    // what it tells the others (two lanes may each find a rank gone).
    if (record(gone)) {
      publish(
          {gone.status, format("%s (found by rank %d, on its host)", gone.reason.c_str(), rank_)},
          std::chrono::milliseconds(200));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return found_;
  }
  if (finding.status == MNCL_OK) {
    finding = check_ended(failed);
    // The others are told, as of a rank found gone: the abort that follows ends their
    // operations too on some backends (shm's abort word, which names only this rank).
    if (finding.status != MNCL_OK && record(finding)) {
      publish({finding.status, format("%s (found by rank %d)", finding.reason.c_str(), rank_)},
              std::chrono::milliseconds(200));
      std::lock_guard<std::mutex> lock(mutex_);
      return found_;
    }
  }
  if (finding.status == MNCL_OK) return finding;
  record(finding);
  std::lock_guard<std::mutex> lock(mutex_);
  return found_;
}

PeerWatch::Finding PeerWatch::found() {
  std::lock_guard<std::mutex> lock(mutex_);
  return found_;
}

bool PeerWatch::has_exited(int rank) {
  std::string identity;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Peer &peer : watched_) {
      if (peer.rank == rank) identity = peer.identity;
    }
  }
  return !identity.empty() && liveness(identity) == Liveness::kGone;
}

std::string PeerWatch::gone_key(int rank) {
  return "gone/" + std::to_string(rank);
}

std::string PeerWatch::ended_key(int rank) const {
  return "ended/" + tag_hash_ + "/" + std::to_string(rank);
}

std::string PeerWatch::ended_count_key() const {
  return "ended/" + tag_hash_ + "/count";
}

void PeerWatch::set_waiting(std::function<std::vector<Waiting>()> waiting) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_ = std::move(waiting);
}

void PeerWatch::publish_collectives(uint64_t collectives) {
  const std::shared_ptr<bootstrap::Store> store = store_now();
  if (store == nullptr) return;
  const std::string text = std::to_string(collectives);
  store->set(ended_key(rank_), text.data(), text.size());
  store->add(ended_count_key(), 1);
}

PeerWatch::Finding PeerWatch::check_ended(const Waiting *failed) {
  std::function<std::vector<Waiting>()> waiting_now;
  std::vector<int> unknown;  // the next ranks to read, from the cursor on
  size_t known = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_now = waiting_;
    known = ended_.size();
    const size_t n = names_.size();
    for (size_t i = 0; i < n && unknown.size() < kEndedReadsPerCheck; ++i) {
      const int r = static_cast<int>((ended_cursor_ + i) % n);
      if (r != rank_ && ended_.count(r) == 0) unknown.push_back(r);
    }
  }
  if ((!waiting_now && failed == nullptr) || unknown.empty()) return {};
  std::vector<Waiting> waiting;
  if (waiting_now) waiting = waiting_now();
  if (failed != nullptr) waiting.push_back(*failed);
  waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                               [](const Waiting &w) {
                                 return w.kind == MNCL_COLL_SEND || w.kind == MNCL_COLL_RECV ||
                                        w.kind == MNCL_COLL_SENDRECV_BATCH;
                               }),
                waiting.end());
  if (waiting.empty()) return {};
  // The count first (a plain read: the key is absent while no rank has ended), so a check
  // costs one small read until one has; then the keys of the ranks not yet known.
  struct Read {
    std::mutex mutex;
    std::vector<std::pair<int, uint64_t>> found;
  };
  auto read = std::make_shared<Read>();
  std::vector<std::string> keys;
  for (const int r : unknown) keys.push_back(ended_key(r));
  read_store([read, unknown, keys, known, count_key = ended_count_key()](bootstrap::Store &store) {
    bootstrap::WaitOptions now;
    now.timeout = std::chrono::milliseconds(0);
    const bootstrap::Bytes count = store.get(count_key, now);
    if (std::strtoll(std::string(count.begin(), count.end()).c_str(), nullptr, 10) <=
        static_cast<long long>(known)) {
      return;
    }
    const std::vector<std::string> missing = store.wait(keys, now);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (std::find(missing.begin(), missing.end(), keys[i]) != missing.end()) continue;
      const bootstrap::Bytes value = store.get(keys[i], now);
      const uint64_t collectives =
          std::strtoull(std::string(value.begin(), value.end()).c_str(), nullptr, 10);
      std::lock_guard<std::mutex> lock(read->mutex);
      read->found.emplace_back(unknown[i], collectives);
    }
  });
  std::lock_guard<std::mutex> lock(mutex_);
  {
    // What was read in time, also when the read as a whole was not (it goes on, unheard).
    std::lock_guard<std::mutex> read_lock(read->mutex);
    for (const auto &[rank, collectives] : read->found) ended_[rank] = collectives;
  }
  ended_cursor_ = (ended_cursor_ + kEndedReadsPerCheck) % std::max<size_t>(names_.size(), 1);
  for (const Waiting &w : waiting) {
    for (const auto &[rank, collectives] : ended_) {
      if (collectives > w.seq) continue;
      const std::string &who = names_[static_cast<size_t>(rank)];
      return {MNCL_ERR_REMOTE,
              collectives == 0
                  ? format("%s destroyed the communicator before any collective, so it never "
                           "joins %s",
                           who.c_str(), w.label.c_str())
                  : format("%s destroyed the communicator after its collective #%llu, so it "
                           "never joins %s",
                           who.c_str(), static_cast<unsigned long long>(collectives - 1),
                           w.label.c_str())};
    }
  }
  return {};
}

bool PeerWatch::all_gone(const std::vector<int> &ranks) {
  std::vector<std::string> unknown;
  for (const int rank : ranks) {
    if (!has_exited(rank)) unknown.push_back(gone_key(rank));
  }
  if (unknown.empty()) return true;
  const std::shared_ptr<bootstrap::Store> store = store_now();
  if (store == nullptr) return false;
  try {
    bootstrap::WaitOptions now;
    now.timeout = std::chrono::milliseconds(0);
    return store->wait(unknown, now).empty();
  } catch (const Error &) {
    return false;  // the store did not tell: not known to be gone
  }
}

bool PeerWatch::record(const Finding &finding) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (found_.status != MNCL_OK) return false;
  found_ = finding;
  return true;
}

std::shared_ptr<bootstrap::Store> PeerWatch::store_now() {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_;
}

void PeerWatch::take_back_wills() {
  std::shared_ptr<bootstrap::Store> store;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!std::exchange(willed_, false)) return;
    store = store_;
  }
  if (store == nullptr) return;
  try {
    store->cancel_on_close(note_key_);
    store->cancel_on_close(gone_key(rank_));
  } catch (const Error &e) {
    MNCL_INFO("could not take back the store's note for this rank's end: %s", e.what());
  }
}

void PeerWatch::close() {
  std::shared_ptr<bootstrap::Store> store;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store = std::move(store_);
    store_.reset();
    waiting_ = nullptr;  // the communicator it asks is going away
    if (!std::exchange(willed_, false) || store == nullptr) return;
  }
  // Not taken back before the leave (a destroy that failed before it): bounded, since the
  // store may be what failed; a will not taken back is read by nobody once the others have
  // destroyed the communicator too.
  run_briefly(kStoreReadWait, [store = std::move(store), key = note_key_, gone = gone_key(rank_)] {
    try {
      store->cancel_on_close(key);
      store->cancel_on_close(gone);
    } catch (const Error &e) {
      MNCL_INFO("could not take back the store's note for this rank's end: %s", e.what());
    }
  });
}

bool PeerWatch::read_store(std::function<void(bootstrap::Store &)> read) {
  std::shared_ptr<bootstrap::Store> store = store_now();
  if (store == nullptr || reading_->exchange(true)) return false;
  // The read lets go of the flag as soon as it has ended (before run_briefly hears of it: the
  // caller's next read must find it free); the call's copies, when the last one goes without
  // having run (no thread could be started).
  auto ran = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<void> if_never_run(nullptr, [reading = reading_, ran](void *) {
    if (!ran->load()) reading->store(false);
  });
  return run_briefly(kStoreReadWait, [store = std::move(store), read = std::move(read),
                                      reading = reading_, ran, if_never_run] {
    ran->store(true);
    try {
      read(*store);
    } catch (...) {
      // No such key (a timeout), or the store failed: nothing known.
    }
    reading->store(false);
  });
}

PeerWatch::Finding PeerWatch::read_note() {
  // "<tag>\n<status>\n<reason>"; a note of another job (a reused file store) is ignored.
  auto text = std::make_shared<std::string>();
  if (!read_store([text, key = note_key_](bootstrap::Store &store) {
        bootstrap::WaitOptions now;
        now.timeout = std::chrono::milliseconds(0);
        const bootstrap::Bytes note = store.get(key, now);
        text->assign(note.begin(), note.end());
      })) {
    return {};
  }
  const size_t status_at = tag_.size() + 1;
  const size_t reason_at = text->find('\n', status_at);
  if (text->compare(0, tag_.size(), tag_) == 0 && text->size() > tag_.size() &&
      (*text)[tag_.size()] == '\n' && reason_at != std::string::npos) {
    const int status = std::atoi(text->c_str() + status_at);
    return {status == MNCL_ERR_ABORTED ? MNCL_ERR_ABORTED : MNCL_ERR_REMOTE,
            text->substr(reason_at + 1)};
  }
  return {};
}

std::optional<bool> PeerWatch::has_left(int rank) {
  auto left = std::make_shared<bool>(false);
  if (!read_store([left, key = "leave/" + std::to_string(rank)](bootstrap::Store &store) {
        bootstrap::WaitOptions now;
        now.timeout = std::chrono::milliseconds(0);
        *left = store.wait({key}, now).empty();
      })) {
    return std::nullopt;
  }
  return *left;  // false too when the store failed (its host went): not known to have left
}

void PeerWatch::publish_abort() {
  {
    // Aborting after a failure this rank learned of (the documented way out): the note, if
    // any, already holds the cause, which this abort must not replace.
    std::lock_guard<std::mutex> lock(mutex_);
    if (found_.status != MNCL_OK) return;
  }
  publish({MNCL_ERR_ABORTED,
           format("the communicator was aborted by %s (mncl_comm_abort)", self_.c_str())},
          std::chrono::milliseconds(200));
}

void PeerWatch::publish_failure(const std::string &what) {
  const Finding finding{MNCL_ERR_REMOTE, format("%s %s", self_.c_str(), what.c_str())};
  if (record(finding)) publish(finding, std::chrono::milliseconds(200));
}

void PeerWatch::publish(const Finding &finding, std::chrono::milliseconds wait) {
  const std::string note =
      tag_ + "\n" + std::to_string(static_cast<int>(finding.status)) + "\n" + finding.reason;
  std::shared_ptr<bootstrap::Store> store = store_now();
  if (store == nullptr) return;  // destroyed
  run_briefly(wait, [store = std::move(store), note, key = note_key_] {
    try {
      // The first cause stays (two ranks failing at once may both write: either is true).
      bootstrap::WaitOptions now;
      now.timeout = std::chrono::milliseconds(0);
      if (!store->wait({key}, now).empty()) store->set(key, note.data(), note.size());
    } catch (const Error &e) {
      MNCL_INFO("could not tell the other ranks that the communicator failed: %s", e.what());
    }
  });
}

}  // namespace mncl::core

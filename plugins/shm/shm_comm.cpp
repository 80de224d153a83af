#include "shm/shm_comm.h"

#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>

#include "common/coll.h"
#include "common/dtype.h"
#include "common/host.h"
#include "shm/fold.h"

namespace mncl::shm {

using Clock = std::chrono::steady_clock;
namespace kit = mncl::kit;

namespace {

using mncl::kit::is_rooted_v_kind;
using mncl::kit::is_v_kind;
using mncl::kit::kind_name;

const unsigned char *bytes_at(const void *p, size_t off) {
  return static_cast<const unsigned char *>(p) + off;
}
unsigned char *bytes_at(void *p, size_t off) {
  return static_cast<unsigned char *>(p) + off;
}

// A point-to-point chunk count as its channel's flag holds it: the low 32 bits (flags compare
// wrap-aware).
uint32_t flag_value(uint64_t chunks) {
  return static_cast<uint32_t>(chunks);
}

// In-place forms pass the same pointer as source and destination: nothing to copy then.
void copy_block(void *dst, const void *src, size_t len) {
  if (dst != src && len > 0) std::memcpy(dst, src, len);
}

std::string rank_list(const std::vector<int> &ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

int online_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// The store through its C table; failures keep the message the core's callback set.
struct Store {
  const mncl_store_v1_t *s;
  void set(const std::string &key, const std::string &value) const {
    check(s->set(s->ctx, key.c_str(), value.data(), value.size()));
  }
  std::string get(const std::string &key, int64_t timeout_ms) const {
    void *data = nullptr;
    size_t len = 0;
    check(s->get(s->ctx, key.c_str(), &data, &len, timeout_ms));
    std::string out(static_cast<const char *>(data), len);
    s->release(s->ctx, data);
    return out;
  }
  bool exists(const std::string &key) const {
    const char *keys[] = {key.c_str()};
    return s->wait(s->ctx, keys, 1, 0) == MNCL_OK;
  }
  int64_t add(const std::string &key, int64_t delta) const {
    int64_t result = 0;
    check(s->add(s->ctx, key.c_str(), delta, &result));
    return result;
  }
  void del(const std::string &key) const { s->del(s->ctx, key.c_str()); }
  static void check(mncl_status_t st) {
    if (st != MNCL_OK) throw kit::Error(st);
  }
};

using mncl::kit::is_reduction;
using mncl::kit::is_rooted;

// "allreduce(20 x float32, sum)", "bcast(20 x int32, root 1)": naive's format for a call.
std::string describe_call(int32_t kind, int32_t dtype, int32_t op, int32_t root, uint64_t count) {
  std::string out = kit::format("%s(%llu x %s", kind_name(kind),
                                static_cast<unsigned long long>(count), kit::dtype_name(dtype));
  if (op >= 0) out += kit::format(", %s", kit::op_name(op));
  if (root >= 0) out += kit::format(", root %d", root);
  return out + ")";
}

std::vector<std::string> split_lines(const std::string &s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

struct Comm::Op {
  const char *name;
  uint64_t seq;
  int64_t timeout_ms;
  Clock::time_point deadline;
  uint32_t base;  // collectives: posts_ when the op started, for messages ("step 3")
  bool p2p = false;
  uint32_t chunk = 0, chunks = 0;  // send/recv: the chunk being moved (from 1), for messages
  // The call's stamp words (CallStamp), minus the first post, which publish_call adds.
  uint64_t head = 0, op_root = 0, count = 0;
  // allreduce_coalesced: the caller's counts, for messages only (valid during the call).
  const size_t *counts = nullptr;
  size_t nbufs = 0;
  std::string where() const {
    return kit::format("shm %s #%llu", name, static_cast<unsigned long long>(seq));
  }
};

// ---------------------------------------------------------------------------------------------
// Creation: rank 0 creates and publishes the segment, everyone maps it, rank 0 unlinks it.
// Store keys (the core prefixes them per communicator), all deleted before create returns
// except shm/go, deleted by the last of its n-1 readers:
//   shm/seg   rank 0 -> all   "name\nhost id\nchunk\nsmall\np2p slot\nnt bytes" or "ERR\n..."
//   shm/r<k>  rank k -> 0     "ok\nhost id" once mapped, "host\nhost id" or "ERR\nmessage"
//   shm/go    rank 0 -> all   "ok" or "ERR\n<status>\nmessage"
// ---------------------------------------------------------------------------------------------

Comm::Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host, const Options &options)
    : host_(host),
      rank_(bs.rank),
      size_(bs.size),
      default_timeout_ms_(bs.timeout_ms > 0 ? bs.timeout_ms : 300000),
      send_lanes_(static_cast<size_t>(bs.size)),
      recv_lanes_(static_cast<size_t>(bs.size)) {
  create_segment(bs, options);
  hdr_ = &seg_.header();
  chunk_ = hdr_->chunk;
  small_ = hdr_->small;
  p2p_slot_ = hdr_->p2p_slot;
  nt_bytes_ = hdr_->nt_bytes;
  // Each rank's own setting: a receiver that does not accept declines, so ranks may differ.
  single_copy_offers_ = options.single_copy != 0;
  single_copy_accepts_ = options.single_copy != 0 && !options.single_copy_declines;
  // Oversubscribed (more ranks than CPUs): the peer we wait for needs our CPU, so barely spin,
  // hand the CPU over for a short while (a small collective's peers arrive within a few
  // context switches), then sleep: a longer yield loop keeps competing with the very rank we
  // wait for. Otherwise spin ~tens of microseconds first.
  const bool oversubscribed = size_ > online_cpus();
  spin_ = options.spin >= 0 ? options.spin : (oversubscribed ? 16 : 20000);
  yield_for_ = std::chrono::microseconds(options.yield_us >= 0 ? options.yield_us
                                                               : (oversubscribed ? 30 : 10));
  MNCL_KIT_LOG(host_, MNCL_LOG_INFO,
               "shm: rank %d/%d mapped %s (%zu bytes; chunk %zu, single-phase up to %zu, %s)",
               rank_, size_, seg_.name().c_str(), seg_.layout().total, chunk_, small_,
               oversubscribed ? "oversubscribed: short spin" : "spin then sleep");
  // Every rank published its pid and namespace before creation completed (rank 0 before
  // shm/seg, the others before their shm/r<k> reply, which rank 0 awaits before shm/go).
  const PidNamespace mine = pid_namespace();
  std::vector<int> foreign;
  pid_usable_.assign(static_cast<size_t>(size_), 0);
  for (int p = 0; p < size_; ++p) {
    const RankCtl &ctl = seg_.ctl(p);
    const bool same = mine.known() && ctl.pidns_dev.load() == mine.dev &&
                      ctl.pidns_ino.load() == mine.ino && ctl.pid.load() > 0;
    pid_usable_[static_cast<size_t>(p)] = same;
    if (!same && p != rank_) foreign.push_back(p);
  }
  if (!foreign.empty()) {
    MNCL_KIT_LOG(host_, MNCL_LOG_INFO,
                 "shm: rank %d: %s not in this rank's PID namespace%s: messages between them "
                 "stream through the segment (no single copy), and a dead one is noticed only "
                 "by the timeout",
                 rank_, rank_list(foreign).c_str(),
                 mine.known() ? "" : " (or this rank cannot tell: no /proc/self/ns/pid)");
  }
}

std::string Comm::pid_text(int peer) const {
  const int pid = static_cast<int>(seg_.ctl(peer).pid.load());
  return pid_usable_[static_cast<size_t>(peer)]
             ? kit::format("pid %d", pid)
             : kit::format("pid %d in another PID namespace", pid);
}

void Comm::create_segment(const mncl_bootstrap_v1_t &bs, const Options &options) {
  const Store store{bs.store};
  const int64_t timeout = default_timeout_ms_;
  const std::string me = host_identity();
  const int n = size_;

  if (rank_ == 0) {
    const Layout layout(n, options.chunk, options.p2p_slot);
    try {
      seg_.create(layout);
    } catch (const kit::Error &e) {
      if (n > 1) store.set("shm/seg", std::string("ERR\n") + e.what());
      throw;
    }
    Header &h = seg_.header();  // fallocate'd pages are zero: the atomics start at 0
    h.magic = kMagic;
    h.version = kVersion;
    h.size = n;
    h.chunk = options.chunk;
    h.small = options.small;
    h.p2p_slot = options.p2p_slot;
    h.nt_bytes = options.nt_bytes;
    h.total_bytes = layout.total;
    publish_pid(seg_.ctl(0));
    if (n == 1) {
      seg_.unlink();
      return;
    }
    store.set("shm/seg",
              kit::format("%s\n%s\n%zu\n%zu\n%zu\n%zu", seg_.name().c_str(), me.c_str(),
                          options.chunk, options.small, options.p2p_slot, options.nt_bytes));
    // Wait for every rank to map it (or to refuse), then remove the name at once: from here
    // on no crash can leave it behind in /dev/shm.
    std::vector<std::string> keys;
    std::vector<const char *> key_ptrs;
    for (int k = 1; k < n; ++k) keys.push_back(kit::format("shm/r%d", k));
    for (const std::string &k : keys) key_ptrs.push_back(k.c_str());
    const mncl_status_t st =
        bs.store->wait(bs.store->ctx, key_ptrs.data(), key_ptrs.size(), timeout);
    seg_.unlink();
    if (st != MNCL_OK) {
      std::vector<int> missing;
      for (int k = 1; k < n; ++k) {
        if (!store.exists(keys[static_cast<size_t>(k - 1)])) missing.push_back(k);
      }
      const std::string msg =
          kit::format("shm comm_create: %s did not map the segment within %.1f s",
                      rank_list(missing).c_str(), static_cast<double>(timeout) / 1000.0);
      store.set("shm/go",
                kit::format("ERR\n%d\n%s", static_cast<int>(MNCL_ERR_TIMEOUT), msg.c_str()));
      store.del("shm/seg");
      throw kit::Error(st == MNCL_ERR_ABORTED ? st : MNCL_ERR_TIMEOUT, msg);
    }
    std::set<std::string> hosts{me};
    std::string errors;
    std::vector<int> elsewhere;
    for (int k = 1; k < n; ++k) {
      const std::vector<std::string> reply = split_lines(store.get(keys[size_t(k - 1)], timeout));
      store.del(keys[static_cast<size_t>(k - 1)]);
      const std::string kind = reply.empty() ? "ERR" : reply[0];
      if (kind == "ok" || kind == "host") {
        if (reply.size() > 1) hosts.insert(reply[1]);
        if (kind == "host") elsewhere.push_back(k);
      } else {
        errors += kit::format("%srank %d: %s", errors.empty() ? "" : "; ", k,
                              reply.size() > 1 ? reply[1].c_str() : "failed");
      }
    }
    store.del("shm/seg");
    std::string go = "ok";
    mncl_status_t status = MNCL_OK;
    std::string msg;
    if (!elsewhere.empty()) {
      status = MNCL_ERR_NOT_SUPPORTED;
      msg = kit::format(
          "shm comm_create: ranks span %zu hosts (%s not on rank 0's host '%s'); "
          "the shm backend needs every rank on one host",
          hosts.size(), rank_list(elsewhere).c_str(), me.substr(me.find('|') + 1).c_str());
    } else if (!errors.empty()) {
      status = MNCL_ERR_SYSTEM;
      msg = "shm comm_create: " + errors;
    }
    if (status != MNCL_OK) go = kit::format("ERR\n%d\n%s", static_cast<int>(status), msg.c_str());
    store.set("shm/go", go);
    if (status != MNCL_OK) throw kit::Error(status, msg);
    return;
  }

  // Other ranks.
  const std::vector<std::string> seg = split_lines(store.get("shm/seg", timeout));
  std::string reply;
  std::string local_error;
  mncl_status_t local_status = MNCL_OK;
  if (seg.empty() || seg[0] == "ERR") {
    throw kit::Error(MNCL_ERR_REMOTE, "shm comm_create: rank 0 could not create the segment: " +
                                          (seg.size() > 1 ? seg[1] : std::string("unknown error")));
  }
  if (seg.size() < 6) throw kit::Error(MNCL_ERR_INTERNAL, "shm comm_create: malformed shm/seg");
  const size_t chunk = std::stoull(seg[2]), p2p_slot = std::stoull(seg[4]);
  if (seg[1] != me) {
    reply = "host\n" + me;
  } else {
    try {
      seg_.attach(seg[0], Layout(n, chunk, p2p_slot));
      Header &h = seg_.header();
      if (h.magic != kMagic || h.version != kVersion || h.size != n) {
        throw kit::Error(
            MNCL_ERR_INTERNAL,
            kit::format("shm: segment %s has magic %08x version %u size %d, expected "
                        "%08x %u %d",
                        seg[0].c_str(), h.magic, h.version, h.size, kMagic, kVersion, n));
      }
      publish_pid(seg_.ctl(rank_));
      reply = "ok\n" + me;
    } catch (const kit::Error &e) {
      local_status = e.status();
      local_error = e.what();
      reply = "ERR\n" + local_error;
    }
  }
  store.set(kit::format("shm/r%d", rank_), reply);
  const std::vector<std::string> go = split_lines(store.get("shm/go", timeout));
  if (store.add("shm/gone", 1) == n - 1) {
    store.del("shm/go");
    store.del("shm/gone");
  }
  if (!go.empty() && go[0] == "ok") return;
  if (go.size() >= 3) {
    const auto st = static_cast<mncl_status_t>(std::stoi(go[1]));
    // Our own failure is the more precise message.
    if (local_status != MNCL_OK) throw kit::Error(local_status, local_error);
    throw kit::Error(st, go[2]);
  }
  throw kit::Error(MNCL_ERR_INTERNAL, "shm comm_create: malformed shm/go");
}

// ---------------------------------------------------------------------------------------------
// Progress, waiting and failures
// ---------------------------------------------------------------------------------------------

void Comm::post_progress() {
  ++posts_;
  post(seg_.ctl(rank_).posts, posts_);
}

void Comm::wake_everyone() {
  for (int r = 0; r < size_; ++r) wake_all(seg_.ctl(r).posts);
  for (int s = 0; s < size_; ++s) {
    for (int d = 0; d < size_; ++d) {
      wake_all(seg_.channel(s, d).sent);
      wake_all(seg_.channel(s, d).acked);
    }
  }
}

void Comm::abort() {
  // The segment's word first: a lane of this rank that sees aborted_ then revokes a
  // single-copy offer, and its receiver, seeing the revoke, must find the word set too.
  if (hdr_ != nullptr) {
    uint32_t expected = 0;
    hdr_->abort_word.compare_exchange_strong(expected, static_cast<uint32_t>(rank_ + 1));
  }
  aborted_.store(true);
  if (hdr_ != nullptr) wake_everyone();
}

void Comm::fail(Op &op, mncl_status_t st, const std::string &msg) {
  (void)op;
  if (st != MNCL_ERR_ABORTED) {
    // Another lane may fail at the same moment: the first failure is the cause.
    const std::lock_guard<std::mutex> lock(broken_mutex_);
    if (broken_.empty()) broken_ = msg;
  }
  throw kit::Error(st, msg);
}

std::string Comm::broken() const {
  const std::lock_guard<std::mutex> lock(broken_mutex_);
  return broken_;
}

void Comm::check_failed(Op &op) {
  if (aborted_.load(std::memory_order_acquire)) {  // acquire: the abort word, see abort()
    throw kit::Error(MNCL_ERR_ABORTED, op.where() + ": the communicator was aborted");
  }
  // A recorded mismatch or dead peer before a peer's abort: a rank that failed on either
  // typically aborts next (the documented way out), and the ranks still in the call must get
  // the cause, not "aborted by rank N".
  const uint32_t m = hdr_->mismatch_word.load(std::memory_order_acquire);
  if (m != 0) {
    // Written before mismatch_word was set (note_failure()), never after. It starts with the
    // noting rank's call ("shm gatherv #3: "), which is left out when it is this one (a
    // collective: send/recv numbers count per peer, so they name no call across ranks).
    std::string note(hdr_->note, strnlen(hdr_->note, kNoteBytes));
    const std::string prefix = op.where() + ": ";
    const bool same_call = !op.p2p && note.compare(0, prefix.size(), prefix) == 0;
    if (same_call) note.erase(0, prefix.size());
    if (note.empty()) note = "mismatched calls (its error names both)";
    fail(op, MNCL_ERR_REMOTE,
         kit::format("%s: rank %u failed %s: %s", op.where().c_str(), m - 1,
                     same_call ? "the call" : "another call", note.c_str()));
  }
  const uint32_t d = hdr_->dead_word.load(std::memory_order_acquire);
  if (d != 0) {
    const uint32_t by = hdr_->dead_seen_by.load();
    fail(op, MNCL_ERR_REMOTE,
         kit::format("%s: rank %u (%s) died (detected by rank %u)", op.where().c_str(), d - 1,
                     pid_text(static_cast<int>(d - 1)).c_str(), by > 0 ? by - 1 : 0));
  }
  const uint32_t a = hdr_->abort_word.load(std::memory_order_acquire);
  if (a != 0) {
    fail(op, MNCL_ERR_ABORTED,
         kit::format("%s: the communicator was aborted by rank %u", op.where().c_str(), a - 1));
  }
}

// Returns when f.value >= target; throws on abort, a dead peer, or the op's deadline (the
// caller's message for a timeout is built from `what`).
void Comm::wait_flag(Op &op, Flag &f, uint32_t target, int peer, const char *what) {
  // At every wait, not only the sleeping ones: a call whose waits are all met at once (a long
  // stream with a fast peer) must still end soon after an abort. A read-mostly line: cheap.
  // This rank's own abort ends it at once; a peer's only where what this wait needs is not
  // there yet: a peer that finished the operation and then aborted (its caller's next step)
  // made the ranks still copying its result out fail with "aborted by rank N", though it had
  // returned MNCL_OK there.
  if (aborted_.load(std::memory_order_relaxed)) check_failed(op);
  if (reached(f.value.load(std::memory_order_acquire), target)) return;
  if (hdr_->abort_word.load(std::memory_order_relaxed) != 0) check_failed(op);
  // The spin budget assumes one waiting thread per rank (a CPU each unless oversubscribed);
  // with concurrent lanes several may wait at once, so only one of them spins, the others go
  // straight to yielding and sleeping instead of taking CPUs from the peers they wait for.
  // Both phases stop at an abort (checked below), and yielding at the deadline too: a large
  // MNCL_SHM_SPIN / MNCL_SHM_YIELD_US held aborts and timeouts off for its length.
  const auto abort_seen = [this] {
    return aborted_.load(std::memory_order_relaxed) ||
           hdr_->abort_word.load(std::memory_order_relaxed) != 0;
  };
  if (spin_ > 0 && !spinning_.exchange(true, std::memory_order_relaxed)) {
    bool got = false;
    for (int i = 0; i < spin_ && !got; ++i) {
      cpu_relax();
      got = reached(f.value.load(std::memory_order_acquire), target);
      if ((i & 4095) == 4095 && abort_seen()) break;
    }
    spinning_.store(false, std::memory_order_relaxed);
    if (got) return;
  }
  if (yield_for_.count() > 0) {
    const auto until = std::min(Clock::now() + yield_for_, op.deadline);
    do {
      sched_yield();
      if (reached(f.value.load(std::memory_order_acquire), target)) return;
    } while (!abort_seen() && Clock::now() < until);
  }
  auto next_liveness = Clock::now() + std::chrono::milliseconds(50);
  for (;;) {
    check_failed(op);
    const auto now = Clock::now();
    if (now >= op.deadline) {
      if (op.p2p) {
        fail(op, MNCL_ERR_TIMEOUT,
             kit::format("%s: no %s from rank %d within %.1f s (chunk %u of %u; alive but not "
                         "progressing: stopped, hung, or in a different call?)",
                         op.where().c_str(), what, peer,
                         static_cast<double>(op.timeout_ms) / 1000.0, op.chunk, op.chunks));
      }
      // Name every rank that has not got there (the waited-for value is a posts counter).
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_ && !reached(seg_.ctl(r).posts.value.load(), target)) missing.push_back(r);
      }
      if (missing.empty()) missing.push_back(peer);
      std::string detail;
      for (int r : missing) {
        detail += kit::format("; rank %d (%s) is at step %d", r, pid_text(r).c_str(),
                              static_cast<int32_t>(seg_.ctl(r).posts.value.load() - op.base));
      }
      fail(op, MNCL_ERR_TIMEOUT,
           kit::format("%s: no %s from %s within %.1f s (waiting for step %d%s; alive but not "
                       "progressing: stopped, hung, or in a different call?)",
                       op.where().c_str(), what, rank_list(missing).c_str(),
                       static_cast<double>(op.timeout_ms) / 1000.0,
                       static_cast<int32_t>(target - op.base), detail.c_str()));
    }
    // A peer in another PID namespace: its pid names some other process here (or none).
    if (now >= next_liveness && pid_usable_[static_cast<size_t>(peer)]) {
      const pid_t pid = seg_.ctl(peer).pid.load();
      if (pid_is_dead(pid)) {
        uint32_t expected = 0;
        if (hdr_->dead_word.compare_exchange_strong(expected, static_cast<uint32_t>(peer + 1))) {
          hdr_->dead_seen_by.store(static_cast<uint32_t>(rank_ + 1));
        }
        wake_everyone();  // every other rank stops waiting too
        fail(op, MNCL_ERR_REMOTE,
             kit::format("%s: rank %d (pid %d) died during the operation", op.where().c_str(), peer,
                         static_cast<int>(pid)));
      }
      next_liveness = now + std::chrono::milliseconds(100);
    }
    const uint32_t seen = f.value.load(std::memory_order_acquire);
    if (reached(seen, target)) return;
    const int64_t left_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(op.deadline - now).count();
    futex_sleep(f, seen, std::min<int64_t>(left_ns, 20000000));  // 20 ms slices
    if (reached(f.value.load(std::memory_order_acquire), target)) return;
  }
}

// ---------------------------------------------------------------------------------------------
// Mismatched calls (issue 9): each rank stamps its call before the call's first post, into the
// stamp of the staging half its first round uses and under that half's reuse rule; at its first
// wait in a call, a rank compares the stamps of the ranks it waited for, in the same half, with
// its own. Matched calls start at the same post number and round on every rank, and a peer
// rewrites that stamp only after this rank has posted again, so the stamp it finds is the peer's
// call that started at the same post: anything else (an earlier call, a later one, a stamp being
// written) means the peer is in a different call.
// ---------------------------------------------------------------------------------------------

void Comm::publish_call(const Op &op, int half) {
  CallStamp &s = seg_.ctl(rank_).call[half];
  // A seqlock: release stores keep the "writing" mark ahead of the fields (no standalone fence,
  // which ThreadSanitizer cannot model).
  s.head.store(kStampWriting, std::memory_order_relaxed);
  s.op_root.store(op.op_root, std::memory_order_release);
  s.count.store(op.count, std::memory_order_release);
  s.seq.store(op.seq, std::memory_order_release);
  s.head.store(op.head | (op.base + 1u), std::memory_order_release);  // the post publishes it
}

void Comm::check_peer_call(Op &op, int peer, int half) {
  const CallStamp &s = seg_.ctl(peer).call[half];
  const uint64_t head = s.head.load(std::memory_order_acquire);
  // Acquire loads keep the re-read of head below after the fields.
  const uint64_t op_root = s.op_root.load(std::memory_order_acquire);
  const uint64_t count = s.count.load(std::memory_order_acquire);
  const uint64_t seq = s.seq.load(std::memory_order_acquire);
  const uint32_t mine = op.base + 1u;
  const uint64_t my_head = op.head | mine;
  // Being rewritten: the peer is past the call that started at this post, so in another one.
  const bool torn = head == kStampWriting || s.head.load(std::memory_order_relaxed) != head;
  if (!torn && head == my_head && op_root == op.op_root && count == op.count && seq == op.seq) {
    return;  // the fast path: no string is built unless the calls differ
  }
  auto describe = [](uint64_t h, uint64_t o_r, uint64_t n) {
    const auto narrow = [](uint64_t b) { return b == 0xff ? -1 : static_cast<int32_t>(b); };
    const int32_t kind = narrow(h >> 32 & 0xff);
    // allreduce_coalesced: the high word is the digest of its split, not a root.
    const bool coalesced = kind == MNCL_COLL_ALLREDUCE_COALESCED;
    std::string out =
        describe_call(kind, narrow(h >> 40 & 0xff), static_cast<int32_t>(o_r & 0xffffffffu),
                      coalesced ? -1 : static_cast<int32_t>(o_r >> 32), n);
    if (coalesced) {
      out.insert(out.size() - 1,
                 kit::format(", split digest %08llx", static_cast<unsigned long long>(o_r >> 32)));
    }
    return out;
  };
  std::string ours = describe(my_head, op.op_root, op.count), theirs = "a later call";
  if (!torn) {
    theirs = describe(head, op_root, count);
    const uint32_t first = static_cast<uint32_t>(head);
    if (first != mine) {
      theirs += reached(first, mine) ? " (a later call)" : " (an earlier call)";
    } else if (seq != op.seq || theirs == ours) {
      theirs += kit::format(" #%llu", static_cast<unsigned long long>(seq));
      ours += kit::format(" #%llu", static_cast<unsigned long long>(op.seq));
    }
  }
  if (op.counts != nullptr) {  // this rank's own split (the digest alone says little)
    ours += " with counts {";
    for (size_t i = 0; i < op.nbufs && i < 8; ++i) {
      ours += kit::format("%s%zu", i > 0 ? ", " : "", op.counts[i]);
    }
    ours += op.nbufs > 8 ? kit::format(", ... (%zu buffers)}", op.nbufs) : "}";
  }
  fail_mismatch(op, kit::format("%s: mismatched collective calls: rank %d called %s where rank %d "
                                "calls %s",
                                op.where().c_str(), peer, theirs.c_str(), rank_, ours.c_str()));
}

void Comm::check_calls(Op &op, Who waited, int root, int half) {
  if (waited == Who::kAll) {
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) check_peer_call(op, p, half);
    }
  } else if (waited == Who::kRoot && root != rank_) {
    check_peer_call(op, root, half);
  }
}

// Marks the segment so that every rank's next wait fails at once, quoting msg: the first rank
// to claim the note writes msg there and only then sets the mismatch word (a later one leaves
// both to the first, whose error is the cause).
void Comm::note_failure(const std::string &msg) {
  uint32_t expected = 0;
  if (hdr_->note_owner.compare_exchange_strong(expected, static_cast<uint32_t>(rank_ + 1))) {
    const size_t n = std::min(msg.size(), kNoteBytes - 1);
    std::memcpy(hdr_->note, msg.data(), n);
    hdr_->note[n] = '\0';
    hdr_->mismatch_word.store(static_cast<uint32_t>(rank_ + 1), std::memory_order_release);
  }
  wake_everyone();
}

// Mismatched calls: every rank fails (see note_failure), this one with MNCL_ERR_REMOTE.
void Comm::fail_mismatch(Op &op, const std::string &msg) {
  note_failure(msg);
  fail(op, MNCL_ERR_REMOTE, msg);
}

// An argument error only this rank can see (the root's own block) in a call its peers wait on:
// marks the segment as fail_mismatch does, so that their waits fail at once instead of timing
// out, and fails this call with MNCL_ERR_INVALID_ARGUMENT.
void Comm::fail_local(Op &op, const std::string &msg) {
  note_failure(msg);
  fail(op, MNCL_ERR_INVALID_ARGUMENT, msg);
}

void Comm::wait_rank(Op &op, int peer, uint32_t target) {
  if (peer != rank_) wait_flag(op, seg_.ctl(peer).posts, target, peer, "progress");
}

void Comm::wait_all(Op &op, uint32_t target) {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) wait_flag(op, seg_.ctl(p).posts, target, p, "progress");
  }
  if (reached(target, known_all_)) known_all_ = target;
}

void Comm::before_writing_half(Op &op, int half) {
  if (!reached(known_all_, need_[half])) wait_all(op, need_[half]);
}

template <typename Stage, typename Consume>
void Comm::round(Op &op, bool stages, Who waits, int root, Stage stage, Consume consume) {
  const int h = static_cast<int>(rounds_++ & 1);
  const bool first = posts_ == op.base;
  // The call stamp of half h follows the half's reuse rule, on ranks that stage nothing too.
  if (stages || first) before_writing_half(op, h);
  if (stages) stage(seg_.staging(rank_, h));
  if (first) publish_call(op, h);
  post_progress();
  need_[h] = posts_ + 1;  // readers read between this post and their next one
  if (waits == Who::kAll) {
    wait_all(op, posts_);
  } else if (waits == Who::kRoot) {
    wait_rank(op, root, posts_);
  }
  if (first) check_calls(op, waits, root, h);  // before reading anything of theirs
  consume(h);
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------

void Comm::execute(const mncl_coll_v1_t &c) {
  const int64_t timeout_ms = c.timeout_ms > 0 ? c.timeout_ms : default_timeout_ms_;
  const bool p2p = c.kind == MNCL_COLL_SEND || c.kind == MNCL_COLL_RECV;
  // posts_ belongs to the collective lane: a send/recv running beside a collective must not
  // even read it.
  Op op{kind_name(c.kind), c.seq, timeout_ms, Clock::now() + std::chrono::milliseconds(timeout_ms),
        p2p ? 0u : posts_};
  op.p2p = p2p;
  // The core validated the descriptor; this only keeps a direct caller (a test) from making us
  // read arrays that are not there.
  if (is_v_kind(c.kind) && (c.counts == nullptr || c.nbufs != static_cast<size_t>(size_))) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: needs %d counts per array, got %zu%s", op.where().c_str(),
                                 size_, c.nbufs, c.counts == nullptr ? " (counts is NULL)" : ""));
  }
  // Gatherv / scatterv: the root's arrays only (NULL elsewhere), and a root we can index.
  if (is_rooted_v_kind(c.kind) && (c.nbufs != static_cast<size_t>(size_) || c.root < 0 ||
                                   c.root >= size_ || (c.root == rank_ && c.counts == nullptr))) {
    throw kit::Error(
        MNCL_ERR_INVALID_ARGUMENT,
        kit::format("%s: root %d of %d ranks, %zu counts per array%s", op.where().c_str(), c.root,
                    size_, c.nbufs,
                    c.root == rank_ && c.counts == nullptr ? " (counts is NULL)" : ""));
  }
  if (!p2p) {  // the call stamp (issue 9): send/recv never stamp RankCtl::call
    const int32_t o = is_reduction(c.kind) ? c.op : -1;
    const int32_t r = is_rooted(c.kind) || is_rooted_v_kind(c.kind) ? c.root : -1;
    const int32_t dtype = c.kind == MNCL_COLL_BARRIER ? -1 : c.dtype;
    op.count = c.kind == MNCL_COLL_BARRIER ? 0 : c.count;
    if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
      op.count = 0;
      for (size_t i = 0; i < c.nbufs; ++i) op.count += c.counts[i];
      op.counts = c.counts;
      op.nbufs = c.nbufs;
    }
    // Allgatherv: c.count is this rank's block; the total of recvcounts is the same everywhere
    // (as naive's header). Alltoallv has no count every rank shares: its first round checks.
    if (c.kind == MNCL_COLL_ALLGATHERV) {
      op.count = 0;
      for (size_t i = 0; i < c.nbufs; ++i) op.count += c.counts[i];
    }
    // Nor have gatherv / scatterv (only the root knows every block's count): round 0 checks.
    if (c.kind == MNCL_COLL_ALLTOALLV || is_rooted_v_kind(c.kind)) op.count = 0;
    op.head = static_cast<uint64_t>(c.kind & 0xff) << 32 | static_cast<uint64_t>(dtype & 0xff)
                                                               << 40;
    // allreduce_coalesced has no root: that word carries a digest of nbufs and counts instead,
    // since the total alone lets ranks that split it differently mix elements across buffers.
    const uint32_t high = c.kind == MNCL_COLL_ALLREDUCE_COALESCED
                              ? kit::split_digest(c.counts, c.nbufs)
                              : static_cast<uint32_t>(r);
    op.op_root = static_cast<uint32_t>(o) | static_cast<uint64_t>(high) << 32;
  }
  check_failed(op);
  if (const std::string why = broken(); !why.empty()) {
    throw kit::Error(
        MNCL_ERR_REMOTE,
        op.where() + ": the communicator is unusable after an earlier failure: " + why);
  }
  if (c.kind != MNCL_COLL_BARRIER && kit::dtype_size(c.dtype) == 0) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: unknown dtype %d", op.where().c_str(), c.dtype));
  }
  MNCL_KIT_LOG(host_, MNCL_LOG_TRACE, "%s: rank %d/%d %s count %zu root %d", op.where().c_str(),
               rank_, size_, kit::dtype_name(c.dtype), c.count, c.root);
  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
      return allreduce(op, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, -1);
    case MNCL_COLL_REDUCE:
      return allreduce(op, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, c.root);
    case MNCL_COLL_BCAST:
      return bcast(op, c);
    case MNCL_COLL_SCATTER:
      return scatter(op, c);
    case MNCL_COLL_GATHER:
      return gather(op, c);
    case MNCL_COLL_ALLGATHER:
      return allgather(op, c);
    case MNCL_COLL_REDUCE_SCATTER:
      return reduce_scatter(op, c);
    case MNCL_COLL_ALLTOALL:
      return alltoall(op, c);
    case MNCL_COLL_BARRIER:
      return barrier(op);
    case MNCL_COLL_SEND:
      return send(op, c);
    case MNCL_COLL_RECV:
      return recv(op, c);
    case MNCL_COLL_ALLREDUCE_COALESCED:
      return allreduce_coalesced(op, c);
    case MNCL_COLL_ALLGATHERV:
      return allgatherv(op, c);
    case MNCL_COLL_ALLTOALLV:
      return alltoallv(op, c);
    case MNCL_COLL_GATHERV:
      return gatherv(op, c);
    case MNCL_COLL_SCATTERV:
      return scatterv(op, c);
    default:
      throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                       kit::format("shm: collective kind %d is not supported", c.kind));
  }
}

// ---------------------------------------------------------------------------------------------
// Collectives. Zero bytes: every rank sees the same count, so all return without a post.
// ---------------------------------------------------------------------------------------------

// root < 0: allreduce; otherwise reduce to root (recv is only touched there).
void Comm::allreduce(Op &op, const void *send, void *recv, size_t count, int32_t dtype, int32_t o,
                     int root) {
  const size_t es = kit::dtype_size(dtype);
  const size_t bytes = count * es;
  if (bytes == 0) return;
  const bool out_here = root < 0 || root == rank_;
  const void *srcs[256];
  std::vector<const void *> many;
  const void **src = srcs;
  if (size_ > 256) {
    many.resize(static_cast<size_t>(size_));
    src = many.data();
  }

  if (bytes <= small_) {
    // Single phase: publish, one post, fold everything in rank order.
    round(
        op, true, out_here ? Who::kAll : Who::kNone, root,
        [&](unsigned char *st) { std::memcpy(st, send, bytes); },
        [&](int h) {
          if (!out_here) return;
          for (int p = 0; p < size_; ++p) src[p] = seg_.staging(p, h);
          fold(recv, src, size_, count, dtype, o);
        });
    return;
  }

  // Reduce-scatter + allgather, one chunk per round. Rank r owns slice r of each chunk: it
  // stages only the other n-1 slices (nobody else reads its slice r), folds slice r from its
  // own input and the others' staging, and leaves the reduced slice in its own staging half
  // at slice r, where everyone copies it from after the second post.
  const size_t per_round = chunk_ / es;
  const size_t align = std::max<size_t>(1, 64 / es);  // slices start on cache lines
  const bool stream = bytes >= nt_bytes_;
  auto copy_out = [&](void *dst, const void *from, size_t len) {
    if (stream) {
      stream_copy(dst, from, len);
    } else {
      std::memcpy(dst, from, len);
    }
  };
  const size_t n = static_cast<size_t>(size_);
  for (size_t off = 0; off < count; off += per_round) {
    const size_t m = std::min(per_round, count - off);
    const size_t slice = ((m + n - 1) / n + align - 1) / align * align;
    auto lo_of = [&](size_t r) { return std::min(m, r * slice); };
    auto hi_of = [&](size_t r) { return std::min(m, (r + 1) * slice); };
    const size_t me = static_cast<size_t>(rank_);
    const size_t lo = lo_of(me), hi = hi_of(me);
    const unsigned char *in = bytes_at(send, off * es);
    const int h = static_cast<int>(rounds_++ & 1);
    unsigned char *mine = seg_.staging(rank_, h);
    before_writing_half(op, h);
    if (lo > 0) std::memcpy(mine, in, lo * es);
    if (m > hi) std::memcpy(mine + hi * es, in + hi * es, (m - hi) * es);
    if (off == 0) publish_call(op, h);
    post_progress();
    wait_all(op, posts_);
    if (off == 0) check_calls(op, Who::kAll, -1, h);
    if (hi > lo) {
      for (size_t p = 0; p < n; ++p) {
        src[p] = p == me ? in + lo * es : seg_.staging(static_cast<int>(p), h) + lo * es;
      }
      fold(mine + lo * es, src, size_, hi - lo, dtype, o);
    }
    post_progress();
    need_[h] = posts_ + 1;  // peers read slice r of this half until their next post
    if (out_here) {
      wait_all(op, posts_);
      unsigned char *out = bytes_at(recv, off * es);
      for (size_t p = 0; p < n; ++p) {
        const size_t plo = lo_of(p), phi = hi_of(p);
        if (phi > plo) {
          copy_out(out + plo * es, seg_.staging(static_cast<int>(p), h) + plo * es,
                   (phi - plo) * es);
        }
      }
    }
  }
}

// One packed allreduce: the result equals nbufs separate calls (element-wise ops).
void Comm::allreduce_coalesced(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  size_t total = 0;
  for (size_t i = 0; i < c.nbufs; ++i) total += c.counts[i];
  if (total == 0) return;
  scratch_.resize(total * es);
  for (size_t i = 0, off = 0; i < c.nbufs; off += c.counts[i] * es, ++i) {
    copy_block(scratch_.data() + off, c.sendbufs[i], c.counts[i] * es);
  }
  allreduce(op, scratch_.data(), scratch_.data(), total, c.dtype, c.op, -1);
  for (size_t i = 0, off = 0; i < c.nbufs; off += c.counts[i] * es, ++i) {
    copy_block(c.recvbufs[i], scratch_.data() + off, c.counts[i] * es);
  }
}

void Comm::bcast(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  if (bytes == 0 || size_ == 1) return;
  const bool root = rank_ == c.root;
  for (size_t off = 0; off < bytes; off += chunk_) {
    const size_t m = std::min(chunk_, bytes - off);
    round(
        op, root, root ? Who::kNone : Who::kRoot, c.root,
        [&](unsigned char *st) { std::memcpy(st, bytes_at(c.recvbuf, off), m); },
        [&](int h) {
          if (!root) std::memcpy(bytes_at(c.recvbuf, off), seg_.staging(c.root, h), m);
        });
  }
}

void Comm::scatter(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const size_t bytes = c.count * es;
  if (bytes == 0) return;
  const bool root = rank_ == c.root;
  const size_t per_round = chunk_ / (static_cast<size_t>(size_) * es);  // per block
  const size_t sub = per_round * es;  // bytes of one block's part in the staging half
  for (size_t off = 0; off < c.count; off += per_round) {
    const size_t m = std::min(per_round, c.count - off);
    round(
        op, root, root ? Who::kNone : Who::kRoot, c.root,
        [&](unsigned char *st) {
          for (int d = 0; d < size_; ++d) {
            if (d == rank_) continue;
            std::memcpy(st + static_cast<size_t>(d) * sub,
                        bytes_at(c.sendbuf, (static_cast<size_t>(d) * c.count + off) * es), m * es);
          }
        },
        [&](int h) {
          if (!root) {
            std::memcpy(bytes_at(c.recvbuf, off * es),
                        seg_.staging(c.root, h) + static_cast<size_t>(rank_) * sub, m * es);
          }
        });
  }
  if (root) copy_block(c.recvbuf, bytes_at(c.sendbuf, static_cast<size_t>(rank_) * bytes), bytes);
}

void Comm::gather(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const size_t bytes = c.count * es;
  if (bytes == 0) return;
  const bool root = rank_ == c.root;
  if (root) copy_block(bytes_at(c.recvbuf, static_cast<size_t>(rank_) * bytes), c.sendbuf, bytes);
  for (size_t off = 0; off < bytes; off += chunk_) {
    const size_t m = std::min(chunk_, bytes - off);
    round(
        op, !root, root ? Who::kAll : Who::kNone, c.root,
        [&](unsigned char *st) { std::memcpy(st, bytes_at(c.sendbuf, off), m); },
        [&](int h) {
          if (!root) return;
          for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            std::memcpy(bytes_at(c.recvbuf, static_cast<size_t>(p) * bytes + off),
                        seg_.staging(p, h), m);
          }
        });
  }
}

void Comm::allgather(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  if (bytes == 0) return;
  copy_block(bytes_at(c.recvbuf, static_cast<size_t>(rank_) * bytes), c.sendbuf, bytes);
  for (size_t off = 0; off < bytes; off += chunk_) {
    const size_t m = std::min(chunk_, bytes - off);
    round(
        op, true, Who::kAll, -1,
        [&](unsigned char *st) { std::memcpy(st, bytes_at(c.sendbuf, off), m); },
        [&](int h) {
          for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            std::memcpy(bytes_at(c.recvbuf, static_cast<size_t>(p) * bytes + off),
                        seg_.staging(p, h), m);
          }
        });
  }
}

void Comm::reduce_scatter(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  if (c.count == 0) return;
  const size_t per_round = chunk_ / (static_cast<size_t>(size_) * es);
  const size_t sub = per_round * es;
  std::vector<const void *> src(static_cast<size_t>(size_));
  for (size_t off = 0; off < c.count; off += per_round) {
    const size_t m = std::min(per_round, c.count - off);
    round(
        op, true, Who::kAll, -1,
        [&](unsigned char *st) {
          // Our own block too: in place, the output overlaps it, so fold from the copy.
          for (int d = 0; d < size_; ++d) {
            std::memcpy(st + static_cast<size_t>(d) * sub,
                        bytes_at(c.sendbuf, (static_cast<size_t>(d) * c.count + off) * es), m * es);
          }
        },
        [&](int h) {
          for (int p = 0; p < size_; ++p) {
            src[static_cast<size_t>(p)] = seg_.staging(p, h) + static_cast<size_t>(rank_) * sub;
          }
          fold(bytes_at(c.recvbuf, off * es), src.data(), size_, m, c.dtype, c.op);
        });
  }
}

void Comm::alltoall(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const size_t bytes = c.count * es;
  if (bytes == 0) return;
  const size_t me = static_cast<size_t>(rank_);
  copy_block(bytes_at(c.recvbuf, me * bytes), bytes_at(c.sendbuf, me * bytes), bytes);
  const size_t per_round = chunk_ / (static_cast<size_t>(size_) * es);
  const size_t sub = per_round * es;
  for (size_t off = 0; off < c.count; off += per_round) {
    const size_t m = std::min(per_round, c.count - off);
    // In place is safe: round j stages chunk j of every block before anything overwrites it.
    round(
        op, true, Who::kAll, -1,
        [&](unsigned char *st) {
          for (int d = 0; d < size_; ++d) {
            if (d == rank_) continue;
            std::memcpy(st + static_cast<size_t>(d) * sub,
                        bytes_at(c.sendbuf, (static_cast<size_t>(d) * c.count + off) * es), m * es);
          }
        },
        [&](int h) {
          for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            std::memcpy(bytes_at(c.recvbuf, (static_cast<size_t>(p) * c.count + off) * es),
                        seg_.staging(p, h) + me * sub, m * es);
          }
        });
  }
}

// ---------------------------------------------------------------------------------------------
// Kinds with a count per rank (plugin ABI v3). No rank may trust another's counts, and ranks
// that disagree on them would run different numbers of rounds. So round 0 of every call (empty
// ones too) stages this rank's count arrays in front of its data, and every rank checks every
// rank's arrays before it reads any data: on a disagreement all of them fail together with
// MNCL_ERR_REMOTE (fail_mismatch), before any rank has read a byte or run a second round. The
// number of rounds then follows from counts every rank has seen, so it is the same everywhere.
// Round j moves the bytes [off_j, off_j + room_j) of each block; round 0 has less room (the
// arrays come first).
// ---------------------------------------------------------------------------------------------

namespace {

// Bytes of the count arrays at the front of round 0's staging: allgatherv's recvcounts,
// alltoallv's sendcounts then recvcounts, the gatherv root's recvcounts (its staging holds no
// data) or the scatterv root's sendcounts, as uint64_t; a cache line multiple.
size_t v_arrays_bytes(int32_t kind, int n) {
  const size_t words = static_cast<size_t>(n) * (kind == MNCL_COLL_ALLTOALLV ? 2 : 1);
  return (words * sizeof(uint64_t) + 63) / 64 * 64;
}
uint64_t load_word(const unsigned char *p, size_t i) {
  uint64_t v;
  std::memcpy(&v, p + i * sizeof v, sizeof v);
  return v;
}
void store_word(unsigned char *p, size_t i, uint64_t v) {
  std::memcpy(p + i * sizeof v, &v, sizeof v);
}

// The rounds of a v-collective: `first` bytes of each block in round 0, `room` in each later one.
struct VRounds {
  size_t first, room;
  size_t off(size_t j) const { return j == 0 ? 0 : first + (j - 1) * room; }
  size_t cap(size_t j) const { return j == 0 ? first : room; }
  // How much of a block of `len` bytes round j moves.
  size_t piece(size_t j, size_t len) const {
    return len > off(j) ? std::min(cap(j), len - off(j)) : 0;
  }
  size_t count_for(size_t max_len) const {
    return max_len <= first ? 1 : 1 + (max_len - first + room - 1) / room;
  }
};

// A per-destination sub-slot of `room` bytes split n ways, on cache lines where it can be.
size_t per_peer(size_t room, int n) {
  const size_t each = room / static_cast<size_t>(n);
  return each >= 64 ? each / 64 * 64 : each;
}

}  // namespace

size_t Comm::v_arrays(Op &op, int32_t kind) {
  const size_t bytes = v_arrays_bytes(kind, size_);
  // chunk_ and size_ are the same on every rank, so all refuse together (never with >= 64K
  // chunks below 4096 ranks).
  if (bytes >= chunk_) {
    throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                     kit::format("%s: %d ranks' counts do not fit a %zu-byte staging chunk "
                                 "(raise MNCL_SHM_CHUNK)",
                                 op.where().c_str(), size_, chunk_));
  }
  return bytes;
}

// The rounds of a v-collective: round 0 stages this rank's count arrays (`arrays` bytes,
// put_counts) ahead of its data; once the ranks it waits for (plan) have posted, check_counts
// verifies their arrays and returns the longest block in bytes, which fixes the number of rounds
// on every rank alike. stage(j, at) writes round j's data at `at` (only on ranks that stage that
// round); collect(j, half, skip) reads it, `skip` bytes in.
template <typename Rounds, typename PutCounts, typename Stage, typename CheckCounts,
          typename Collect>
void Comm::v_rounds(Op &op, size_t arrays, const VPlan &plan, const Rounds &r, PutCounts put_counts,
                    Stage stage, CheckCounts check_counts, Collect collect) {
  size_t rounds = 1;  // the rest is known once round 0 has checked the counts
  for (size_t j = 0; j < rounds; ++j) {
    const size_t skip = j == 0 ? arrays : 0;
    const int half = static_cast<int>(rounds_ & 1);  // the one round() is about to use
    round(
        op, j == 0 ? plan.stages0 : plan.stages, j == 0 ? plan.waits0 : plan.waits, plan.root,
        [&](unsigned char *st) {
          if (j == 0) put_counts(st, half);
          stage(j, st + skip);
        },
        [&](int h) {
          if (j == 0) rounds = r.count_for(check_counts(h));
          collect(j, h, skip);
        });
  }
}

void Comm::allgatherv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const kit::VLayout v = kit::v_layout(c);
  const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
  if (c.count != v.recvcounts[me]) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: sends %zu elements but recvcounts[%d] is %zu",
                                 op.where().c_str(), c.count, rank_, v.recvcounts[me]));
  }
  auto out = [&](size_t p) { return bytes_at(c.recvbuf, v.rdispls[p] * es); };
  const size_t mine = c.count * es;
  copy_block(out(me), c.sendbuf, mine);  // in place: already there
  if (size_ == 1) return;
  const size_t arrays = v_arrays(op, c.kind);
  const VRounds r{chunk_ - arrays, chunk_};
  v_rounds(
      op, arrays, VPlan{}, r,
      [&](unsigned char *st, int) {
        for (size_t i = 0; i < n; ++i) store_word(st, i, v.recvcounts[i]);
      },
      [&](size_t j, unsigned char *st) {
        const size_t m = r.piece(j, mine);
        if (m > 0) std::memcpy(st, bytes_at(c.sendbuf, r.off(j)), m);
      },
      [&](int h) {
        size_t longest = 0;
        for (size_t p = 0; p < n; ++p) {
          longest = std::max(longest, v.recvcounts[p] * es);
          if (p == me) continue;
          const unsigned char *theirs = seg_.staging(static_cast<int>(p), h);
          for (size_t i = 0; i < n; ++i) {
            if (load_word(theirs, i) == v.recvcounts[i]) continue;
            fail_mismatch(op, kit::format("%s: mismatched counts: rank %zu passes "
                                          "recvcounts[%zu] = %llu where rank %d passes %zu "
                                          "(recvcounts must be the same on every rank)",
                                          op.where().c_str(), p, i,
                                          static_cast<unsigned long long>(load_word(theirs, i)),
                                          rank_, v.recvcounts[i]));
          }
        }
        return longest;
      },
      [&](size_t j, int h, size_t skip) {
        for (size_t p = 0; p < n; ++p) {
          const size_t m = p == me ? 0 : r.piece(j, v.recvcounts[p] * es);
          if (m > 0) {
            std::memcpy(out(p) + r.off(j), seg_.staging(static_cast<int>(p), h) + skip, m);
          }
        }
      });
}

// Round j stages, for each destination d, its part of block d in sub-slot d of the staging half.
void Comm::alltoallv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const kit::VLayout v = kit::v_layout(c);
  const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
  if (v.sendcounts[me] != v.recvcounts[me]) {
    throw kit::Error(
        MNCL_ERR_INVALID_ARGUMENT,
        kit::format("%s: sendcounts[%d] is %zu but recvcounts[%d] is %zu", op.where().c_str(),
                    rank_, v.sendcounts[me], rank_, v.recvcounts[me]));
  }
  auto in = [&](size_t d) { return bytes_at(c.sendbuf, v.sdispls[d] * es); };
  auto out = [&](size_t p) { return bytes_at(c.recvbuf, v.rdispls[p] * es); };
  // Never in place (the core refuses overlaps), so the own block can go first.
  copy_block(out(me), in(me), v.recvcounts[me] * es);
  if (size_ == 1) return;
  const size_t arrays = v_arrays(op, c.kind);
  const VRounds r{per_peer(chunk_ - arrays, size_), per_peer(chunk_, size_)};
  v_rounds(
      op, arrays, VPlan{}, r,
      [&](unsigned char *st, int) {
        for (size_t i = 0; i < n; ++i) {
          store_word(st, i, v.sendcounts[i]);
          store_word(st, n + i, v.recvcounts[i]);
        }
      },
      [&](size_t j, unsigned char *st) {
        for (size_t d = 0; d < n; ++d) {
          const size_t m = d == me ? 0 : r.piece(j, v.sendcounts[d] * es);
          if (m > 0) std::memcpy(st + d * r.cap(j), in(d) + r.off(j), m);
        }
      },
      [&](int h) {
        // Every pair, not only this rank's: all ranks then fail together (see above).
        size_t longest = 0;
        for (size_t s = 0; s < n; ++s) {
          const unsigned char *from = seg_.staging(static_cast<int>(s), h);
          for (size_t d = 0; d < n; ++d) {
            if (d == s) continue;
            const uint64_t sends = load_word(from, d);
            const uint64_t expects = load_word(seg_.staging(static_cast<int>(d), h), n + s);
            if (sends != expects) {
              fail_mismatch(
                  op, kit::format("%s: mismatched counts: rank %zu sends %llu "
                                  "elements to rank %zu, which expects %llu from it "
                                  "(do sendcounts and recvcounts agree across "
                                  "ranks?)",
                                  op.where().c_str(), s, static_cast<unsigned long long>(sends), d,
                                  static_cast<unsigned long long>(expects)));
            }
            longest = std::max(longest, static_cast<size_t>(sends) * es);
          }
        }
        return longest;
      },
      [&](size_t j, int h, size_t skip) {
        for (size_t p = 0; p < n; ++p) {
          const size_t m = p == me ? 0 : r.piece(j, v.recvcounts[p] * es);
          if (m > 0) {
            std::memcpy(out(p) + r.off(j),
                        seg_.staging(static_cast<int>(p), h) + skip + me * r.cap(j), m);
          }
        }
      });
}

// What gatherv and scatterv do first on the root: check its own count against its entry
// (every rank fails alike otherwise), then move its own block, unless it is in place.
void Comm::root_own_block(Op &op, const mncl_coll_v1_t &c, const kit::RootedVLayout &v) {
  if (rank_ != c.root) return;
  const bool gather = c.kind == MNCL_COLL_GATHERV;
  const size_t es = kit::dtype_size(c.dtype), me = static_cast<size_t>(rank_);
  if (c.count != v.counts[me]) {
    fail_local(op, kit::format("%s: the root %s %zu elements but %s[%d] is %zu", op.where().c_str(),
                               gather ? "sends" : "receives", c.count,
                               gather ? "recvcounts" : "sendcounts", rank_, v.counts[me]));
  }
  const size_t mine = c.count * es;
  if (mine == 0) return;  // an empty block's displacement is never used
  if (gather) {
    copy_block(bytes_at(c.recvbuf, v.displs[me] * es), c.sendbuf, mine);
  } else {
    copy_block(c.recvbuf, bytes_at(c.sendbuf, v.displs[me] * es), mine);
  }
}

// Gatherv (plugin ABI v5): gather's rounds, a count per block. In round 0 the root stages its
// recvcounts (and no data) and every other rank its count in its RankCtl::v_count word, so the
// data keep the whole staging half (as many rounds as gather). The root (waiting for all, as in
// gather) checks each rank's count against recvcounts[i], each other rank (waiting for the root
// in round 0 only) the root's recvcounts[rank] against its own, before reading anything. From
// round 1 on only the non-roots stage and only the root waits, as in gather.
void Comm::gatherv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const kit::RootedVLayout v = kit::rooted_v_layout(c);
  const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
  const int root = c.root;
  const bool is_root = rank_ == root;
  root_own_block(op, c, v);
  auto out = [&](size_t p) { return bytes_at(c.recvbuf, v.displs[p] * es); };
  if (size_ == 1) return;
  v_arrays(op, c.kind);  // the root's recvcounts must fit its staging half
  const VRounds r{chunk_, chunk_};
  const VPlan plan{true, !is_root, is_root ? Who::kAll : Who::kRoot,
                   is_root ? Who::kAll : Who::kNone, root};
  v_rounds(
      op, 0, plan, r,
      [&](unsigned char *st, int h) {
        if (!is_root) {
          seg_.ctl(rank_).v_count[h].store(c.count, std::memory_order_relaxed);  // the post
          return;                                                                // publishes it
        }
        for (size_t i = 0; i < n; ++i) store_word(st, i, v.counts[i]);
      },
      [&](size_t j, unsigned char *st) {
        const size_t m = is_root ? 0 : r.piece(j, c.count * es);
        if (m > 0) std::memcpy(st, bytes_at(c.sendbuf, r.off(j)), m);
      },
      [&](int h) {
        size_t longest = 0;
        if (is_root) {
          for (size_t p = 0; p < n; ++p) {
            if (p == me) continue;
            const uint64_t sends =
                seg_.ctl(static_cast<int>(p)).v_count[h].load(std::memory_order_relaxed);
            if (sends != v.counts[p]) {
              fail_mismatch(
                  op, kit::format("%s: mismatched counts: rank %zu sends %llu elements "
                                  "to root %d, which expects recvcounts[%zu] = %zu",
                                  op.where().c_str(), p, static_cast<unsigned long long>(sends),
                                  rank_, p, v.counts[p]));
            }
            longest = std::max(longest, v.counts[p] * es);
          }
          return longest;
        }
        const unsigned char *theirs = seg_.staging(root, h);
        const uint64_t expects = load_word(theirs, me);
        if (expects != c.count) {
          // The root has this rank's count (published before this check) and finds the same
          // disagreement, unless a wait ends its call first: on this rank's note, or on the
          // abort this rank's caller may send next (the documented way out of a failed call),
          // which without the note would leave the root a bare "aborted by rank N". With the
          // note (whichever rank writes it first), every rank's error names the counts.
          fail_mismatch(op, kit::format("%s: mismatched counts: root %d expects recvcounts[%d] = "
                                        "%llu elements from rank %d, which sends %zu",
                                        op.where().c_str(), root, rank_,
                                        static_cast<unsigned long long>(expects), rank_, c.count));
        }
        for (size_t p = 0; p < n; ++p) {
          if (p != static_cast<size_t>(root)) {
            longest = std::max(longest, static_cast<size_t>(load_word(theirs, p)) * es);
          }
        }
        return longest;
      },
      [&](size_t j, int h, size_t) {
        if (!is_root) return;
        for (size_t p = 0; p < n; ++p) {
          const size_t m = p == me ? 0 : r.piece(j, v.counts[p] * es);
          if (m > 0) std::memcpy(out(p) + r.off(j), seg_.staging(static_cast<int>(p), h), m);
        }
      });
}

// Scatterv (plugin ABI v5): scatter's rounds, a count per block. Only the root stages: in every
// round each destination's part of its block in sub-slot d (as alltoallv), and in round 0 its
// sendcounts ahead of the data (at most one round more than scatter). Each other rank waits for
// the root in every round (as in scatter) and, having checked the root's call stamp, checks the
// root's sendcounts[rank] against its own count before it reads anything, and takes the number
// of rounds from the root's counts. It reads nothing but the root's staging, which only the root
// writes: a rank that wrongly acts as a root (another root argument) writes only its own staging,
// so it cannot change what the true root's receivers read. The root waits for nobody, so a
// disagreement fails the receiving rank (and the root's next wait, if any).
void Comm::scatterv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const kit::RootedVLayout v = kit::rooted_v_layout(c);
  const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
  const int root = c.root;
  const bool is_root = rank_ == root;
  root_own_block(op, c, v);
  auto in = [&](size_t d) { return bytes_at(c.sendbuf, v.displs[d] * es); };
  if (size_ == 1) return;
  const size_t arrays = v_arrays(op, c.kind);  // the root's sendcounts, ahead of round 0's data
  const VRounds r{per_peer(chunk_ - arrays, size_), per_peer(chunk_, size_)};
  if (r.first == 0) {  // the same on every rank: all refuse together
    throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                     kit::format("%s: %d ranks leave no room in a %zu-byte staging chunk "
                                 "(raise MNCL_SHM_CHUNK)",
                                 op.where().c_str(), size_, chunk_));
  }
  const Who waits = is_root ? Who::kNone : Who::kRoot;
  const VPlan plan{is_root, is_root, waits, waits, root};
  v_rounds(
      op, arrays, plan, r,
      [&](unsigned char *st, int) {  // the root's (only the root stages)
        for (size_t d = 0; d < n; ++d) store_word(st, d, v.counts[d]);
      },
      [&](size_t j, unsigned char *st) {
        for (size_t d = 0; d < n; ++d) {
          const size_t m = d == me ? 0 : r.piece(j, v.counts[d] * es);
          if (m > 0) std::memcpy(st + d * r.cap(j), in(d) + r.off(j), m);
        }
      },
      [&](int h) {
        // The root's counts: its own arrays on the root, its staging (checked stamp) elsewhere.
        const unsigned char *theirs = is_root ? nullptr : seg_.staging(root, h);
        auto count_of = [&](size_t d) {
          return is_root ? static_cast<uint64_t>(v.counts[d]) : load_word(theirs, d);
        };
        if (!is_root && count_of(me) != c.count) {
          fail_mismatch(op,
                        kit::format("%s: mismatched counts: root %d sends sendcounts[%d] = "
                                    "%llu elements to rank %d, which expects %zu",
                                    op.where().c_str(), root, rank_,
                                    static_cast<unsigned long long>(count_of(me)), rank_, c.count));
        }
        size_t longest = 0;
        for (size_t d = 0; d < n; ++d) {
          if (d != static_cast<size_t>(root)) {
            longest = std::max(longest, static_cast<size_t>(count_of(d)) * es);
          }
        }
        return longest;
      },
      [&](size_t j, int h, size_t skip) {
        const size_t m = is_root ? 0 : r.piece(j, c.count * es);
        if (m > 0) {
          std::memcpy(bytes_at(c.recvbuf, r.off(j)), seg_.staging(root, h) + skip + me * r.cap(j),
                      m);
        }
      });
}

void Comm::barrier(Op &op) {
  if (size_ == 1) return;
  round(
      op, false, Who::kAll, -1, [](unsigned char *) {}, [](int) {});
}

// ---------------------------------------------------------------------------------------------
// Point to point: channel (src, dst) has two slots; chunk k of the pair goes to slot k % 2.
// The sender may fill chunk k once the receiver has emptied chunk k-2 (acked >= k-1).
// A SEND to p touches only channel (me, p) and send_lanes_[p], a RECV from p only channel
// (p, me) and recv_lanes_[p]: each runs beside the collective and the other lanes (v2).
// ---------------------------------------------------------------------------------------------

Comm::P2p Comm::p2p_message(const Op &op, const mncl_coll_v1_t &c) const {
  const int peer = c.root;
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: bad peer %d", op.where().c_str(), peer));
  }
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  // An empty message still takes one chunk: the receiver must see it arrive.
  return {peer, bytes, bytes == 0 ? 1 : (bytes + p2p_slot_ - 1) / p2p_slot_};
}

// Offers the message for a single copy (see "send/recv" in shm_comm.h): one chunk carrying
// only the header and the send buffer's address, then a wait for the receiver's answer. true
// if it copied the message; false if it declined (the caller streams it) or no offer is made.
bool Comm::offer_single_copy(Op &op, const mncl_coll_v1_t &c, int peer, size_t bytes,
                             const char *what) {
  PeerLane &lane = send_lanes_[static_cast<size_t>(peer)];
  // A peer in another PID namespace cannot name this process to process_vm_readv; it would
  // decline anyway (both sides read the same namespaces from the segment), so offer nothing.
  if (!single_copy_offers_ || lane.no_single_copy || bytes <= 2 * p2p_slot_ ||
      !pid_usable_[static_cast<size_t>(peer)]) {
    return false;
  }
  Channel &ch = seg_.channel(rank_, peer);
  const uint64_t k = lane.chunks;
  SlotHeader &slot = ch.slot[k & 1u];
  if (k >= 2) wait_flag(op, ch.acked, flag_value(k - 1), peer, what);
  slot.message_bytes = bytes;
  slot.chunk_bytes = 0;
  slot.count = c.count;
  slot.dtype = c.dtype;
  slot.remote_addr = reinterpret_cast<uintptr_t>(c.sendbuf);
  __atomic_store_n(&slot.single_copy, kSingleCopyOffered, __ATOMIC_RELAXED);
  post(ch.sent, flag_value(k + 1));
  lane.chunks = k + 1;
  // The receiver reads the buffer meanwhile: only its answer lets the caller have it back.
  try {
    wait_flag(op, ch.acked, flag_value(k + 1), peer, what);
  } catch (...) {
    // Withdraw the offer, claimed or not, and hand the buffer back now: a reader that is stuck
    // (stopped, swapping) must not hold this call past its deadline. A reader still copying
    // finds the offer withdrawn when it answers and fails instead of returning what it read.
    for (uint64_t state : {kSingleCopyOffered, kSingleCopyReading}) {
      if (__atomic_compare_exchange_n(&slot.single_copy, &state, kSingleCopyRevoked, false,
                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        break;
      }
    }
    throw;
  }
  if (__atomic_load_n(&slot.single_copy, __ATOMIC_ACQUIRE) == kSingleCopyDone) return true;
  lane.no_single_copy = true;
  return false;
}

// process_vm_readv from the peer's memory; false if the kernel refuses or the read fails.
// Only for a peer in this rank's PID namespace (pid_usable_): elsewhere its pid is another
// process's, and a read could succeed with the wrong bytes.
bool Comm::read_from_peer(int peer, void *dst, uint64_t remote_addr, size_t bytes) {
  const pid_t pid = seg_.ctl(peer).pid.load(std::memory_order_acquire);
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char *>(dst) + done, bytes - done};
    iovec remote{reinterpret_cast<void *>(remote_addr + done), bytes - done};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (!single_copy_refused_logged_.exchange(true)) {
        MNCL_KIT_LOG(host_, MNCL_LOG_INFO,
                     "shm: rank %d: single-copy read from rank %d refused (%s); large "
                     "messages stream through the segment instead",
                     rank_, peer, n < 0 ? std::strerror(errno) : "no progress");
      }
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

void Comm::send(Op &op, const mncl_coll_v1_t &c) {
  const auto [peer, bytes, chunks] = p2p_message(op, c);
  Channel &ch = seg_.channel(rank_, peer);
  PeerLane &lane = send_lanes_[static_cast<size_t>(peer)];
  const std::string what =
      kit::format("room for message #%llu", static_cast<unsigned long long>(lane.msgs));
  if (offer_single_copy(op, c, peer, bytes, what.c_str())) {
    ++lane.msgs;
    return;
  }
  op.chunks = static_cast<uint32_t>(chunks);
  for (size_t i = 0; i < chunks; ++i) {
    const uint64_t k = lane.chunks;
    const int slot = static_cast<int>(k & 1u);
    op.chunk = static_cast<uint32_t>(i + 1);
    if (k >= 2) wait_flag(op, ch.acked, flag_value(k - 1), peer, what.c_str());
    const size_t len = std::min(p2p_slot_, bytes - i * p2p_slot_);
    if (len > 0)
      std::memcpy(seg_.p2p_slot(rank_, peer, slot), bytes_at(c.sendbuf, i * p2p_slot_), len);
    ch.slot[slot].message_bytes = bytes;
    ch.slot[slot].chunk_bytes = len;
    ch.slot[slot].count = c.count;
    ch.slot[slot].dtype = c.dtype;
    ch.slot[slot].remote_addr = 0;
    post(ch.sent, flag_value(k + 1));
    lane.chunks = k + 1;
  }
  ++lane.msgs;
}

void Comm::recv(Op &op, const mncl_coll_v1_t &c) {
  const auto [peer, bytes, chunks] = p2p_message(op, c);
  Channel &ch = seg_.channel(peer, rank_);
  PeerLane &lane = recv_lanes_[static_cast<size_t>(peer)];
  const std::string what = kit::format("message #%llu", static_cast<unsigned long long>(lane.msgs));
  op.chunks = static_cast<uint32_t>(chunks);
  for (size_t i = 0; i < chunks;) {
    const uint64_t k = lane.chunks;
    const int slot = static_cast<int>(k & 1u);
    op.chunk = static_cast<uint32_t>(i + 1);
    wait_flag(op, ch.sent, flag_value(k + 1), peer, what.c_str());
    const SlotHeader hdr = ch.slot[slot];
    if (hdr.message_bytes != bytes || hdr.count != c.count || hdr.dtype != c.dtype) {
      const int32_t dt = static_cast<int32_t>(hdr.dtype);
      fail_mismatch(
          op, kit::format("%s: mismatched point-to-point calls: rank %d called send(%llu x %s) "
                          "where rank %d calls recv(%zu x %s) (%llu bytes sent, %zu expected)",
                          op.where().c_str(), peer, static_cast<unsigned long long>(hdr.count),
                          kit::dtype_size(dt) ? kit::dtype_name(dt) : "?", rank_, c.count,
                          kit::dtype_name(c.dtype),
                          static_cast<unsigned long long>(hdr.message_bytes), bytes));
    }
    if (hdr.remote_addr != 0) {  // a single-copy offer: the whole message, or it streams next
      uint64_t state = kSingleCopyOffered;
      if (!__atomic_compare_exchange_n(&ch.slot[slot].single_copy, &state, kSingleCopyReading,
                                       false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        // A sender that aborted set the abort word before it revoked: MNCL_ERR_ABORTED then,
        // as every call of an aborted communicator ends.
        check_failed(op);
        fail(op, MNCL_ERR_REMOTE,
             kit::format("%s: rank %d withdrew message #%llu (its send failed or was aborted) "
                         "before this receive could take it",
                         op.where().c_str(), peer, static_cast<unsigned long long>(lane.msgs)));
      }
      const bool copied = single_copy_accepts_ && pid_usable_[static_cast<size_t>(peer)] &&
                          read_from_peer(peer, c.recvbuf, hdr.remote_addr, bytes);
      state = kSingleCopyReading;
      if (!__atomic_compare_exchange_n(&ch.slot[slot].single_copy, &state,
                                       copied ? kSingleCopyDone : kSingleCopyDeclined, false,
                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        // The sender's call failed meanwhile and it took its buffer back: what was read may
        // be torn. Aborted (the abort word is set before the revoke): MNCL_ERR_ABORTED.
        check_failed(op);
        fail(op, MNCL_ERR_REMOTE,
             kit::format("%s: rank %d withdrew message #%llu (its send failed or was aborted) "
                         "while this receive was reading it",
                         op.where().c_str(), peer, static_cast<unsigned long long>(lane.msgs)));
      }
      post(ch.acked, flag_value(k + 1));
      lane.chunks = k + 1;
      if (copied) break;
      continue;
    }
    if (hdr.chunk_bytes > 0) {
      std::memcpy(bytes_at(c.recvbuf, i * p2p_slot_), seg_.p2p_slot(peer, rank_, slot),
                  hdr.chunk_bytes);
    }
    post(ch.acked, flag_value(k + 1));
    lane.chunks = k + 1;
    ++i;
  }
  ++lane.msgs;
}

}  // namespace mncl::shm

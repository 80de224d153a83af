// The shm backend's communicator: every collective through one shared-memory segment.
//
// Progress protocol. Each rank owns one counter in the segment (RankCtl::posts) and bumps it
// once per phase of every collective; every rank runs the same phases for the same call, so
// "rank p has posted v times" means the same point of the same collective everywhere. A
// collective is a sequence of rounds; in round j each rank
//   1. copies its part of chunk j into its staging half h (halves alternate round by round),
//   2. posts,
//   3. waits for the ranks whose staging it needs to have posted as often,
//   4. reads their staging (a fold in rank order, or plain copies) into its output,
// and in the two-phase allreduce/reduce also
//   5. posts again (its reduced slice is now in its own staging half),
//   6. waits for every rank's slice and copies the whole reduced chunk out.
// Reuse of a staging half is safe once every reader has posted again after reading it; since
// readers read between two of their own posts, the writer waits for "posts >= v+1" (need_[h])
// before overwriting, and skips the wait when an earlier wait already proved it. Every wait is
// for a value the waiter itself has already posted, so the slowest rank is never blocked and
// the protocol cannot deadlock; a rooted collective (bcast, scatter) lets its root run at most
// two rounds ahead.
//
// Algorithms:
//   allreduce, reduce  <= small bytes: single phase, every rank (reduce: the root) folds all
//                      n inputs in rank order: one post, one wait.
//                      larger: pipelined reduce-scatter + allgather in chunk-sized rounds;
//                      rank r stages the n-1 slices others reduce, folds slice r (rank order,
//                      its own part read straight from its input) into slice r of its own
//                      staging, then everyone copies the chunk out (non-temporal stores for big
//                      messages). The working set (2 x n chunks) stays in the LLC, so memory
//                      sees each input read once and each output written once.
//   reduce_scatter     rounds of n sub-blocks; rank r folds block r in rank order.
//   allgather, gather, bcast, scatter, alltoall: rounds of staged copies.
//   allgatherv, alltoallv (plugin ABI v3): the same, with a round 0 that always runs (empty
//                      calls too) and carries every rank's count arrays ahead of its data;
//                      each rank checks all of them before reading anything, so ranks whose
//                      counts disagree all fail with MNCL_ERR_REMOTE instead of running
//                      different numbers of rounds or reading past a block.
//   gatherv, scatterv  (plugin ABI v5): gather's and scatter's rounds through the same v-round
//                      loop, with the counts in round 0: gatherv, the root's recvcounts in its
//                      staging (it stages no data, so as many rounds as gather) and each other
//                      rank's count in its own RankCtl v_count word; scatterv, the root's
//                      sendcounts ahead of round 0's data in its staging (at most one round
//                      more than scatter). Every word is written by its owner only: a rank
//                      that wrongly acts as the root cannot change what the true root's peers
//                      read. Every non-root waits for the root in round 0 (scatterv: in every
//                      round, as scatter) and checks the root's count for it against its own;
//                      the gatherv root (which waits for all) checks every rank's count against
//                      recvcounts[i]. A disagreement fails the checking rank with
//                      MNCL_ERR_REMOTE before it reads a byte, and the number of rounds follows
//                      from the root's counts, which every rank read.
//   allreduce_coalesced: packed into one buffer, one allreduce, unpacked.
//   barrier            one post, wait for all.
//   send/recv          a two-slot channel per ordered pair: a message of up to 2 slots is
//                      buffered (the sender returns). A larger one is offered for a single
//                      copy: the receiver reads it straight from the sender's memory
//                      (process_vm_readv, as Open MPI's CMA path) while the sender waits; if
//                      the kernel refuses (no CMA, ptrace policy, seccomp) it declines and the
//                      message streams slot by slot, as every later one to that peer. Only
//                      between ranks in one PID namespace (pid_usable_): elsewhere neither side
//                      offers or reads, and every message streams.
// Float reductions fold in rank order 0..n-1 in every algorithm, so results equal naive's.
//
// Threading (plugin ABI v2, MNCL_CAP_CONCURRENT_P2P): execute() may run on several threads at
// once, at most one collective, one SEND per peer and one RECV per peer. They share no mutable
// state but what is listed here, and no lock is held across a wait, so none holds up another:
//   collectives   posts_, known_all_, rounds_, need_, scratch_, this rank's staging halves and
//                 its RankCtl line (posts counter, call stamp): used by collectives only. A
//                 send/recv never reads posts_, never posts and never stamps a call, so a peer
//                 checking the stamp of a running collective never sees a send's.
//   SEND to p     send_lanes_[p] and channel (me, p), written by nobody else on this rank;
//   RECV from p   recv_lanes_[p] and channel (p, me). A SEND to p and a RECV from p use
//                 different channels, so an exchange in either order streams both ways at once.
//   any           the segment's abort / dead / mismatch words and aborted_ (atomics), broken_
//                 (under a mutex), spinning_ (one spinner per rank, see wait_flag), and the
//                 options fixed at creation. Each thread has its own Op; host->set_error keeps
//                 each thread's message apart.
// Waits sleep on the futex of the one flag they wait for (a peer's posts, a channel's sent or
// acked); whoever ends everyone's waits (comm_abort, a dead peer, a mismatch) wakes every flag,
// and every wait checks the abort words first, so a call whose waits never block ends too.
//
// Failure handling: every wait is bounded by the op's deadline; while sleeping, the waited-on
// peer's pid is checked (if it is in this rank's PID namespace; a peer in another one is left
// to the deadline), a dead one is recorded in the segment (every rank then fails with
// MNCL_ERR_REMOTE naming it), and comm_abort sets the segment's abort word and wakes every
// futex so every running call of every rank ends with MNCL_ERR_ABORTED. Any other failure,
// collective or send/recv, leaves the failed lane's counters out of step with the peers' (a
// half-streamed message, a partly posted collective), so this rank's communicator then refuses
// every new call, whichever lane: the core cannot tell which later call depends on the failed
// one. Calls already running on other lanes are not cut short by a local failure (they share no
// state with the failed lane, so they cannot be corrupted by it) and finish or fail on their
// own; only the segment's words (abort, dead peer, mismatch) end every running call.
//
// Mismatched calls (issue 9, without MNCL_DEBUG_CHECKS): before the first post of a call each
// rank stamps (kind, dtype, op, count, root, seq; allreduce_coalesced: a digest of nbufs and
// counts instead of the root, so a total split differently fails too) into its RankCtl line, in
// the stamp of the staging half its first round uses and under that half's reuse rule; right
// after its first wait in the call, before reading any peer's staging, a rank compares the
// stamps of the ranks it waited for with its own and fails with MNCL_ERR_REMOTE naming both
// calls, setting the segment's mismatch word so the other ranks fail at their next wait. A rank
// that waits for no one in a call (bcast/scatter root, reduce/gather non-root) reads nothing of
// the others, so its result cannot be wrong. Send/recv compare count and dtype in the slot
// header; a receiver that finds a mismatch sets the mismatch word too, so every rank's calls
// fail at their next wait.
#pragma once

#include <mncl/mncl_plugin.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/coll.h"  // the plugin kit: kit::RootedVLayout
#include "shm/segment.h"

namespace mncl::shm {

// Tunables (MNCL_SHM_*), read at init; rank 0's values are written to the segment and used by
// every rank, since all ranks must pick the same algorithm.
struct Options {
  size_t chunk = 1u << 20;   // MNCL_SHM_CHUNK: bytes per rank per round (staging half)
  size_t small = 64u << 10;  // MNCL_SHM_SMALL: single-phase allreduce/reduce up to this size
  size_t p2p_slot = 32u << 10;
  // MNCL_SHM_SINGLE_COPY: messages above two slots are read straight from the sender's memory
  // (1), or always streamed through the slots (0); "decline" (tests) offers but never accepts.
  int single_copy = 1;
  bool single_copy_declines = false;
  size_t nt_bytes = 4u << 20;  // MNCL_SHM_NT_BYTES: stream the copy-out from this size on
  int spin = -1;               // MNCL_SHM_SPIN: pause-loop iterations before yielding (-1: by load)
  int yield_us = -1;  // MNCL_SHM_YIELD_US: sched_yield() this long before sleeping (-1: by load)
};

class Comm {
 public:
  Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host, const Options &options);

  void execute(const mncl_coll_v1_t &coll);  // throws kit::Error
  void abort();                              // any thread

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct Op;
  enum class Who { kAll, kRoot, kNone };

  void create_segment(const mncl_bootstrap_v1_t &bs, const Options &options);

  // Collectives.
  void allreduce(Op &op, const void *send, void *recv, size_t count, int32_t dtype, int32_t o,
                 int root);
  void allreduce_coalesced(Op &op, const mncl_coll_v1_t &c);
  void bcast(Op &op, const mncl_coll_v1_t &c);
  void scatter(Op &op, const mncl_coll_v1_t &c);
  void gather(Op &op, const mncl_coll_v1_t &c);
  void allgather(Op &op, const mncl_coll_v1_t &c);
  void reduce_scatter(Op &op, const mncl_coll_v1_t &c);
  void alltoall(Op &op, const mncl_coll_v1_t &c);
  void allgatherv(Op &op, const mncl_coll_v1_t &c);
  void alltoallv(Op &op, const mncl_coll_v1_t &c);
  void gatherv(Op &op, const mncl_coll_v1_t &c);
  void scatterv(Op &op, const mncl_coll_v1_t &c);
  void root_own_block(Op &op, const mncl_coll_v1_t &c, const kit::RootedVLayout &v);
  size_t v_arrays(Op &op, int32_t kind);  // round 0's count arrays, in bytes
  // Who stages and whom this rank waits for in a v-collective's rounds: round 0 (the count
  // arrays) and the later ones. The default, everyone in every round, is allgatherv's and
  // alltoallv's; the rooted kinds name their root.
  struct VPlan {
    bool stages0 = true, stages = true;
    Who waits0 = Who::kAll, waits = Who::kAll;
    int root = -1;
  };
  template <typename Rounds, typename PutCounts, typename Stage, typename CheckCounts,
            typename Collect>
  void v_rounds(Op &op, size_t arrays, const VPlan &plan, const Rounds &r, PutCounts put_counts,
                Stage stage, CheckCounts check_counts, Collect collect);
  void barrier(Op &op);
  void send(Op &op, const mncl_coll_v1_t &c);
  void recv(Op &op, const mncl_coll_v1_t &c);
  struct P2p {
    int peer;
    size_t bytes, chunks;
  };
  P2p p2p_message(const Op &op, const mncl_coll_v1_t &c) const;  // checks the peer
  // One direction of the channels to one peer, used by the one SEND to (RECV from) that peer
  // running: a line of its own, since lanes to different peers run on different threads.
  struct alignas(64) PeerLane {
    // Chunks sent (received) so far. The channel's 32-bit flag holds its low bits; the count
    // itself never wraps, so "k >= 2" (a slot was used before) stays true after 2^32 chunks.
    uint64_t chunks = 0;
    uint64_t msgs = 0;            // messages, for error messages
    bool no_single_copy = false;  // SEND: the peer declined once, so stream from now on
  };
  bool offer_single_copy(Op &op, const mncl_coll_v1_t &c, int peer, size_t bytes, const char *what);
  bool read_from_peer(int peer, void *dst, uint64_t remote_addr, size_t bytes);
  std::string pid_text(int peer) const;  // "pid 12" or "pid 12 in another PID namespace"

  // One single-phase round: stage (if `stages`) into my staging half, post, wait for `waits`
  // (root = `root`), then consume(half). Returns nothing; the caller loops over rounds.
  template <typename Stage, typename Consume>
  void round(Op &op, bool stages, Who waits, int root, Stage stage, Consume consume);

  // Progress primitives.
  void post_progress();
  void wait_all(Op &op, uint32_t target);             // every peer's posts >= target
  void wait_rank(Op &op, int peer, uint32_t target);  // one peer's posts >= target
  void before_writing_half(Op &op, int half);         // staging reuse hazard
  void wait_flag(Op &op, Flag &f, uint32_t target, int peer, const char *what);
  void check_failed(Op &op);  // local abort, then the mismatch / dead-peer / abort words
  // Throws st; any status but MNCL_ERR_ABORTED also makes the communicator refuse new calls.
  [[noreturn]] void fail(Op &op, mncl_status_t st, const std::string &msg);
  std::string broken() const;  // the first failure's message, "" if none
  // Mismatched calls (issue 9): stamp this call into the stamp of staging half `half` (its
  // first round's); compare the stamps of the peers waited for, in that half, with it.
  void publish_call(const Op &op, int half);
  void check_calls(Op &op, Who waited, int root, int half);
  void check_peer_call(Op &op, int peer, int half);
  void note_failure(const std::string &msg);  // the mismatch word and its note (every rank fails)
  [[noreturn]] void fail_mismatch(Op &op, const std::string &msg);
  // A root-only argument error in a rooted call: its peers' waits fail too (MNCL_ERR_REMOTE).
  [[noreturn]] void fail_local(Op &op, const std::string &msg);
  void wake_everyone();

  const mncl_host_v1_t *host_;
  int rank_;
  int size_;
  int64_t default_timeout_ms_;
  Segment seg_;
  Header *hdr_ = nullptr;
  size_t chunk_ = 0, small_ = 0, p2p_slot_ = 0, nt_bytes_ = 0;
  bool single_copy_offers_ = false, single_copy_accepts_ = false;
  std::atomic<bool> single_copy_refused_logged_{false};
  // Per rank, fixed at creation: its pid is meaningful here (same PID namespace), so liveness
  // checks and single-copy reads may use it. Otherwise no single copy with it, either way, and
  // only the timeout notices its death.
  std::vector<char> pid_usable_;
  int spin_ = 0;
  std::chrono::nanoseconds yield_for_{0};

  // Shared by every thread (see "Threading" above).
  std::atomic<bool> aborted_{false};
  std::atomic<bool> spinning_{false};  // a thread of this rank is in wait_flag's spin loop
  mutable std::mutex broken_mutex_;
  std::string broken_;  // set by the first failure: later operations fail with it

  // The collectives' lane: touched by the one collective running, never by send/recv.
  uint32_t posts_ = 0;      // my counter (mirrors ctl(rank_).posts.value)
  uint32_t known_all_ = 0;  // every peer is known to have posted at least this often
  uint64_t rounds_ = 0;     // rounds run so far: picks the staging half
  uint32_t need_[2] = {0, 0};
  std::vector<unsigned char> scratch_;  // coalesced packing

  // The point-to-point lanes, one per peer and direction.
  std::vector<PeerLane> send_lanes_, recv_lanes_;
};

}  // namespace mncl::shm

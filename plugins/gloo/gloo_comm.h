// The gloo backend's communicator: one gloo::Context per MNCL communicator, connected through
// the bootstrap store, and every mncl_coll_v1_t kind mapped to Gloo's collectives.
//
// Mapping (buffers are handled as bytes except in reductions):
//   allreduce       gloo::allreduce (ring or bcube), or the classic AllreduceRingChunked /
//                   AllreduceHalvingDoubling; see Algo below
//   reduce          gloo::reduce (non-roots need a full-size scratch output)
//   bcast, scatter, gather, allgather, alltoall, barrier   the gloo function of that name
//   reduce_scatter  a ring over unbound buffers (Gloo has no general one): size-1 steps, each
//                   sending one block to rank+1 and folding the block from rank-1
//   send / recv     unbound buffers, slot = (per-ordered-pair message number ^ digest of
//                   count and dtype), so messages between two ranks match in issue order;
//                   zero-element ones travel too (0 bytes), each under its own number
//   allreduce_coalesced  packed into one buffer, one allreduce, unpacked
//   allgatherv      gloo::allgatherv (a ring); its blocks are packed in rank order, so blocks
//                   at other displacements go through a packed scratch buffer
//   alltoallv       a check that every send agrees with its receive (one small allreduce),
//                   then gloo::alltoallv, through packed scratch buffers where the
//                   displacements are not packed
//   gatherv / scatterv  unbound buffers between the root and each other rank only: per block
//                   its count (slot 0x43) and its elements (slot 0x44, the tag mixed with the
//                   count), posted together; the receiver checks the count (MNCL_ERR_REMOTE
//                   naming both), and a block of another count never lands (its count is
//                   in the elements' slot: two counts share one with probability 2^-32)
// Collective tags are the low 32 bits of coll->seq xor a 32-bit digest of the call (kind,
// dtype, op, count, root; allgatherv: all of recvcounts instead of the count;
// allreduce_coalesced: the total and a digest of nbufs and counts; alltoallv: no
// count, its counts differ between ranks and are checked first; gatherv / scatterv: no count,
// each block's is checked by its receiver), identical on every rank that
// makes the same call: ranks that make mismatched calls never match each other's messages and
// time out (MNCL_ERR_TIMEOUT naming the op) instead of exchanging wrong-sized or wrong-typed
// data (which Gloo's TCP transport answers with std::terminate). The classic algorithms take
// no tag, but the tagged barrier that precedes them (see Threading) stops mismatched calls
// before their data moves. p2p, the reduce_scatter ring and gatherv / scatterv use slot prefixes
// Gloo's own collectives do not (0x41, 0x40, 0x43 and 0x44).
//
// Dtypes and ops: reductions use the plugin kit (kit::reduce_into) as Gloo's reduce function,
// so every dtype and op has the semantics of mncl.h (wrapping integers, NaN-propagating
// min/max). float16/bfloat16 are widened to float32 for the transfer and rounded once at the
// end, as the naive reference does (2x the bytes on the wire, but no error growth with the
// number of ranks). AVG is a SUM followed by one division by the size.
//
// Threading (plugin ABI v2, MNCL_CAP_CONCURRENT_P2P): execute() runs on several threads at once,
// at most one collective, one SEND per peer and one RECV per peer at a time. What makes that safe:
//   - Gloo's TCP transport allows it (PyTorch's ProcessGroupGloo relies on it too: send/recv
//     posted from the caller's thread while worker threads run collectives on the same context,
//     told apart by tags): posting a send or recv only takes the pair's and the context's locks
//     briefly and never waits; each op then waits on the condition variable of its own
//     UnboundBuffer. Ops stay apart by slot: p2p 0x41, the reduce_scatter ring 0x40, and,
//     with the collective's tag, gatherv / scatterv 0x43 / 0x44 and Gloo's collectives
//     0x01..0x08. A p2p message is written only once its receiver has posted the recv, so it
//     never sits in front of other traffic on the connection.
//   - Gloo's classic algorithms (ring_chunked, halving_doubling) send their first chunks eagerly
//     into pinned buffers; a peer that has not entered the collective yet stops reading that
//     connection until it does, and a p2p message queued behind those chunks waits with it
//     (rank 0: recv, then allreduce; rank 1: isend, then allreduce would hang). A tagged
//     barrier before them makes sure every rank has entered the collective first.
//   - Per-communicator state touched by several threads: sent_[p] only by the SEND lane of
//     peer p, received_[p] only by the RECV lane of p (the core runs each lane's calls one
//     after the other, so no lock); failure state, the running ops and the watchdog's list
//     under mutex_; aborted_ and in_flight_ are atomics. The Gloo context's plain counter
//     nextSlot() is only used by the classic algorithms, i.e. by the collective lane.
//
// Timeouts: a Gloo UnboundBuffer wait that times out closes every pair of the context (Gloo's
// "Application timeout caused pair closure"), so one late recv would make a concurrent
// allreduce fail with what looks like its own timeout. With TCP the plugin therefore enforces
// every op's deadline itself: a watchdog thread marks the op that ran out of time, records it
// as the communicator's failure, and only then poisons the context and knocks every live
// buffer's wait (as abort does). The op that timed out reports MNCL_ERR_TIMEOUT naming itself;
// every concurrent op reports MNCL_ERR_REMOTE "stopped because a concurrent operation on this
// communicator failed: <that failure>". Gloo's own waits get timeout + kGlooBackstop only as a
// backstop. (TCP is the only transport: this Gloo's ibverbs transport has no unbound buffers,
// on which every op here runs, so MNCL_GLOO_TRANSPORT=ibverbs is refused; see gloo_transport.h.)
//
// Errors: Gloo throws. Every gloo::IoException / timeout / enforce failure is caught here and
// rethrown as kit::Error naming the op, its seq and the peer where one is known; after any
// failure the context is poisoned (peers see their connection drop and fail fast instead of
// waiting for their timeout; Gloo's pairs are unusable after a failed op anyway) and the
// communicator refuses further work. The first failure is recorded before the poisoning, so
// every op it interrupts can tell it was not its own.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <mncl/mncl_plugin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gloo/gloo_transport.h"

namespace mncl::gloo_plugin {

enum class Algo { kAuto, kRing, kRingChunked, kHalvingDoubling, kBcube };

// Below this many bytes (and with a power-of-two size > 2) auto picks bcube, whose log2(size)
// latency steps beat the ring's 2*(size-1); above it the ring's bandwidth wins.
inline constexpr size_t kSmallAllreduceBytes = 64 * 1024;

// How much later than the op's own deadline Gloo's internal timeouts fire when the plugin's
// watchdog enforces the deadline (TCP): they only back it up, and must never win the race.
inline constexpr std::chrono::milliseconds kGlooBackstop{5000};

struct Settings {
  TransportSettings transport;
  Algo algo = Algo::kAuto;
};

// Parses MNCL_GLOO_ALGO ("auto", "ring", "ring_chunked", "halving_doubling", "bcube").
bool parse_algo(const char *text, Algo *algo);
const char *algo_name(Algo algo);

class Comm {
 public:
  // Collective: rendezvous and full-mesh connection. Throws kit::Error on failure.
  Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host, const Settings &settings);
  ~Comm();

  // Runs one collective to completion. Throws kit::Error (status + message) on failure.
  // Concurrent calls: see "Threading" above.
  void execute(const mncl_coll_v1_t &coll);
  // Any thread: wakes every running execute (which then fails with MNCL_ERR_ABORTED) and fails
  // every later one. Returns once the running calls have left Gloo, or after the op timeout.
  void abort();
  // The part of the teardown that waits for the peers (the final exchange); the destructor
  // calls it if kit::destroy_comm has not.
  void close();

 private:
  struct Op;  // one running execute(): description, tag, timeouts, deadline (gloo_comm.cpp)

  void run(Op &op, const mncl_coll_v1_t &c);
  void run_single_rank(const mncl_coll_v1_t &c);
  // After run(): the status this op ends with, given what happened to the communicator
  // meanwhile (abort, watchdog, another op's failure); records the op's own failure.
  void finish(Op &op, mncl_status_t status, const std::string &what);
  static std::string timeout_message(const Op &op);
  void unlist(Op &op);  // takes op out of running_ if it is there; mutex_ held

  void allreduce(Op &op, const void *in, void *out, size_t count, int32_t dtype, int32_t mop);
  void allreduce_plain(Op &op, const void *in, void *out, size_t count, int32_t dtype, int32_t mop);
  void allreduce_coalesced(Op &op, const mncl_coll_v1_t &c);
  void reduce(Op &op, const mncl_coll_v1_t &c);
  void bcast(Op &op, const mncl_coll_v1_t &c);
  void scatter(Op &op, const mncl_coll_v1_t &c);
  void gather(Op &op, const mncl_coll_v1_t &c);
  void allgather(Op &op, const mncl_coll_v1_t &c);
  void reduce_scatter(Op &op, const mncl_coll_v1_t &c);
  void reduce_scatter_ring(Op &op, void *acc, size_t block_count, int32_t dtype, int32_t mop);
  void alltoall(Op &op, const mncl_coll_v1_t &c);
  void allgatherv(Op &op, const mncl_coll_v1_t &c);
  void alltoallv(Op &op, const mncl_coll_v1_t &c);
  // Every rank returns, or every rank throws MNCL_ERR_REMOTE naming a disagreeing pair.
  void check_alltoallv_counts(Op &op, const mncl_coll_v1_t &c);
  // One gatherv / scatterv block on the wire: each end's count of it, both ways, then its
  // elements (gloo_comm.cpp).
  struct Block {
    int peer = -1;
    bool source = false;  // this end sends the elements
    uint64_t mine = 0;    // this end's count, sent to the other end
    uint64_t theirs = 0;  // the other end's count, received
    std::unique_ptr<gloo::transport::UnboundBuffer> out, in, data;
  };
  void post_block(Op &op, int peer, bool source, void *data, size_t count, size_t es, Block &b);
  // "" when the ends' counts agree; else the disagreement, once this end's count has left and
  // the acknowledgement went (see acknowledge_disagreement), so that the other end names it too.
  std::string settle_counts(Op &op, Block &b, bool gatherv);
  void acknowledge_disagreement(Op &op, Block &b, bool non_root);
  // Waits for the block's elements to move (a block whose counts agree).
  void move_data(Op &op, Block &b);
  void finish_root_blocks(Op &op, std::vector<Block> &blocks, bool gatherv);
  void finish_own_block(Op &op, Block &b, bool gatherv);
  void gatherv(Op &op, const mncl_coll_v1_t &c);
  void scatterv(Op &op, const mncl_coll_v1_t &c);
  void barrier(Op &op);
  void send(Op &op, const mncl_coll_v1_t &c);
  void recv(Op &op, const mncl_coll_v1_t &c);

  void quiesce();
  void wait_recv(Op &op, gloo::transport::UnboundBuffer &buf, int peer);
  void wait_send(Op &op, gloo::transport::UnboundBuffer &buf, int peer);

  // The watchdog thread (TCP only): times out the running op whose deadline passes first.
  void watch();
  // Knocks every live buffer's wait until no execute() is running (or `limit` passes).
  void knock_until_idle(std::chrono::steady_clock::time_point limit);

  const mncl_host_v1_t *host_;
  int rank_;
  int size_;
  int64_t default_timeout_ms_;
  Settings settings_;
  std::string comm_id_;
  std::shared_ptr<AbortRegistry> registry_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  // Set once connected (more than one rank): the watchdog enforces every op's deadline and
  // Gloo's own timeouts are only a backstop (see Timeouts above). Read-only afterwards.
  bool enforced_ = false;
  std::atomic<bool> aborted_{false};
  // execute() calls between their entry and their exit; raised before the abort check, so an
  // abort racing with an entry still waits for it (both are sequentially consistent).
  std::atomic<int> in_flight_{0};

  std::mutex mutex_;            // guards the members down to watchdog_
  std::condition_variable cv_;  // wakes the watchdog: an earlier deadline, or stopping
  // When the watchdog looks at running_ next (max(): only when notified).
  std::chrono::steady_clock::time_point wake_at_ = std::chrono::steady_clock::time_point::max();
  std::string broken_;         // the first failure ("" while healthy): the comm is unusable
  std::vector<Op *> running_;  // ops the watchdog times out (TCP: all running ops)
  bool stopping_ = false;      // the destructor stops the watchdog
  bool closed_ = false;        // close() ran
  std::thread watchdog_;       // started last in the constructor; TCP with size > 1 only

  // Point-to-point message numbers per peer (slots), so messages between a pair match in order.
  // Element p is only touched by the SEND (sent_) or RECV (received_) lane of peer p.
  std::vector<uint32_t> sent_;
  std::vector<uint32_t> received_;
};

}  // namespace mncl::gloo_plugin

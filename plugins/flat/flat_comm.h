// A flat communicator: one MPI communicator over all ranks, split from MPI_COMM_WORLD (or from
// its parent) with MNCL's rank as the key, so MPI rank == MNCL rank. Every collective is one
// MPI call (several only beyond MPI's int count), blocking or non-blocking, but for large
// blocking allreduces, reduces, reduce-scatters and allgathers in bounded mode, which run on
// flat's own ring (Request::Ring);
// many small allreduces (ALLREDUCE_COALESCED) are packed into one buffer and one MPI_Allreduce,
// the "flat" communicator of ChainerMN. ALLGATHERV / ALLTOALLV (plugin ABI v3) are
// MPI_Allgatherv / MPI_Alltoallv, or point-to-point messages in chunks when a count or a
// displacement does not fit MPI's int. GATHERV / SCATTERV (plugin ABI v5) are point-to-point
// messages between the root and every other rank, each checked for its count by its receiver.
//
// Limits, all MPI's:
//  - MPI has no timeout and no way to interrupt a blocking call: a blocking collective waits
//    for its peers as long as MPI does, and comm_abort only fails the calls that come after it.
//    Non-blocking operations are bounded: test() fails one with MNCL_ERR_TIMEOUT after the
//    communicator's timeout, or MNCL_ERR_ABORTED after an abort. With bounded = true (the
//    default; MNCL_FLAT_BOUNDED=0 turns it off) blocking calls run as non-blocking ones polled
//    to completion, so they are bounded too, at the price of MPI's (slower) non-blocking
//    algorithms (but for large allreduces, reduces, reduce-scatters and allgathers: flat's own
//    ring, Request::Ring) and one fingerprint exchange per collective (flat's own, over
//    point-to-point messages: Comm::step_exchanges), which completes before the data are
//    posted (posted collectives: see Comm::advance), or carries them itself (an allreduce,
//    reduce or reduce-scatter of at most 3840 bytes, a broadcast or allgather of at most 3840
//    bytes a block: Request::kFusedBytes, Comm::fuses). Point to point (send, recv, sendrecv_batch)
//    always runs that way: bounded, and each receive is size-checked before it is received.
//  - MPI cannot cancel a collective: a timed-out or aborted one keeps its buffers in use; the
//    communicator then refuses further work and should be destroyed.
#pragma once

#include <mncl/mncl_plugin.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mncl::flat {

// Options read once at init (environment), shared by every communicator.
struct Options {
  // Blocking calls polled, timeout and abort apply, and every collective carries a fingerprint
  // of the call, so mismatched calls fail instead of giving wrong results. MNCL_FLAT_BOUNDED=0
  // trades that for MPI's blocking collectives (1-3 us less per small call at 2 ranks).
  bool bounded = true;
  bool cuda = false;  // MNCL_CAP_CUDA_MEMORY advertised: buffers may be device pointers
  // Posted operations progress on a thread of flat's while the application is outside flat
  // (under MPI_THREAD_MULTIPLE; see ProgressBackstop). MNCL_FLAT_PROGRESS_THREAD=0: MPI moves
  // them on inside MPI calls only, and a bounded collective's data go out in flat calls only.
  bool progress_thread = true;
  // Bounded mode: a blocking allreduce, reduce or allgather of at least this many bytes per
  // rank (each rank's chunk: an allreduce's or reduce's bytes / the ranks, an allgather's
  // block), or a reduce-scatter of a quarter of that per block, runs on flat's own ring
  // (Request::Ring) when every rank's call would; 0: never (MNCL_FLAT_RING_MIN_BYTES).
  // kRingMinAuto (unset): on 2 ranks 2 KiB (a reduce 32 KiB; an allgather, a reduce-scatter
  // more), 128 KiB beyond (Comm::ring_min_bytes).
  static constexpr size_t kRingMinAuto = SIZE_MAX;
  size_t ring_min_bytes = kRingMinAuto;
  // Bounded mode, how each call's check element goes round the ranks (Comm::direct_exchange_,
  // MNCL_FLAT_CHECK_EXCHANGE, agreed in Comm::adopt): direct up to 8 ranks (64 where a rank has
  // no progress thread), else recursive doubling (kAuto); or one of them where the ranks agree.
  enum class Exchange { kAuto, kDirect, kDoubling };
  Exchange exchange = Exchange::kAuto;
};

// Heap bytes on a page boundary (std::free'd).
struct FreeDeleter {
  void operator()(unsigned char *p) const noexcept;
};
using PageAlignedBytes = std::unique_ptr<unsigned char[], FreeDeleter>;
PageAlignedBytes allocate_page_aligned(size_t bytes);  // throws std::bad_alloc

// One operation: its MPI requests (none once a blocking call has returned) and what remains
// to do when they complete, in order: check received sizes, divide for AVG, copy results out.
struct Request {
  struct Copy {
    void *dst;
    const void *src;
    size_t bytes;
  };
  // A receive whose size MPI does not check for us (p2p matches any shorter message).
  struct Expected {
    size_t index;  // in mpi
    int count;     // elements
    int peer;
    int32_t dtype;  // of the elements (a batch's ops each have their own)
  };
  int32_t kind = 0;
  int32_t dtype = 0;
  int32_t op = 0;
  uint64_t seq = 0;
  // Run to completion within the call that posts it (a bounded blocking call, polled by
  // execute): its point-to-point receives are probe-matched (Probe below), never plain ones.
  bool polled = false;
  std::vector<MPI_Request> mpi;           // outstanding requests (non-blocking)
  std::vector<Expected> expected;         // RECV, and the v kinds' point-to-point fallback
  std::vector<int> v_ints;                // v kinds: MPI's int counts and displacements, which a
                                          // non-blocking MPI call reads until it completes
  std::vector<unsigned char> owned;       // the packed / scratch buffer (blocking: v kinds only)
  std::vector<unsigned char> owned_send;  // alltoallv: its send blocks, packed
  void *avg_buf = nullptr;                // AVG: divide avg_count elements here by the size
  size_t avg_count = 0;
  std::vector<Copy> copy_out;  // packed / scratch result -> the caller's buffers
  std::chrono::steady_clock::time_point deadline;
  // The call's checks, in check_in / check_out:
  //  - bounded mode, every collective: the call's fingerprint (words [0, kSumsAt): the maximum
  //    of each field and of its complement; equal maxima and minima on every field mean every
  //    rank made the same call) and the counts sums below (zero but for allgatherv /
  //    alltoallv), in one element combined over the ranks by flat's own exchange (Comm::
  //    start_exchange: direct or recursive doubling over point-to-point messages, max, then
  //    sum): one
  //    exchange per call, so mismatched kinds never leave one rank with an exchange more than
  //    another;
  //  - unbounded mode, allgatherv / alltoallv only: the counts sums alone (MPI_SUM).
  // The counts sums (words [kSumsAt, kCheckWords)): each block's sender and receiver counts
  // (see pair_sums in flat_comm.cpp), the ranks refusing the call, and the ranks that will not
  // run this call on flat's ring (Comm::offers_ring): the ring only when that sum is 0.
  // kind, dtype, op, root, count, nbufs, seq, and whether the data ride in the check (fused)
  static constexpr int kFields = 8;
  static constexpr int kFusedField = 7;
  static constexpr int kSumsAt = 2 * kFields;
  static constexpr int kCheckWords = kSumsAt + 4;
  static constexpr int kRingVotes = kSumsAt + 3;
  // Bounded mode, an allreduce of at most kFusedBytes (host memory): its data travel inside the
  // check element, after the check words (Comm::fuses). Flat's operation reduces two elements'
  // data when both agree, within and with each other, on kind, dtype, op, count and fusing;
  // the result is copied out only once the whole fingerprint (seq included) passed, so data
  // reduced across mismatched calls are never seen. One exchange instead of checks then data.
  // A message carries the check words and the call's own data only: a receive takes any
  // element (kElementWords), and only data both sides agree on are ever read.
  // 3840: a message of the check words and these data is 4000 bytes, under Open MPI's
  // shared-memory eager limit (4096 bytes with its header), past which a message takes the
  // rendezvous protocol (about 5 us here against 1.2).
  static constexpr int kFusedBytes = 3840;
  static constexpr int kElementWords = kCheckWords + kFusedBytes / 8;
  bool fused = false;
  bool fingerprinted = false;
  bool counts_summed = false;
  // Not zeroed (8 KiB a call): only the words a call writes are read, copied or sent on
  // (kCheckWords, and a fused reduction's data where the element agrees on it: element_words
  // in the .cpp).
  uint64_t check_in[kElementWords], check_out[kElementWords];
  int checks = 0;        // unbounded mode: leading requests of mpi that sum the counts
  bool checked = false;  // the checks completed and the call passed
  // Bounded mode: the check element's exchange (Comm::start_exchange), which combines the
  // element into check_out. Its requests are mpi[exchange_first, + 2 steps): each step's
  // receive, then its send. exchanging: queued in Comm::exchanges_ (set and cleared under
  // Comm::deferred_mutex_, cleared with release once the fields below are final).
  std::atomic<bool> exchanging{false};
  size_t exchange_first = 0;
  int steps_entered = 0;                 // sends posted (one per step)
  int steps_finished = 0;                // steps whose messages completed and were combined
  int exchange_rc = MPI_SUCCESS;         // the MPI error that ended the exchange
  int send_words = 0;                    // the words of this rank's element that go out
  std::unique_ptr<uint64_t[]> incoming;  // one element per combining step (Comm::take_incoming)
  size_t incoming_words = 0;
  // A fused broadcast or allgather: its result is copied out of each rank's element (in
  // incoming, kept with the request), not combined into check_out.
  bool data_in_elements = false;
  bool checks_only = false;  // the data are issued once the checks pass (execute_bounded but
                             // for a fused call, and a posted collective while data_deferred)
  // Bounded mode, a posted collective: its call, kept to issue the data once its checks pass
  // (Comm::advance), with copies of its arrays (kit::keep_arrays).
  struct Deferred {
    mncl_coll_v1_t coll;
    std::vector<const void *> sendbufs;
    std::vector<void *> recvbufs;
    std::vector<size_t> counts;
  };
  std::unique_ptr<Deferred> deferred;  // guarded by Comm::deferred_mutex_
  // Set while the data wait for the checks; cleared (under Comm::deferred_mutex_, with
  // release) once they are issued or the call failed its checks: a tester that reads false
  // may use mpi and settled_* without that lock.
  std::atomic<bool> data_deferred{false};
  // Why the data were never issued (the checks failed, found by Comm::advance): test() throws it.
  mncl_status_t settled_status = MNCL_OK;
  std::string settled_message;
  // Receives posted (MPI_Imrecv, into mpi) only once their message has been matched by
  // MPI_Improbe and its size checked, since Open MPI may write a longer message past the end of
  // a receive buffer before it reports the truncation: gatherv / scatterv always, and RECV
  // (single or in a batch) whenever the call itself waits for it (blocking, or polled). A
  // message of the wrong size is received into `drained` (or into the block when shorter) and
  // reported.
  struct Probe {
    int peer;
    char *dst;      // the block (chunk) it fills
    int count;      // elements expected
    int32_t dtype;  // of the elements
    size_t op;      // SENDRECV_BATCH: the op's index in the batch (else 0)
    bool matched;
  };
  std::vector<Probe> probes;  // each peer's adjacent, in the order they are matched
  size_t unmatched = 0;       // probes not yet matched
  int tag = 0;                // gatherv / scatterv: the operation's own tag (from seq); RECV: kTag
  std::vector<std::vector<unsigned char>> drained;
  std::string mismatch;    // the first size disagreement, reported once everything completed
  size_t mismatch_op = 0;  // ... of a batch: its op (the lowest index wins)
  // Bounded mode, a large allreduce, reduce, reduce-scatter or allgather whose ranks all block
  // in it (Comm::offers_ring): flat's own ring over point-to-point messages on checks_comm_,
  // stepped by test(), in place of MPI's non-blocking collectives, whose algorithms (libnbc) are
  // slower than the blocking ones for large messages (and MPI_Reduce_scatter_block, blocking or
  // not, reduces everything at one rank before it scatters). The buffer is cut into size
  // chunks (reduce-scatter, allgather: the ranks' blocks); in size - 1 steps each rank receives
  // a chunk from its left neighbour while it sends one to its right, reducing what it receives
  // into its own chunk (reduce-scatter), until each rank holds one chunk reduced over every
  // rank: chunk rank + 1 (shift 0), or its own block (shift -1, a reduce-scatter). An allreduce
  // then passes the reduced chunks on around the ring (allgather, size - 1 more steps), as an
  // allgather passes the ranks' blocks; a reduce sends them to the root (one step). Each chunk
  // is reduced on one rank only, so every rank of an allreduce ends with the same bits.
  struct Ring {
    int32_t kind = 0;            // MNCL_COLL_*; a coalesced allreduce: MNCL_COLL_ALLREDUCE
    const char *send = nullptr;  // the input (allgather: this rank's block)
    char *recv = nullptr;        // the result (a reduce's non-root: none; reduce-scatter: a block)
    size_t count = 0;            // elements of all the chunks
    size_t esize = 0;
    int root = -1;             // a reduce's root; -1: none
    int shift = 0;             // chunk (rank + 1 + shift) is this rank's once reduced
    int reduce_steps = 0;      // size - 1, or 0 (allgather)
    int gather_steps = 0;      // size - 1 (allreduce, allgather), or 0
    int step = 0;              // of steps
    int steps = 0;             // reduce_steps + gather_steps (a reduce: + 1, to the root)
    size_t first_request = 0;  // this step's requests in mpi (receive(s), then a send)
    // In place (allgather: nothing to copy): a chunk received to reduce cannot go where the
    // input still is; it goes to scratch first.
    bool in_place = false;
    // In place: a received chunk, before it is reduced; with no result buffer for the partial
    // sums (a reduce's non-root, a reduce-scatter on 3 ranks or more), two slots, the partial
    // sums received at even and at odd steps (a reduce-scatter on 2 ranks: in place one chunk
    // for its one step, out of place none). From Comm::ring_scratch_, and back there once the
    // ring is done; an orphaned request keeps it.
    // Page-aligned, and a chunk lies in its slot at the address of the same chunk of the input
    // (send) modulo kScratchAlign, which is where the peers' copies of it most likely lie too
    // (the same program, the same allocator): MPI's single copy between processes (CMA) ran at
    // under half speed between buffers whose addresses differ modulo 64 (malloc's chunks start
    // 16 bytes past a page, posix_memalign's on it): at 2 ranks a 4 MiB reduce, or in-place
    // allreduce, took 1250-1330 us instead of 500-640.
    static constexpr size_t kScratchAlign = 64;
    PageAlignedBytes scratch;
    size_t scratch_bytes = 0;
    size_t half = 0;  // the largest chunk's bytes where there are two slots; else 0
    size_t slot = 0;  // bytes from one slot to the other's (round_up(chunk, 64) + 64)
    // Where the chunk at chunk_offset in the buffer goes in scratch: step's slot when there are
    // two (the partial sums received at step, sent at step + 1), else the one slot.
    char *partial(int step, size_t chunk_offset) const {
      const size_t phase = (reinterpret_cast<uintptr_t>(send) + chunk_offset) % kScratchAlign;
      return reinterpret_cast<char *>(scratch.get()) + static_cast<size_t>(step % 2) * slot + phase;
    }
  };
  std::unique_ptr<Ring> ring;
  // User-provided: std::make_unique<Request>() would value-initialize, zeroing the check
  // elements above.
  Request() {}
  // Posted for the application (post() not polled) and neither freed nor retired yet: counted
  // process-wide, and flat's progress thread keeps MPI progressing while any is.
  bool in_flight = false;
  ~Request();
};

// Stops flat's progress thread for good (flat_comm.cpp), before MPI's objects are freed at
// finalize; MPI_Finalize stops it too, whoever calls it.
void stop_progress_thread();

class Comm {
 public:
  // Adds a new communicator (create, split; nullptr passes through) to those whose posted
  // calls any flat call moves on (progress_all). Call with no MpiLock held.
  static Comm *enlist(Comm *comm);
  // Collective over all ranks of the job (comm_create). Throws kit::Error.
  static Comm *create(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host,
                      const Options &options);
  // Collective over every rank of this communicator (comm_split): the new communicator, or
  // nullptr for color MNCL_SPLIT_NONE (bs == nullptr). Throws kit::Error.
  Comm *split(int32_t color, const mncl_bootstrap_v1_t *bs);
  // Frees the MPI communicator (if MPI is still alive) and any finished orphaned requests.
  ~Comm();

  // Runs c to completion. Throws kit::Error.
  void execute(const mncl_coll_v1_t &c);
  // Starts c; the request is completed by test(). polled: the caller tests it to completion
  // before it returns to the application (execute in bounded mode). Throws kit::Error.
  std::unique_ptr<Request> post(const mncl_coll_v1_t &c, bool polled = false);
  // true when r has completed (results in place). Throws kit::Error on failure, timeout or
  // abort; the caller then hands r to retire().
  bool test(Request &r);
  // Takes a failed request: freed if MPI is done with it, else kept (buffers and all) until
  // MPI finishes it or the communicator goes away.
  void retire(std::unique_ptr<Request> r);

  // Any thread: later calls fail with MNCL_ERR_ABORTED; a blocking MPI call in progress is
  // not interrupted (MPI cannot), but bounded calls and test() notice it.
  void abort() { aborted_.store(true); }
  // Calls in progress (another thread may be blocked inside MPI on this communicator).
  int busy() const { return busy_.load(); }

  // Runs advance() on every flat communicator but self (nullptr: all) with queued calls whose
  // lock is free. Takes the registry; never called under MpiLock. The flat calls run it, and
  // under MPI_THREAD_MULTIPLE a thread of flat's does too while anything is queued (see
  // ProgressBackstop in flat_comm.cpp).
  static void progress_all(const Comm *self);

 private:
  Comm(MPI_Comm comm, MPI_Comm checks_comm, const mncl_bootstrap_v1_t &bs,
       const mncl_host_v1_t *host, const Options &options, bool direct_exchange);
  static Comm *adopt(MPI_Comm comm, const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host,
                     const Options &options);
  void check_usable(const mncl_coll_v1_t *c, const char *what) const;
  // Marks the communicator unusable; the first reason given is what later calls report.
  void mark_broken(const std::string &why);
  // mark_broken(message), then throws kit::Error(status, message).
  [[noreturn]] void throw_broken(mncl_status_t status, const std::string &message);
  // Bounded mode's blocking collectives: the checks, then the data (see the .cpp).
  void execute_bounded(const mncl_coll_v1_t &c);
  // test() until r completes (throws as test() does).
  void poll_until_done(Request &r);
  // Whether this rank would run c (count: an allreduce's or reduce's elements in all) on flat's
  // ring: a blocking (polled) allreduce, reduce, reduce-scatter or allgather on host memory, on 2
  // ranks or more, whose chunk per rank has at least ring_min_bytes() (a reduce-scatter's
  // block: a quarter of it) and at most INT_MAX bytes. Each rank's answer is a vote in c's
  // checks (Request::kRingVotes): the ring runs only if every rank would, so ranks blocking and
  // ranks posting the same call (or configured apart) still meet in MPI's collective.
  bool offers_ring(const mncl_coll_v1_t &c, const Request &r, size_t count) const;
  // kind's threshold: options_.ring_min_bytes, or where unset, on 2 ranks 2 KiB (each phase of
  // the ring is then one exchange of halves, Rabenseifner's algorithm, which beat MPI's
  // non-blocking collectives from there, 1.3-1.8x faster at 8-32 KiB; an allgather 4 KiB and
  // a reduce-scatter 8 KiB, a quarter of which is its block: past what the check exchange
  // carries), and 32 KiB for a reduce (MPI_Ireduce was faster below, 2-3x slower above); 128
  // KiB beyond 2 ranks (2 (size - 1) latency-bound steps, which lost below that at 3-4 ranks
  // on 2 cores).
  size_t ring_min_bytes(int32_t kind) const;
  // The bytes of a ring's largest chunk (count elements of esize bytes cut into size_ chunks).
  size_t ring_chunk_bytes(size_t count, size_t esize) const;
  // Whether every rank voted for the ring in r's checks (which have passed).
  static bool ring_agreed(const Request &r);
  // Trace log: this rank offered the ring for r and another declined it.
  void note_ring_declined(const Request &r) const;
  // Starts r's ring over count elements in all (a reduce-scatter's or allgather's: size blocks)
  // from send into recv, both as the collective r.kind takes them (root: a reduce's, whose other
  // ranks pass recv == nullptr; else -1). Under the MPI lock.
  void start_ring(Request &r, const char *send, char *recv, size_t count, int root);
  // Posts the receive and send of the ring's current step. Under the MPI lock.
  void post_ring_step(Request &r);
  // Once the current step's messages are done: reduces what it received (reduce-scatter) and
  // posts the next step; true when the ring is complete.
  bool advance_ring(Request &r);
  // Whether any of c's buffers is CUDA memory.
  bool has_device_buffer(const mncl_coll_v1_t &c) const;
  // Whether c's data travel inside its check element (Request::fused): an allreduce, reduce
  // or reduce-scatter of at most kFusedBytes in all, reduced as the elements combine; with the
  // direct exchange, a broadcast or an allgather of at most kFusedBytes a block, copied out of
  // each rank's element. Ranks may answer differently (options_.cuda is per process): the
  // fingerprint carries the answer, so such a call fails its checks instead of reducing with a
  // rank whose data are not there.
  bool fuses(const mncl_coll_v1_t &c) const;
  // The elements a fused c carries in its check (the fused field, less one): a
  // reduce-scatter's whole input, else its count.
  size_t fused_elements(const mncl_coll_v1_t &c) const;
  // The direct exchange's element of rank q (this rank's: check_in).
  const uint64_t *direct_element(const Request &r, int q) const;
  // With CUDA buffers: syncs the caller's stream, refuses forms flat finishes on the host.
  void prepare_device_buffers(const mncl_coll_v1_t &c) const;
  // The MPI call(s) of c: blocking ones (r.mpi stays empty) or non-blocking ones into r.mpi.
  void issue(const mncl_coll_v1_t &c, Request &r, bool nonblocking);
  // ALLREDUCE (and a coalesced one, packed): count elements from send into recv (== send in
  // place), on flat's ring when every rank voted for it, else MPI_(I)allreduce in chunks of at
  // most INT_MAX elements.
  void issue_allreduce(const mncl_coll_v1_t &c, Request &r, const char *send, char *recv,
                       size_t count, bool nonblocking);
  // ALLGATHERV / ALLTOALLV: MPI_(I)allgatherv / MPI_(I)alltoallv; blocks beyond
  // INT_MAX / size elements as point-to-point messages beside it (see v_big in the .cpp).
  void issue_v(const mncl_coll_v1_t &c, Request &r, bool nonblocking);
  // GATHERV / SCATTERV (plugin ABI v5): point-to-point messages between the root and each
  // other rank on a tag of the operation's own (from its seq), one per block even when empty,
  // whose receiver checks the size before receiving it (Request::probes): no counts check
  // across the ranks is needed.
  void issue_rooted_v(const mncl_coll_v1_t &c, Request &r, bool nonblocking);
  // SENDRECV_BATCH (plugin ABI v4): every send and receive started together, non-blocking,
  // on MNCL's point-to-point tag, as separate sends and receives would be.
  void issue_batch(const mncl_coll_v1_t &c, Request &r, bool nonblocking);
  // A receive of count elements from peer into block (op: its index in a batch): plain
  // MPI_Irecv for a request the application completes later (mncl_irecv: MPI must progress it
  // inside the application's own MPI calls too), else a probe-matched one (Request::probes).
  // Under the MPI lock.
  void receive(const mncl_coll_v1_t &c, Request &r, char *block, size_t count, int peer,
               int32_t dtype, size_t op, bool nonblocking);
  // Matches what it can of r.probes (MPI_Improbe, in order per peer) and posts their receives.
  // true when every probe is matched. Under the MPI lock.
  bool progress_probes(Request &r);
  // After issuing probe-matched receives: a non-blocking call matches what has arrived (test()
  // does the rest); a blocking one matches them all, waits for r.mpi[first_request..] and
  // throws MNCL_ERR_REMOTE on a size disagreement. Under the MPI lock.
  void complete_probed(const mncl_coll_v1_t &c, Request &r, size_t first_request, bool nonblocking);
  // Blocking calls: waits for r.mpi[first_request..] and checks the receives recorded in
  // r.expected[first_expected..] (throws MNCL_ERR_REMOTE naming the peer when a count differs),
  // then leaves r as a blocking call does (those requests and expectations removed).
  void wait_p2p(const mncl_coll_v1_t &c, Request &r, size_t first_request, size_t first_expected);
  // Why this rank cannot run c (device buffers that flat would pack on the host), or "".
  std::string v_device_refusal(const mncl_coll_v1_t &c) const;
  // After the MPI side completed: checks (statuses: requests with r.expected), AVG, copies.
  void finish(const Request &r, const MPI_Status *statuses);
  void check(int rc, const char *call, const mncl_coll_v1_t &c) const;
  // Bounded mode: starts r's check exchange (r.check_in, combined over every rank into
  // r.check_out): posts its receives (direct: its sends too) and queues it in exchanges_. Under
  // deferred_mutex_ and the MPI lock.
  void start_exchange(const mncl_coll_v1_t &c, Request &r);
  // Moves every queued exchange on as far as it can without waiting, in the order they were
  // started (direct: combines those whose messages all arrived): a doubling exchange posts its
  // step k send only once the one before it has, so that each pair of ranks' messages (one per
  // call and step) match in call order; an MPI error ends an exchange (Request::exchange_rc),
  // marks the communicator unusable and stops every later one. Under deferred_mutex_.
  void step_exchanges();
  // queued_ = deferred_ + exchanges_, and g_queued_comms; true when that made the first
  // communicator with anything queued. Under deferred_mutex_.
  bool update_queued();
  // Bounded mode: posts r's checks, fingerprint and counts sums in one exchange (collectives
  // only; refusing: this rank refuses the call, see v_device_refusal). Under the MPI lock.
  void post_checks(const mncl_coll_v1_t &c, Request &r, bool refusing);
  // Unbounded mode, allgatherv / alltoallv: posts the counts check (post_counts_check), or
  // runs it and throws on every rank when the counts disagree (MNCL_ERR_REMOTE) or a rank
  // refuses the call (MNCL_ERR_NOT_SUPPORTED) (check_counts_now, blocking calls: before any
  // data moves). Under the MPI lock.
  void post_counts_check(const mncl_coll_v1_t &c, Request &r, bool refusing);
  void check_counts_now(const mncl_coll_v1_t &c, const std::string &refusal);
  // Once the checks are done: throws MNCL_ERR_REMOTE naming the fields the ranks disagree on.
  void check_call(Request &r);
  // Bounded mode's posted collectives. Their checks start at once, on checks_comm_ (a
  // duplicate of comm_); their data wait in deferred_ and go out on comm_ in the order they
  // were posted, each once its checks have passed: MPI's collectives keep one order per
  // communicator on every rank, and nothing moves between mismatched calls. advance() steps
  // every check exchange (step_exchanges) and issues what it can without waiting: every post and
  // test on any flat communicator runs it (see progress_all), as MPI progresses every operation
  // inside any MPI call. settle() waits until deferred_ is empty, unlocking `lock` (on
  // deferred_mutex_) between polls, and returns with it held: before a blocking collective's checks
  // (throws on the head's timeout or at `deadline`) or a split. A call that fails its checks is
  // skipped by every rank alike: its request reports it (settled_*), the communicator stays usable.
  // Once the communicator is broken or aborted nothing more is issued: every queued call fails
  // (abandon_queue), since this rank's order may no longer be its peers'. advance() and
  // abandon_queue() run under deferred_mutex_.
  void advance();
  void abandon_queue();
  // c: the call that waits (or nullptr, and `what` names it), for messages.
  void settle(std::unique_lock<std::mutex> &lock, std::chrono::steady_clock::time_point deadline,
              const mncl_coll_v1_t *c, const char *what);

  MPI_Comm comm_;
  MPI_Comm checks_comm_;  // the calls' checks (fingerprint, counts), apart from the data
  int rank_, size_;
  int tag_ub_ = 32767;  // MPI_TAG_UB of comm_ (gatherv / scatterv tags: 2 .. tag_ub_)
  const mncl_host_v1_t *host_;
  Options options_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};  // an operation timed out or was abandoned
  // Why broken_ was first set, for every later call's error (set once, under broken_mutex_).
  mutable std::mutex broken_mutex_;
  std::string broken_why_;
  std::atomic<int> busy_{0};
  std::vector<unsigned char> pack_;  // blocking coalesced / scratch buffer, reused
  std::mutex orphans_mutex_;         // retire() may run on several threads
  std::mutex deferred_mutex_;       // deferred_, and each queued Request's deferral; before MpiLock
  std::deque<Request *> deferred_;  // posted collectives whose data are not issued yet
  // Check exchanges in flight, in the order they started (under deferred_mutex_).
  std::deque<Request *> exchanges_;
  // The check exchange: every rank's element to every other at once, combined in rank order
  // (direct, which MPI completes unaided), or recursive doubling in exchange_plan_'s steps, the
  // same for every call (see the .cpp), which flat's calls and progress thread step. Agreed in
  // adopt().
  bool direct_exchange_;
  bool exchange_failed_ = false;  // an MPI error ended one: no later one sends any more
  struct ExchangeStep {
    int send_to = -1;      // the peer this step sends to, or -1
    int recv_from = -1;    // the peer it receives from, or -1
    bool combine = false;  // the element received is combined in (else it is the result)
  };
  std::vector<ExchangeStep> exchange_plan_;
  // deferred_ + exchanges_, for test() to skip the lock when 0
  std::atomic<size_t> queued_{0};
  std::vector<std::unique_ptr<Request>> orphans_;  // abandoned, still owned by MPI
  // The check exchange's receive buffers of the last exchange that completed, for the next
  // (Request::incoming); guarded by deferred_mutex_.
  std::unique_ptr<uint64_t[]> spare_incoming_;
  size_t spare_incoming_words_ = 0;
  // The rings' scratch, kept between calls (Request::Ring::scratch).
  std::mutex ring_scratch_mutex_;
  PageAlignedBytes ring_scratch_;
  size_t ring_scratch_bytes_ = 0;
};

}  // namespace mncl::flat

// The naive backend's communicator: every collective implemented on the bootstrap store alone.
//
// It is the reference ("oracle") backend, so it chooses the obviously correct algorithm every
// time: contributions go into the store, every rank reads what it needs and combines it in rank
// order. Reductions are therefore bit-identical on every rank and across runs; fp16/bf16 are
// summed in float32 in rank order and rounded once.
//
// Store keys (the core prefixes them with the communicator's namespace):
//   <k>/r<src>        rank src's contribution, read by every other rank   (allreduce, allgather,
//                     allgatherv, allreduce_coalesced; bcast uses <k>/r<root>)
//   <k>/<src>><dst>   a block from src for dst only         (reduce, gather, scatter, alltoall,
//                     alltoallv, reduce_scatter, gatherv, scatterv)
//   <k>/n             counter of ranks done reading the shared keys of collective <k>; barrier
//   <k>/go            barrier release
//   p<src>><dst>/<m>  the m-th send from src to dst (m counts per ordered pair, from 0)
//   <key>#<i>         part i of a value longer than MNCL_NAIVE_PART_BYTES (256 MiB), written
//                     before <key>, which then holds a manifest (store_client.h); deleting <key>
//                     deletes its parts
// <k> numbers this communicator's collectives (SEND/RECV excluded) from 0. Collectives are issued
// in the same order on every rank (mncl.h), so <k> agrees everywhere and ops never collide. It is
// counted here rather than taken from mncl_coll_v1_t.seq because seq also advances on SEND/RECV,
// which only two ranks see; error messages still quote seq, as the core's own messages do.
//
// Cleanup (nothing may stay in the store once every reader has its data):
//   - a key with one reader (<src>><dst>, p2p) is deleted by that reader right after reading;
//   - keys with several readers: each reader increments <k>/n once it has read all it needs;
//     the one that brings it to the number of readers deletes the keys and the counter;
//   - barrier: the counter goes to 2*size (arrive, then leave); whoever reaches 2*size deletes.
// Every stored value starts with a small header describing the call that stored it (kind, dtype,
// op, root, count): a reader whose own call differs (mismatched collectives on different ranks)
// fails with MNCL_ERR_REMOTE naming both, instead of combining bytes of another meaning. The
// coalesced allreduce's header carries the total and a digest of nbufs and counts, so ranks that
// split the same total into other buffers fail too.
// The kinds with a count per rank (plugin ABI v3) store every block, empty ones too, and check
// each block's length before writing it: ranks whose counts disagree fail with MNCL_ERR_REMOTE
// rather than time out or write outside a block. Their headers say more: allgatherv's carry the
// total and a digest of recvcounts (every rank must pass the same), so every rank fails on a
// disagreement; an alltoallv message from s to d carries s's recvcounts[d], so both ends of a
// pair that disagrees fail (ranks outside it complete; naive_comm.cpp). Gatherv and scatterv
// (plugin ABI v5) send one message per non-root rank, empty ones too, whose header carries the
// block's count as its sender sees it: the rank receiving a block whose count disagrees (the
// root for gatherv, the non-root for scatterv) fails with MNCL_ERR_REMOTE naming both counts.
//
// After a failure (timeout, abort) the keys of that op may remain: the communicator is unusable
// then anyway. A send never matched by a recv also stays, as in MPI. A recv takes its message
// number m whatever happens and deletes p<src>><dst>/<m> once read, even when its check fails
// (another count or dtype): the pair stays in step, so the next recv reads message m+1 and is
// matched with the next send, as issue order says (a message that arrives after its recv timed
// out stays, unread).
//
// Threading (plugin ABI v2, MNCL_CAP_CONCURRENT_P2P): execute() may run on several threads at
// once, with at most one collective, one SEND per peer and one RECV per peer at a time. Every
// exchange goes through the store, whose table is thread-safe, and every wait is a store get
// of a key of the waiting op's own, so no call ever waits on a lock another one holds: a RECV
// waiting for its message leaves SENDs and collectives free to run. The state execute()
// changes is split by lane, so it needs no lock:
//   next_collective_  the collective lane only;
//   sent_[p]          the SEND lane of peer p only, received_[p] the RECV lane of peer p only
//                     (distinct elements of vectors sized once in the constructor; the core
//                     runs the calls of one lane one after the other);
//   aborted_          atomic: comm_abort may come from any thread.
// Everything else a call uses (its Op, the Values it reads) is its own, and errors go through
// host->set_error, which is per thread. Keys of different lanes never collide: p2p keys start
// with "p<src>>", collective keys with <k>.
#pragma once

#include <mncl/mncl_plugin.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "naive/store_client.h"

namespace mncl::naive {

// MNCL_NAIVE_PART_BYTES (see naive_comm.cpp); throws kit::Error(MNCL_ERR_INVALID_ARGUMENT)
// naming a bad value. Read at init (a bad setting refuses the plugin, which the core reports)
// and at each creation.
size_t part_bytes_from_env(const mncl_host_v1_t *host);

class Comm {
 public:
  Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host);

  // Runs one collective to completion. Throws kit::Error (status + message) on failure.
  void execute(const mncl_coll_v1_t &coll);
  // Any thread: makes later calls fail. Calls blocked in the store (any number of them, on any
  // lanes) are woken by the core, whose store callbacks return MNCL_ERR_ABORTED once the
  // communicator is aborted. They also end early with MNCL_ERR_REMOTE when another rank is gone
  // (it exited or aborted): passed on with the core's message, which names that rank.
  void abort() { aborted_.store(true); }

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct Op;  // the collective being run: name, numbers, deadline (naive_comm.cpp)

  // One implementation per collective kind.
  void allreduce(Op &op, const mncl_coll_v1_t &c);
  void allreduce_coalesced(Op &op, const mncl_coll_v1_t &c);
  void reduce(Op &op, const mncl_coll_v1_t &c);
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
  void barrier(Op &op);
  void send(Op &op, const mncl_coll_v1_t &c);
  void recv(Op &op, const mncl_coll_v1_t &c);

  // The data-movement patterns the collectives are built from.
  template <typename Use>
  void exchange_shared(Op &op, const void *mine, size_t len, Use use);
  template <typename KeyOf, typename Use>
  void read_in_rank_order(Op &op, const void *mine, size_t len, KeyOf key_of, bool delete_after,
                          Use use);
  template <typename KeyOf>
  Value fetch(Op &op, int src, KeyOf key_of);
  Value read_one(Op &op, int src, const std::string &key, size_t len);
  // Stores header + data under key.
  void put(const Op &op, const std::string &key, const void *data, size_t len);
  void done_reading(Op &op, int readers, const std::vector<std::string> &keys);
  void check_length(const Op &op, int src, const Value &value, size_t len) const;
  [[noreturn]] void throw_missing(Op &op, mncl_status_t st, std::vector<int> missing);

  const mncl_host_v1_t *host_;
  StoreClient store_;
  int rank_;
  int size_;
  int64_t default_timeout_ms_;
  std::atomic<bool> aborted_{false};
  uint64_t next_collective_ = 0;  // <k> of the next collective; the collective lane's
  // Point-to-point message numbers per peer, so messages between a pair match in issue order.
  // Element p belongs to the SEND (sent_) or RECV (received_) lane of peer p (see Threading).
  std::vector<uint64_t> sent_;
  std::vector<uint64_t> received_;
};

}  // namespace mncl::naive

// Why a communicator's waits end before their timeout: a peer that is gone.
//
// A backend that exchanges everything through the bootstrap store (naive) has no connection to
// its peers that could break, and MPI (flat) and NCCL's kernels notice no abort, nor a dead
// peer on some transports: a rank killed (kill -9, the OOM killer) or one that aborted left
// the others waiting out their whole timeout. The core therefore watches, between the slices
// of every wait a plugin makes on its store (StoreBridge), and every 200 ms while a call
// inside the backend or an operation posted to it has waited 200 ms or more (the watchdog's
// peer check, Comm::watch_peers_while_waiting, which then aborts the backend's communicator):
//   - the processes of the ranks on this host: a pid that no longer runs the process that
//     joined (compared by boot, pid namespace and start time, so a reused pid or a container
//     with its own pids is never mistaken for it) is a rank that exited;
//   - a note in the communicator's store ("failed/<job tag hash>"), which the first rank that
//     aborts the communicator (mncl_comm_abort) or finds a rank of its host gone writes, so
//     that ranks on the other hosts learn of it too. Only the first cause is written: ranks
//     that abort after failing on it (the documented way out) do not replace it. On a TCP
//     store every rank but the store's host also leaves the store that note as a last will
//     (Store::set_on_close), which the store's host writes when the rank's connection ends
//     before its destroy: a rank of any host that is killed or exits is named within a moment
//     (the store's host itself ending ends the store, which the others report as such). A
//     host that is cut off or powered off, whose connections end with no word, is not noticed
//     this way: the timeout applies;
//   - the count of collectives a rank that destroyed the communicator issued: a collective of a
//     later number waits for it in vain.
// A wait that finds either fails naming the rank, with MNCL_ERR_REMOTE (to the plugin, whose
// MNCL_ERR_ABORTED means an abort of its own); the core reports an operation ended by a rank's
// abort as MNCL_ERR_ABORTED, as shm reports a peer's abort, and asks the watch when a backend
// fails with REMOTE or TIMEOUT on its own (gloo's closed connection names no rank). The note
// carries a tag of this job (rank 0's process identity): a note left in a reused file store folder
// by an earlier job is never read as this one's.
#pragma once

#include <mncl/mncl.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/store.h"

namespace mncl::core {

// "<boot id> <pid namespace> <pid> <start time>" of process pid as seen from here; "" when
// /proc cannot tell (no such process, no /proc).
std::string process_identity(pid_t pid);

// Runs fn on a detached thread and waits for it at most `wait`: for store calls that must not
// hold their caller up when the store is what failed (a cut link makes a call last the store's
// whole timeout). fn must own what it uses. True when fn finished within `wait` (false too
// when no thread could be started: fn never ran).
bool run_briefly(std::chrono::milliseconds wait, std::function<void()> fn);

enum class Liveness {
  kRunning,  // the process that identity names still runs
  kGone,     // it exited (its pid is free, reused, or a zombie's)
  kUnknown,  // not judged from here: another boot or pid namespace, or no identity
};
Liveness liveness(const std::string &identity);

class PeerWatch {
 public:
  struct Peer {
    int rank = 0;
    std::string host;
    int pid = 0;
    std::string identity;  // process_identity() as the rank published it when joining
  };
  // comm_store: the communicator's own store view ("<id>/"); peers: every rank of the
  // communicator (only those of this host, whose identity can be judged, are watched);
  // job_tag: the same on every rank of this communicator and no other (rank 0's identity).
  // Registers this rank's note with the store (Store::set_on_close) where the store can watch
  // its clients (TCP, on a rank other than the store's host).
  PeerWatch(std::shared_ptr<bootstrap::Store> comm_store, int rank, std::vector<Peer> peers,
            std::string job_tag);
  ~PeerWatch();  // close()
  PeerWatch(const PeerWatch &) = delete;
  PeerWatch &operator=(const PeerWatch &) = delete;

  struct Finding {
    mncl_status_t status = MNCL_OK;  // MNCL_ERR_REMOTE: a rank exited; ABORTED: one aborted
    std::string reason;              // "rank 3 (pid 4711 on node1) exited"
  };
  // MNCL_OK while nothing is known to be wrong; else why the communicator cannot go on, the
  // same from then on. Finding a rank of this host gone, it leaves the note for the other
  // hosts. Never throws: a store that fails is the wait's to report.
  struct Waiting;
  // `failed`: an operation that has just failed (no longer among those waiting), judged too.
  Finding check(const Waiting *failed = nullptr);
  // Takes this rank's notes for its end back from the store (Store::cancel_on_close): destroy
  // calls it just before it sets this rank's leave key, so that the notes are gone before any
  // other rank can take this one for left (which would then end its process, and with it the
  // connection). Not bounded: as the leave key's own store call.
  void take_back_wills();
  // The communicator is destroyed: takes this rank's note back from the store (bounded) and
  // lets go of it (a later check finds nothing more, and an abort during destroy publishes
  // nothing).
  void close();
  // Whether rank is one of this host's that exited (its leave key is not consulted): for
  // destroy, which need not wait for a rank that can no longer leave.
  bool has_exited(int rank);
  // Whether every one of ranks can no longer leave: this host's that exited (has_exited), and
  // those of any host whose connection to the store ended before their destroy (their
  // gone/<rank> key, a will like the note's). One store read, not bounded: for destroy's waits,
  // which talk to the store anyway.
  bool all_gone(const std::vector<int> &ranks);
  // "gone/<rank>", in the communicator's store view: for destroy's cleanup.
  static std::string gone_key(int rank);
  // How many collectives a rank issued, published when it issues no more (its
  // mncl_comm_destroy, publish_collectives): a rank waiting in a collective of a later number
  // waits in vain, and check() says so at once (as a failure's note: a collective that cannot
  // complete fails on every rank) instead of at the timeout. Point to point is not judged: a
  // rank that destroyed the communicator is otherwise no failure, the others may go on among
  // themselves, and ending one receive would take an abort of the backend's communicator,
  // which on some backends ends the other ranks' operations too.
  struct Waiting {
    int kind = 0;       // MNCL_COLL_* (send, receive and batches are passed over)
    uint64_t seq = 0;   // a collective's number
    std::string label;  // "allreduce #7", for the message
  };
  // Where check() learns what this rank waits in; without it nothing is judged. Set before the
  // first check; close() lets go of it. Called from store waits too: it must take no lock a
  // plugin call may hold.
  void set_waiting(std::function<std::vector<Waiting>()> waiting);
  // This rank issues no more collectives: `collectives` (numbered #0 to #collectives-1) goes
  // under ended_key(rank), and the count of such ranks up by one (two store calls, not
  // bounded, as the leave key's that follows them).
  void publish_collectives(uint64_t collectives);
  // The keys publish_collectives writes, in the communicator's store view, named after this
  // communicator's tag as the note is (a store folder used again holds an earlier job's): for
  // destroy's cleanup.
  std::string ended_key(int rank) const;
  std::string ended_count_key() const;
  // What check() found so far (MNCL_OK: nothing).
  Finding found();
  // This rank cannot take part (its backend failed to create its communicator): leaves the
  // note "<this rank> <what>" for the others, who wait for it in the store or in their
  // backend (bounded, as publish_abort).
  void publish_failure(const std::string &what);
  // This rank aborted the communicator: leaves the note (bounded: on a thread of its own,
  // waited for at most a moment, since the store may be what failed).
  void publish_abort();
  // The key of the note in the communicator's store view, for destroy's cleanup.
  const std::string &note_key() const { return note_key_; }

 private:
  void publish(const Finding &finding, std::chrono::milliseconds wait);
  bool record(const Finding &finding);            // true if it became found_ (there was none)
  std::shared_ptr<bootstrap::Store> store_now();  // null once closed
  // One store read at a time, waited for at most kStoreReadWait, on a thread of its own: an
  // unreachable store (a cut link holds a call for the store's whole timeout) must hold up
  // neither the watchdog's peer check nor a failed operation's report (it once added the
  // store's 3 s to a 3 s timeout), and reads must not pile up on it (one still waiting makes
  // the next ones skip). True when `read` ran to its end in time; it may throw Error (nothing
  // read).
  bool read_store(std::function<void(bootstrap::Store &)> read);
  static constexpr std::chrono::milliseconds kStoreReadWait{500};
  Finding read_note();
  // Its leave key is set: it destroyed the communicator; nullopt when the store did not
  // answer in time (or another read still waits).
  std::optional<bool> has_left(int rank);
  // Whether a collective of this rank's waits for a rank that published fewer collectives
  // (publish_collectives). Only while something waits, and then one read of the count of such
  // ranks, and of their keys when it grew (at most kEndedReadsPerCheck at a time).
  Finding check_ended(const Waiting *failed);
  static constexpr size_t kEndedReadsPerCheck = 256;

  std::shared_ptr<bootstrap::Store> store_;  // (mutex_) null once closed
  int rank_;
  std::vector<Peer> watched_;       // the other ranks of this host that have not left (mutex_)
  std::string self_;                // "rank 2 (pid 77 on node1)"
  std::vector<std::string> names_;  // every rank, as self_
  std::function<std::vector<Waiting>()> waiting_;  // (mutex_) set_waiting, until close()
  std::map<int, uint64_t> ended_;  // (mutex_) ranks known to issue no more: their collectives
  size_t ended_cursor_ = 0;        // (mutex_) the next unknown rank to read (kEndedReadsPerCheck)
  std::string tag_hash_;           // of tag_, in the note's and the ended keys' names
  std::string tag_;
  std::string note_key_;  // "failed/<hash of the tag>"
  bool willed_ = false;   // the store holds this rank's note for its end (mutex_)
  std::mutex mutex_;
  Finding found_;  // sticky once found (under mutex_)
  std::shared_ptr<std::atomic<bool>> reading_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace mncl::core

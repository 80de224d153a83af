// A communicator: one plugin communicator plus what the core adds around it — the bootstrap
// store view, argument validation, sequence numbers, the lanes that run non-blocking calls in
// issue order (collectives on one, send/recv per peer and direction when the plugin allows it),
// abort, and the collective create / split / destroy protocols.
#pragma once

#include <mncl/mncl_plugin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.h"
#include "core/launch_env.h"
#include "core/store_bridge.h"
#include "core/watchdog.h"
#include "cuda/staging.h"
#include "loader/plugin_loader.h"

namespace mncl::core {

// A native SENDRECV_BATCH on a backend with per-peer lanes (MNCL_CAP_CONCURRENT_P2P) runs on
// the collectives' lane, yet its sends and receives must keep their places in their peers'
// lanes too (mncl_plugin_v2.h: one SEND to a peer at a time, in seq order; the same for
// RECVs). A token queued in each of those lanes stops it at the batch's place; the batch runs
// once every token has arrived, and releases them when it ends, however it ends.
struct LaneGate {
  std::mutex mutex;
  std::condition_variable cv;
  size_t tokens = 0;   // lanes held for the batch
  size_t arrived = 0;  // tokens that reached the front of their lane
  bool released = false;
};

// One non-blocking operation. Shared by the user's handle and the communicator's queue.
struct Operation {
  mncl_coll_v1_t coll{};
  // Copies of the coalesced arrays, which the caller need not keep alive.
  std::vector<const void *> sendbufs;
  std::vector<void *> recvbufs;
  std::vector<size_t> counts;
  // A batch (mncl_sendrecv_batch): the core's copy of its ops for a backend that runs the
  // SENDRECV_BATCH kind, or else one send/recv operation per op, all started before any is
  // waited for; the batch is done when every part is.
  std::vector<mncl_p2p_v4_t> p2p;
  std::vector<std::shared_ptr<Operation>> parts;
  const char *function = nullptr;  // the public function, for a batch's messages

  // Fixed when the operation is issued: it must end by then however long it waits behind
  // others (a queued one runs with what is left, and fails unstarted once it has passed).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point issued{};  // set with the deadline (launch)

  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  mncl_status_t status = MNCL_OK;
  std::string error;
  // Posted to a plugin with MNCL_CAP_NATIVE_ASYNC (set before the operation is shared). The
  // handle and the slot are guarded by the communicator's native_mutex_; the handle is null
  // once the plugin reported the operation done (or the core gave up on it).
  bool native = false;
  void *native_handle = nullptr;
  size_t native_slot = 0;  // its index in Comm::native_ops_ while posted
  // A gated batch, or (gate_token) one of its tokens in a peer's lane (see LaneGate).
  std::shared_ptr<LaneGate> gate;
  bool gate_token = false;
  // Staged on cudaStreamPerThread and queued: a marker (CUDA event) recorded on the issuing
  // thread's stream, which the lane waits for before it copies the inputs (Comm::enqueue).
  void *inputs_ready = nullptr;

  Operation() = default;
  ~Operation();  // drops inputs_ready
  Operation(const Operation &) = delete;
  Operation &operator=(const Operation &) = delete;
};

// True when `op` has ended: finished, or a batch run as parts whose parts all have (their
// result is then folded into op). Needs no communicator, so that a request can be answered
// after its communicator is gone.
bool settle(Operation &op);

class Comm {
 public:
  // Collective over all ranks of the job described by config (NULL: environment).
  static std::unique_ptr<Comm> create(const mncl_config_t *config);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank's place by host (mncl_comm_host_info), from the members' hosts, as
  // split_type(MNCL_SPLIT_TYPE_HOST) groups them.
  struct HostInfo {
    int local_rank = 0, local_size = 1, host_index = 0, num_hosts = 1;
  };
  HostInfo host_info() const;
  const std::string &backend() const { return plugin_->name(); }
  const std::string &id() const { return id_; }
  // The communicator as errors and warnings name it ("the world communicator"): its id ("w")
  // means nothing to a user; info logs, which explain the protocol, keep the id.
  std::string label() const;
  // The backend's table (capability masks), as the loader adapted it.
  const mncl_plugin_v5_t &table() const { return *table_; }
  // Throws (naming fn) when the communicator was destroyed or aborted.
  void check_usable(const char *fn) const;
  // Whether this communicator failed here: aborted (by the user or the watchdog), or a rank
  // is known to have exited or aborted it (its note is in the store).
  bool knows_of_failure();
  // An atexit handler (registered with the first communicator its TCP store serves): the
  // store's host exiting without mncl_comm_destroy waits, once, for each of its communicators
  // that knows of a failure, as destroy of an aborted one would (linger_for_note), all within
  // kExitStoreLinger, or the shortest of their timeouts.
  static void linger_at_exit();
  static constexpr std::chrono::milliseconds kExitStoreLinger{5000};

  // Blocking collective, ordered after every non-blocking one already issued.
  void run(mncl_coll_v1_t coll);
  // Non-blocking collective; the returned operation completes in issue order.
  std::shared_ptr<Operation> start(const mncl_coll_v1_t &coll);
  // Batch of sends and receives (kinds MNCL_COLL_SEND/RECV) that progress together; every op
  // is checked before any starts. `fn` names the public function. blocking: the caller waits
  // for it at once, so a backend that posts natively (and is not stream-ordered) runs it as its
  // blocking form, as run() does, which lets it check each message before receiving it (flat).
  std::shared_ptr<Operation> start_batch(const char *fn, std::vector<mncl_p2p_v4_t> ops,
                                         void *stream, bool blocking = false);
  // true when done (status/error filled). timeout_ms < 0, or too long to count on a clock
  // (kUnboundedWaitMs): until the operation ends.
  bool wait(Operation &op, int64_t timeout_ms);
  static constexpr int64_t kUnboundedWaitMs = int64_t{1} << 40;  // ~35 years
  bool test(Operation &op);

  void abort();
  bool aborted() const { return aborted_.load(); }
  // mncl_comm_split (config NULL) and mncl_comm_split_config: NULL / -1 config fields keep
  // the parent's settings; a backend named in config is agreed on by the group's ranks.
  // has_newcomm false: the caller passed no newcomm; the split fails, on every rank alike.
  std::unique_ptr<Comm> split(int color, int key, const mncl_config_t *config = nullptr,
                              const char *fn = "mncl_comm_split", bool has_newcomm = true);
  // mncl_comm_split_type: the color is this rank's host (HOST) or its position among its
  // host's ranks (CROSS_HOST), from the hosts every rank published when joining.
  std::unique_ptr<Comm> split_type(int type, int key, const mncl_config_t *config,
                                   bool has_newcomm = true);
  // Collective teardown; the object may be deleted afterwards whatever it throws, unless
  // callers_left(). api_calls: the C API's count of calls inside the handle (mncl_comm), which
  // destroy waits for as for those Inside.
  void destroy(const std::atomic<int> *api_calls = nullptr);
  // destroy() gave up waiting for calls of other threads (past the timeout + 30 s): they may
  // still use this object, which must then never be deleted, nor the backend's communicator.
  bool callers_left() const { return callers_left_; }

  // Held by a call that starts or runs an operation on the caller's thread (run, start,
  // start_batch): destroy() waits for every such call to leave before it frees the backend's
  // communicator, which a blocking call on another thread (a recv waiting for its message) may
  // still be inside. Refuses a call that starts once destroy has begun.
  class Inside {
   public:
    Inside(Comm &comm, const char *fn);
    ~Inside() { comm_.callers_inside_.fetch_sub(1); }  // the last touch of the Comm
    Inside(const Inside &) = delete;
    Inside &operator=(const Inside &) = delete;

   private:
    Comm &comm_;
  };

 private:
  struct Member {  // what every rank published when joining
    std::string host;
    int pid = 0;
    std::string identity;  // process_identity(pid) on its host
  };

  // One issue-order queue of operations and the thread that works it (started on demand,
  // gone after a while idle). Operations of one lane never run concurrently.
  struct Lane {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Operation>> queue;
    std::atomic<size_t> outstanding{0};  // issued and not yet finished
    bool running = false;  // a thread (the worker or a waiter) is running one of its operations
    bool stopping = false;
    bool worker_alive = false;
    std::thread worker;
  };

  Comm() = default;
  // The most lanes a communicator of `size` ranks may have: collectives + send/recv per peer.
  static size_t max_lanes(int size) { return 1 + 2 * static_cast<size_t>(size); }
  void validate_and_number(mncl_coll_v1_t &coll);
  // The next sequence number of point to point kind SEND or RECV with `peer`.
  uint64_t next_p2p_seq(int32_t kind, int peer);
  // Hands a validated, numbered operation to the plugin or to its lane.
  void launch(const std::shared_ptr<Operation> &op);
  // wait() for a batch run as parts: all parts, then the first failure in op order.
  bool wait_parts(Operation &batch, int64_t timeout_ms);
  // wait() for a natively posted operation.
  bool wait_native(Operation &op, int64_t timeout_ms);
  // Under native_mutex_: tests a posted operation once; true (and its result recorded) when
  // the plugin reports it done.
  bool test_native(Operation &op);
  // Under native_mutex_: records a posted operation's end and stops tracking it.
  void finish_native(Operation &op, mncl_status_t status, std::string error);
  // Under native_mutex_, after tests left posted operations running: the watchdog's rule for
  // plugins that do not end them themselves. Past an operation's deadline + the watchdog's
  // grace, aborts the plugin communicator; a grace after that, gives up on what is left.
  void police_native_ops();
  // destroy(): tests every posted operation to its end (police_native_ops bounds it).
  void retire_native_ops();
  // The lane coll runs on: its (peer, direction) lane for send/recv with concurrent p2p, else
  // the collectives' lane.
  Lane &lane_for(const mncl_coll_v1_t &coll);
  // Whether send/recv run on per-peer lanes; the lane of (SEND or RECV, peer).
  bool uses_p2p_lanes() const;
  Lane &p2p_lane(int32_t kind, int peer);
  // Queues a gate token in the lane of every (direction, peer) of batch (see LaneGate).
  void gate_peer_lanes(Operation &batch);
  // complete() of a gate token: arrives, then holds its lane until the batch releases it.
  void pass_gate(Operation &token, Lane &lane);
  // complete() of a gated batch, before it runs: waits for every token, within its deadline.
  void await_gate(const Operation &batch);
  // Lets the batch's tokens go (the batch ended, or could not be queued).
  void release_gate(LaneGate &gate);
  // inputs_ready: Operation::inputs_ready, waited for before staged inputs are copied.
  void execute_now(const mncl_coll_v1_t &coll, void *inputs_ready = nullptr);
  // Host-only backend and a CUDA buffer in coll: it goes through staging_.
  bool needs_staging(const mncl_coll_v1_t &coll);
  void enqueue(Lane &lane, std::shared_ptr<Operation> op);
  void work(Lane &lane);
  // Runs a queued operation on the calling thread and publishes its result.
  void complete(Operation &op, Lane &lane);
  // complete() for an operation taken off the lane with `running` set; clears it after.
  void complete_claimed(Operation &op, Lane &lane);
  // A waiter about to block runs its lane itself, in issue order, up to its own operation,
  // when no other thread is running one: it saves the two thread hand-offs (tens of
  // microseconds on a busy machine). False when it could not (its op is not queued, or another
  // thread is running one): the caller then waits as usual.
  bool run_queued_until(Lane &lane, const Operation &target);
  void stop_lane(Lane &lane);
  size_t outstanding_everywhere();
  void create_plugin_comm(const mncl_bootstrap_v1_t &bs, void *parent_plugin_comm, int color,
                          int key);
  mncl_bootstrap_v1_t bootstrap_for_plugin() const;
  // sizes_seen (> 0 where ranks disagreed on the size): the largest size a rank joined with;
  // rank 0 serving a TCP store then keeps it up for ranks that join within a grace.
  void leave_after_failed_join(const std::vector<int> &absent, int sizes_seen = 0);
  // by_type: the color was derived from `type` (mncl_comm_split_type), checked here.
  std::unique_ptr<Comm> split_impl(int color, int key, bool by_type, int type,
                                   const mncl_config_t *config, const char *fn, bool has_newcomm);
  // destroy() of a communicator aborted before it: tells the others this rank has left,
  // within a short bound, so that rank 0's destroy does not wait the timeout for it.
  void leave_abandoned(bool last_of_job);
  // leave_abandoned() on the store's host: waits (until give_up) until every other rank has
  // left or exited, so that they read why the communicator failed.
  void linger_for_note(std::chrono::steady_clock::time_point give_up);
  static constexpr std::chrono::milliseconds kAbortedStoreLinger{1000};
  // A child communicator of the given parent ranks (in their new order), with the parent's
  // settings and its own store views; its backend is set by the caller.
  std::unique_ptr<Comm> make_child(const std::vector<int> &parent_ranks, uint64_t split_index,
                                   int color);
  // A process's last communicator of a tcp:// job: tells the store's host it has left.
  void leave_job();
  // On a process that does not serve the tcp:// store: `store` if its server serves this
  // world (kServedWorldKey), else, once the server of the world before on this address has
  // gone, the next one's (the host keeps an old server until every process has left).
  std::shared_ptr<bootstrap::Store> reach_own_server(std::shared_ptr<bootstrap::Store> store,
                                                     const LaunchSettings &settings,
                                                     bootstrap::TcpListen listen);
  static constexpr const char *kServedWorldKey = "job/world";  // the id of the world served
  // On the store's host, its last communicator of the job: waits (bounded by give_up, cut short
  // by an abort) until every other process has left the job (Job::left_key), since their
  // communicators, of which this process may be no member, still use the store it serves.
  // false when an abort cut the wait short.
  bool wait_for_job_to_leave(std::chrono::steady_clock::time_point give_up);
  // Aborts the plugin communicator once (user abort or watchdog).
  void abort_plugin();
  // An entry of the backend threw (why: call_plugin's message): its state is unknown, so the
  // backend's communicator is aborted, the others told (as by an abort), and later calls fail
  // with MNCL_ERR_INTERNAL quoting why. Once.
  void backend_broke(const std::string &why);
  // Starts the watchdog (and its peer check) with the first operation; cheap after that.
  void ensure_watchdog();
  // The watchdog's peer check: while an operation has waited kPeerWaitBeforeCheck or more, a
  // rank that exited or aborted (PeerWatch) aborts the backend's communicator, which ends the
  // waits that nothing else would end before their timeout (MPI's, a GPU kernel's). True once
  // it has.
  bool watch_peers_while_waiting();
  // The operations this rank waits in, for the peer watch (PeerWatch::set_waiting).
  std::vector<PeerWatch::Waiting> waiting_operations();
  // Whether an operation (a call inside the backend, or one posted to it) has waited that long.
  bool waits_on_peers();
  // After the backend failed an operation with *status and *message (head, "<op> on <backend>
  // (rank r of n): ", then its words), the communicator not aborted here: what the peer watch knows
  // of a rank that exited or aborted. It becomes the report where it is the cause (the backend's
  // own abort, made by the watchdog's peer check; a store wait that quoted it), and is added
  // to a REMOTE or TIMEOUT of the backend's own (gloo's closed connection names no rank;
  // mismatched counts keep their words); with `look`, a REMOTE asks the watch now (store
  // reads, at most a second). True when it changed the report.
  // `failed`: the operation that failed, if a collective (a rank that destroyed the
  // communicator before it is its cause too, though it waits no more).
  bool explain_by_peers(mncl_status_t *status, const std::string &head, std::string *message,
                        bool look = true, const mncl_coll_v1_t *failed = nullptr);
  // Sets peer_watch_ from members_ (a communicator of several ranks).
  void watch_peers();
  // Text appended to a failed collective's message: missing ranks, last ops per rank.
  std::string diagnosis(const mncl_coll_v1_t &coll, mncl_status_t status);

  int rank_ = 0, size_ = 1;
  int local_rank_ = -1, local_size_ = -1, num_hosts_ = 1, device_ = -1;
  int64_t timeout_ms_ = 300000;
  std::string id_;  // unique in the job: "w", "w.s0c1", ...
  // The world communicator's launch settings (backend rules, memory type), which a split
  // that names a backend chooses from.
  std::shared_ptr<const LaunchSettings> launch_;
  std::vector<Member> members_;

  std::shared_ptr<bootstrap::Store> job_store_;  // the job-wide store connection
  // What the communicators of one job in this process share besides the store.
  struct Job {
    std::atomic<int> live{1};      // communicators alive on job_store_
    bool hosts_tcp_store = false;  // world rank 0 of a tcp:// store: this process serves it
    bool tcp_store = false;
    int world_rank = 0, world_size = 1;
    std::string world_id;  // the world communicator's id ("w", "w2", ...)
    // Set by each process of a tcp:// job when its last communicator is gone (or, as a last
    // will, when its process ends): the store's host serves the store until every one is.
    std::string left_key(int world_rank) const {
      return "job/" + world_id + "/left/" + std::to_string(world_rank);
    }
  };
  std::shared_ptr<Job> job_;
  std::shared_ptr<bootstrap::Store> comm_store_;  // "<id>/" view, used by the core
  std::unique_ptr<StoreBridge> plugin_store_;     // "<id>/p/" view, handed to the plugin
  std::shared_ptr<PeerWatch> peer_watch_;         // ends plugin_store_'s waits on a gone peer
  std::shared_ptr<loader::Plugin> plugin_;
  const mncl_plugin_v5_t *table_ = nullptr;
  std::unique_ptr<cuda::StagingPool> staging_;  // CUDA buffers on a host-only backend
  void *plugin_comm_ = nullptr;

  std::atomic<bool> aborted_{false};
  std::atomic<bool> destroyed_{false};
  std::atomic<int> callers_inside_{0};  // see Inside
  bool callers_left_ = false;           // destroy gave up waiting for them (callers_left())
  // Before the backend's communicator goes: until every Inside is gone (bounded).
  void wait_for_callers(const std::atomic<int> *api_calls);
  // Raised by abort() and by the watchdog: wakes the plugin's store waits (StoreBridge).
  std::atomic<bool> plugin_stop_{false};
  std::atomic<bool> plugin_aborted_{false};  // comm_abort called (once)
  // Held by abort_plugin around comm_abort and by destroy around comm_destroy (an abort then
  // skips comm_abort): no abort reaches a plugin communicator being freed.
  std::mutex plugin_gate_;
  bool debug_checks_ = false;            // MNCL_DEBUG_CHECKS=1
  std::chrono::microseconds linger_{0};  // MNCL_LANE_LINGER_US (see work())
  OpHistory history_;                    // last operations, for the watchdog and messages
  std::unique_ptr<Watchdog> watchdog_;   // started by the first operation
  mutable std::mutex watchdog_mutex_;    // also read by check_usable (broken_reason_)
  std::string watchdog_report_;          // set when the watchdog fired (under the mutex)
  std::string broken_reason_;            // set by backend_broke (under the mutex)
  OpHistory::Record watchdog_op_;        // the operation it fired for (kind, seq, peer)
  // Set once every rank has joined: from then on rank 0 keeps the store up at destroy until all
  // ranks have left (even when creation fails later); before it, nobody waits for anybody.
  bool joined_ = false;
  // A split's child whose creation failed on this rank: destroy does not wait for the others.
  bool half_made_ = false;
  uint64_t next_seq_ = 0;                                // sequence number of the next collective
  std::vector<uint64_t> next_send_seq_, next_recv_seq_;  // per peer, for send/recv
  uint64_t next_split_ = 0;                              // splits made from this communicator
  // The child a split is making (under forming_mutex_): abort() ends its backend's store
  // waits too, so that an abort of the parent ends the split.
  std::mutex forming_mutex_;
  Comm *forming_child_ = nullptr;

  // Non-blocking operations on plugins without MNCL_CAP_NATIVE_ASYNC run on lanes: the
  // collectives' lane, and with MNCL_CAP_CONCURRENT_P2P one lane per (peer, direction) for
  // send/recv, so a receive waiting for its message never holds up a send or a collective.
  Lane collectives_;
  std::mutex lanes_mutex_;                  // guards the creation of p2p lanes
  std::vector<std::unique_ptr<Lane>> p2p_;  // [2 * peer + (recv ? 1 : 0)], made on first use
  // Operations posted natively (MNCL_CAP_NATIVE_ASYNC) that the plugin has not reported done:
  // destroy ends them before the plugin communicator and their buffers go. The mutex also keeps
  // post and test calls on the plugin communicator one at a time, and away from its teardown.
  std::mutex native_mutex_;
  std::vector<std::shared_ptr<Operation>> native_ops_;
  std::string native_abort_reason_;  // why police_native_ops aborted the plugin communicator
  std::chrono::steady_clock::time_point native_aborted_at_ =
      std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point next_police_{};  // police_native_ops runs no sooner
  static constexpr std::chrono::milliseconds kPolicePeriod{20};
  std::once_flag watchdog_once_;
  std::atomic<bool> watchdog_started_{false};
  // An operation waits this long before the watchdog's peer check looks (a healthy job's
  // operations mostly end sooner, and cost no store read).
  static constexpr std::chrono::milliseconds kPeerWaitBeforeCheck{200};
  std::atomic<bool> peer_cause_waited_{false};  // explain_by_peers' one pause
};

}  // namespace mncl::core

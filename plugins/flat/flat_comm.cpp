#include "flat/flat_comm.h"

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>

#include "common/coll.h"
#include "common/dtype.h"
#include "common/host.h"
#include "common/reduce.h"
#include "flat/cuda_guard.h"
#include "flat/mpi_runtime.h"

namespace mncl::flat {

namespace kit = mncl::kit;

namespace {

using Clock = std::chrono::steady_clock;
// A descriptor without a timeout (only from a caller of the plugin itself: the core sets one).
constexpr int64_t kDefaultTimeoutMs = 300000;

// MPI counts are ints: element-wise operations are cut into chunks of at most this many.
constexpr size_t kMaxChunk = INT_MAX;
// The one tag of MNCL point-to-point messages: MPI keeps messages between a pair in order per
// (communicator, tag), which is exactly MNCL's matching rule.
constexpr int kTag = 0;

// The tag of the v kinds' point-to-point fallback: apart from MNCL's own messages (kTag).
constexpr int kVTag = 1;

// Up to this many ranks, a call's check element goes from every rank to every other at once
// (Comm::direct_exchange_): one round of messages where recursive doubling takes log2 of them
// (and a pairing step around them below a power of two), which MPI completes unaided.
constexpr int kDirectExchangeRanks = 8;
// Beyond kDirectExchangeRanks, direct still where a rank has no progress thread (MPI completes
// it unaided), up to this many ranks.
constexpr int kDirectExchangeMaxRanks = 64;

using kit::kind_name;

using kit::v_total;

using kit::is_v_kind;

// Every live communicator (Comm::progress_all). Never destroyed: a communicator an application
// destroys from a static destructor at exit still finds it.
struct Registry {
  std::mutex mutex;  // taken with no MpiLock held (progress_all takes MpiLock under it)
  std::vector<Comm *> comms;
};
Registry &registry() {
  static Registry *const r = new Registry;
  return *r;
}
// How many communicators have posted collectives queued.
std::atomic<int> g_queued_comms{0};

// How many posted operations the application holds (Request::in_flight).
std::atomic<int> g_in_flight{0};
// The latest deadline of those, in steady_clock ticks: past it, every one has timed out (or
// completed), and the progress thread rests until a new post, rather than poll for requests
// the application may never complete (dropped after a wait timed out, a standing receive).
std::atomic<Clock::rep> g_in_flight_until{0};
// Extends g_in_flight_until to deadline; whether the value it replaced has passed by now (the
// thread may be resting: judged after the swap, so that a thread that saw that value pass
// just before it is woken).
bool extend_in_flight_until(Clock::time_point deadline) {
  const Clock::rep until = deadline.time_since_epoch().count();
  Clock::rep latest = g_in_flight_until.load();
  while (latest < until && !g_in_flight_until.compare_exchange_weak(latest, until)) {
  }
  return latest < Clock::now().time_since_epoch().count();
}
// When a flat call last entered MPI on the application's behalf (a post or a test), in
// steady_clock ticks: the progress thread stays out of MPI while the application polls.
std::atomic<Clock::rep> g_last_flat_call{0};
void note_flat_call() {
  g_last_flat_call.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

// The backstop of MPI progress for posted operations. Open MPI progresses them only inside MPI
// calls, and a posted collective's data wait in flat's queue for its checks. So while any is
// in flight, a thread of flat's moves every queue on and enters MPI (an MPI_Iprobe) every
// kAwayPeriod while the application is away from flat: the operations complete while this
// process computes or waits elsewhere (in the application's own MPI calls, in another backend,
// in the core's store exchanges), and a peer waiting for them is not held up until the
// timeout. While flat calls run (a wait polling its request progresses MPI itself) it only
// looks every kPollingPeriod: each wake-up can preempt a polling rank where ranks outnumber
// cores. Only under MPI_THREAD_MULTIPLE: below it the application's MPI calls may not run
// beside ours. Stopped by whoever finalizes MPI, flat at exit or the application:
// MPI_Finalize first deletes MPI_COMM_SELF's attributes, and the one set here joins the
// thread, so it never calls MPI after that.
class ProgressBackstop {
 public:
  static ProgressBackstop &get() {
    static ProgressBackstop *const backstop = new ProgressBackstop;  // joined at finalize
    return *backstop;
  }

  // After g_queued_comms or g_in_flight went from 0 to 1, or a post extended
  // g_in_flight_until past a deadline that had passed. Starts the thread on first use.
  void wake() {
    if (mpi_thread_level() < MPI_THREAD_MULTIPLE) return;
    std::lock_guard<std::mutex> guard(mutex_);
    if (stopped_) return;
    if (!thread_.joinable()) {
      int keyval = MPI_KEYVAL_INVALID;
      if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &keyval, nullptr) !=
              MPI_SUCCESS ||
          MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr) != MPI_SUCCESS) {
        stopped_ = true;  // never stopped at finalize: better none (the flat calls progress)
        return;
      }
      try {
        thread_ = std::thread([this] { run(); });
      } catch (const std::system_error &) {
        stopped_ = true;  // no thread: the flat calls progress alone
        return;
      }
    }
    wakeup_.notify_one();
  }

 private:
  static constexpr auto kAwayPeriod = std::chrono::microseconds(100);
  static constexpr auto kPollingPeriod = std::chrono::milliseconds(1);
  // A flat call this recent: the application is polling (a wait, a test loop).
  static constexpr auto kPolling = std::chrono::microseconds(50);

  void run() {
    std::unique_lock<std::mutex> guard(mutex_);
    while (!stopped_) {
      if ((g_queued_comms.load() == 0 && g_in_flight.load() == 0) ||
          Clock::now().time_since_epoch().count() > g_in_flight_until.load()) {
        wakeup_.wait(guard);
        continue;
      }
      guard.unlock();
      const Clock::duration since_call =
          Clock::now().time_since_epoch() -
          Clock::duration(g_last_flat_call.load(std::memory_order_relaxed));
      if (since_call < kPolling) {
        std::this_thread::sleep_for(kPollingPeriod);
        guard.lock();
        continue;
      }
      try {
        Comm::progress_all(nullptr);  // advance() records its calls' failures in them
      } catch (...) {
        // Nothing to report it to; the flat calls progress the queues too.
      }
      if (g_in_flight.load() > 0) {
        // Any call into MPI progresses every operation of the process. A probe receives
        // nothing, so even a message the application sent itself on MPI_COMM_SELF stays. (Not
        // a duplicate of it: that is a communicator creation, which Open MPI orders after
        // those in progress on other threads.)
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
      }
      std::this_thread::sleep_for(kAwayPeriod);
      guard.lock();
    }
  }

  static int on_finalize(MPI_Comm, int, void *, void *) {
    get().stop();
    return MPI_SUCCESS;
  }

 public:
  // For good (MPI cannot be initialized again): before MPI's objects are freed, at finalize.
  void stop() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stopped_ = true;
    }
    wakeup_.notify_all();
    // stopped_: wake() starts none any more. The finalizing thread only, never the thread
    // itself (it makes no MPI call that could finalize).
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable wakeup_;
  bool stopped_ = false;
  std::thread thread_;
};

// Point to point: no other rank makes the same call, so no call check and no MPI collective.
bool is_p2p(int32_t kind) {
  return kind == MNCL_COLL_SEND || kind == MNCL_COLL_RECV || kind == MNCL_COLL_SENDRECV_BATCH;
}

// The counts check of allgatherv / alltoallv (kit::v_pair_sums: MPI does not compare counts; a
// shorter message would leave part of a block unwritten, a longer one fails, and an algorithm
// may then wait for ever). [2] counts the ranks that refuse the call (v_device_refusal), so
// that all of them fail alike.
void pair_sums(const mncl_coll_v1_t &c, int rank, bool refusing, uint64_t out[3]) {
  kit::v_pair_sums(c, rank, out);
  out[2] = refusing ? 1 : 0;
}

std::string counts_disagreement(int32_t kind) {
  return kind == MNCL_COLL_ALLGATHERV
             ? "recvcounts differ between the ranks (recvcounts[i] must be rank i's sendcount "
               "on every rank)"
             : "some rank's sendcounts[j] differs from rank j's recvcounts for it";
}

// "allreduce #12 (float32 x 1021, sum)" for messages.
std::string describe(const mncl_coll_v1_t &c) {
  // A batch has no sequence number of its own (each op has one per peer and direction).
  if (c.kind == MNCL_COLL_SENDRECV_BATCH) return kit::format("sendrecv_batch (%zu ops)", c.nbufs);
  std::string s =
      kit::format("%s #%llu", kind_name(c.kind), static_cast<unsigned long long>(c.seq));
  if (c.kind == MNCL_COLL_BARRIER) return s;
  if (c.kind == MNCL_COLL_ALLGATHERV && c.counts != nullptr) {
    return s + kit::format(" (%s x %zu of %zu)", kit::dtype_name(c.dtype), c.count,
                           v_total(c.counts, c.nbufs));
  }
  if (c.kind == MNCL_COLL_ALLTOALLV && c.counts != nullptr) {
    const kit::VLayout v = kit::v_layout(c);
    return s + kit::format(" (%s, %zu sent, %zu received)", kit::dtype_name(c.dtype),
                           v_total(v.sendcounts, c.nbufs), v_total(v.recvcounts, c.nbufs));
  }
  if (kit::is_rooted_v_kind(c.kind)) {
    // "gatherv #12 (int32, root 0, 85 here)"; the root adds its blocks' total.
    s += kit::format(" (%s, root %d, %zu here", kit::dtype_name(c.dtype), c.root, c.count);
    if (c.counts != nullptr) s += kit::format(", %zu in all", v_total(c.counts, c.nbufs));
    return s + ")";
  }
  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    s += kit::format(" (%zu buffers of %s", c.nbufs, kit::dtype_name(c.dtype));
  } else {
    s += kit::format(" (%s x %zu", kit::dtype_name(c.dtype), c.count);
  }
  if (kit::is_reduction(c.kind)) s += kit::format(", %s", kit::op_name(c.op));
  if (c.kind == MNCL_COLL_SEND || c.kind == MNCL_COLL_RECV) s += kit::format(", peer %d", c.root);
  return s + ")";
}

// "allreduce #12" for a request's messages; a batch has no sequence number of its own.
std::string request_name(const Request &r) {
  if (r.kind == MNCL_COLL_SENDRECV_BATCH) return kind_name(r.kind);
  return kit::format("%s #%llu", kind_name(r.kind), static_cast<unsigned long long>(r.seq));
}

// p + elems elements; MPI_IN_PLACE and NULL (count 0, or a non-root's ignored buffer) stay.
template <typename P>
P shift(P p, size_t elems, size_t esize) {
  if (p == nullptr || p == MPI_IN_PLACE) return p;
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const char, char>;
  return static_cast<P>(static_cast<Byte *>(p) + elems * esize);
}

// Calls f(first element, n) over chunks of at most kMaxChunk elements; once for count 0, so
// that every rank still takes part in the (empty) operation.
template <typename F>
void for_chunks(size_t count, F &&f) {
  size_t first = 0;
  do {
    const size_t n = std::min(count - first, kMaxChunk);
    f(first, static_cast<int>(n));
    first += n;
  } while (first < count);
}

// Allgatherv / alltoallv: blocks of more than this many elements are point-to-point messages
// (in chunks of at most kMaxChunk) beside the MPI collective, which carries them as empty
// blocks. Both ends of a block know its count, so they agree on that without asking, and the
// blocks left to the collective add up to at most INT_MAX elements: packed, they always fit
// MPI's int displacements.
size_t v_big(int size) {
  return kMaxChunk / static_cast<size_t>(size);
}

// One side (send or receive) of the v kinds' MPI collective, as MPI's int counts and
// displacements: blocks of at most `big` elements, at displacements from `base` (the lowest
// one among them), or, where those do not fit an int, packed back to back in rank order
// (`packed`: through a scratch buffer of `total` elements). Other blocks: count 0, at 0.
struct VSide {
  size_t base = 0, total = 0;
  bool packed = false;
};
VSide v_side(const size_t *counts, const size_t *displs, size_t n, size_t big, int *out_counts,
             int *out_displs) {
  VSide side;
  size_t lo = SIZE_MAX, hi = 0;
  const auto in_call = [&](size_t i) { return counts[i] != 0 && counts[i] <= big; };
  for (size_t i = 0; i < n; ++i) {
    if (!in_call(i)) continue;
    lo = std::min(lo, displs[i]);
    hi = std::max(hi, displs[i]);
    side.total += counts[i];
  }
  side.base = lo == SIZE_MAX ? 0 : lo;
  side.packed = hi - side.base > kMaxChunk;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    out_counts[i] = in_call(i) ? static_cast<int>(counts[i]) : 0;
    out_displs[i] = !in_call(i)   ? 0
                    : side.packed ? static_cast<int>(at)
                                  : static_cast<int>(displs[i] - side.base);
    if (in_call(i)) at += counts[i];
  }
  return side;
}

// A receive of ours at `index` (in Request::mpi) failed with `code`: when MPI says the message
// was longer than the receive and it is one whose count flat knows (Request::expected), what
// the peer did ("rank 2 sent more than the 20 elements expected here"), else "".
std::string longer_message(const std::vector<Request::Expected> &expected, size_t index, int code) {
  int cls = MPI_ERR_UNKNOWN;
  MPI_Error_class(code, &cls);
  if (cls != MPI_ERR_TRUNCATE) return "";
  for (const Request::Expected &e : expected) {
    if (e.index != index) continue;
    return kit::format("rank %d sent more than the %d elements expected here", e.peer, e.count);
  }
  return "";
}

// The first failure among the statuses of a call that returned MPI_ERR_IN_STATUS: its index,
// and its code in `code` (unchanged when no status carries one).
size_t first_failure(const MPI_Status *statuses, size_t n, int &code) {
  for (size_t i = 0; i < n; ++i) {
    if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
      code = statuses[i].MPI_ERROR;
      return i;
    }
  }
  return n;
}

// Counts of operations whose blocks cannot be cut (per-rank blocks of rooted / all-to-all
// kinds) must fit in an int.
int whole_count(const mncl_coll_v1_t &c) {
  if (c.count > kMaxChunk) {
    throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                     kit::format("flat %s: %zu elements per rank exceed MPI's int count limit "
                                 "(%d); split the operation",
                                 describe(c).c_str(), c.count, INT_MAX));
  }
  return static_cast<int>(c.count);
}

// Counts the calls in progress, so comm_destroy can tell that another thread is still inside
// MPI on this communicator.
class BusyScope {
 public:
  explicit BusyScope(std::atomic<int> &busy) : busy_(busy) { ++busy_; }
  ~BusyScope() { --busy_; }
  BusyScope(const BusyScope &) = delete;
  BusyScope &operator=(const BusyScope &) = delete;

 private:
  std::atomic<int> &busy_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation, split, destruction
// ---------------------------------------------------------------------------------------------

Comm::Comm(MPI_Comm comm, MPI_Comm checks_comm, const mncl_bootstrap_v1_t &bs,
           const mncl_host_v1_t *host, const Options &options, bool direct_exchange)
    : comm_(comm),
      checks_comm_(checks_comm),
      rank_(bs.rank),
      size_(bs.size),
      host_(host),
      options_(options),
      direct_exchange_(direct_exchange) {
  int *tag_ub = nullptr, found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub != nullptr && *tag_ub > tag_ub_) tag_ub_ = *tag_ub;
  if (direct_exchange_) return;
  // The check exchange: recursive doubling among the largest power of two of ranks, pof2. The
  // first 2 rem ranks (rem = size - pof2) pair up first: each even one hands its element to the
  // odd one above it, which takes part for both, and gets the result back at the end.
  int pof2 = 1;
  while (pof2 <= size_ / 2) pof2 *= 2;
  const int rem = size_ - pof2;
  if (rank_ < 2 * rem && rank_ % 2 == 0) {
    exchange_plan_.push_back({rank_ + 1, rank_ + 1, false});
    return;
  }
  if (rank_ < 2 * rem) exchange_plan_.push_back({-1, rank_ - 1, true});
  const int group_rank = rank_ < 2 * rem ? rank_ / 2 : rank_ - rem;
  for (int mask = 1; mask < pof2; mask *= 2) {
    const int partner = group_rank ^ mask;
    const int peer = partner < rem ? 2 * partner + 1 : partner + rem;
    exchange_plan_.push_back({peer, peer, true});
  }
  if (rank_ < 2 * rem) exchange_plan_.push_back({rank_ - 1, -1, false});
}

Comm *Comm::enlist(Comm *comm) {
  if (comm != nullptr) {
    std::lock_guard<std::mutex> guard(registry().mutex);
    registry().comms.push_back(comm);
  }
  return comm;
}

Comm *Comm::create(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host,
                   const Options &options) {
  // Checked before MPI_Init: a process started without a launcher would come up as a
  // singleton of size 1 and never meet its peers.
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (bs.size > 1 && !initialized && !launched_by_mpi_launcher()) {
    throw kit::Error(MNCL_ERR_PLUGIN, "flat comm_create: " + not_launched_message(bs.size));
  }
  // MPI_Init waits for every process of the job: a group of some of them (a split of a parent
  // on another backend) would wait there for ever for the others. (One rank per process, each
  // its own communicator, is allowed: every process then calls MPI_Init.)
  const int launched = launcher_world_size();
  if (!initialized && bs.size > 1 && launched > 0 && launched != bs.size) {
    throw kit::Error(MNCL_ERR_PLUGIN,
                     kit::format("flat comm_create: a communicator of %d of the MPI job's %d "
                                 "processes cannot start MPI (MPI_Init needs all of them): "
                                 "split it from a flat communicator of every process instead",
                                 bs.size, launched));
  }
  ensure_mpi(host);
  MpiLock lock;
  MPI_Comm comm = MPI_COMM_NULL;
  int rc;
  if (bs.size == 1) {
    rc = MPI_Comm_dup(MPI_COMM_SELF, &comm);  // local: no other process takes part
  } else {
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != bs.size) {
      throw kit::Error(MNCL_ERR_PLUGIN,
                       kit::format("flat comm_create: MNCL has %d ranks but MPI_COMM_WORLD has "
                                   "%d processes; flat needs one MNCL rank per MPI process (check "
                                   "MNCL_SIZE and the -np given to mpirun)",
                                   bs.size, world));
    }
    // Key = MNCL rank: MPI orders the new communicator by it, so both numberings agree.
    rc = MPI_Comm_split(MPI_COMM_WORLD, 0, bs.rank, &comm);
  }
  if (rc != MPI_SUCCESS) {
    throw kit::Error(
        mpi_error_status(rc),
        kit::format("flat comm_create: %s failed: %s",
                    bs.size == 1 ? "MPI_Comm_dup" : "MPI_Comm_split", mpi_error_text(rc).c_str()));
  }
  return adopt(comm, bs, host, options);
}

Comm *Comm::adopt(MPI_Comm comm, const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host,
                  const Options &options) {
  int rank = -1, size = -1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (rank != bs.rank || size != bs.size) {
    MPI_Comm_free(&comm);
    throw kit::Error(MNCL_ERR_INTERNAL,
                     kit::format("flat: the MPI communicator for '%s' puts this process at rank "
                                 "%d of %d, but MNCL at rank %d of %d",
                                 bs.comm_id ? bs.comm_id : "?", rank, size, bs.rank, bs.size));
  }
  // Failures become statuses with MPI's message instead of aborting the job.
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  const std::string name = std::string("mncl-flat:") + (bs.comm_id ? bs.comm_id : "?");
  MPI_Comm_set_name(comm, name.c_str());  // shows up in MPI tools and error messages
  MPI_Comm checks = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(comm, &checks);  // keeps the error handler
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    throw kit::Error(mpi_error_status(rc),
                     kit::format("flat: MPI_Comm_dup (the checks' communicator) failed: %s",
                                 mpi_error_text(rc).c_str()));
  }
  MPI_Comm_set_name(checks, (name + ":checks").c_str());
  // The check exchange's form, agreed by the ranks (every create and split): direct up to
  // kDirectExchangeRanks; beyond, recursive doubling where every rank has flat's progress
  // thread (its later steps go out only from flat's calls and that thread: a posted call's check
  // must not wait for a rank that is in the application's own MPI calls), else direct up to
  // kDirectExchangeMaxRanks (its n (n - 1) messages a call), doubling past that with a warning.
  // MNCL_FLAT_CHECK_EXCHANGE: direct if any rank asks for it; doubling if every rank does, as
  // far as the progress threads allow.
  using Exchange = Options::Exchange;
  int votes[2] = {options.exchange == Exchange::kDirect ? 0
                  : options.exchange == Exchange::kAuto ? 1
                                                        : 2,
                  options.progress_thread && mpi_thread_level() >= MPI_THREAD_MULTIPLE ? 1 : 0};
  const int agreed = MPI_Allreduce(MPI_IN_PLACE, votes, 2, MPI_INT, MPI_MIN, checks);
  if (agreed != MPI_SUCCESS) {
    MPI_Comm_free(&checks);
    MPI_Comm_free(&comm);
    throw kit::Error(mpi_error_status(agreed),
                     kit::format("flat: MPI_Allreduce (the check exchange's form) failed: %s",
                                 mpi_error_text(agreed).c_str()));
  }
  const bool threads = votes[1] == 1;
  const bool doubling =
      votes[0] > 0 && ((threads && (votes[0] == 2 || size > kDirectExchangeRanks)) ||
                       size > kDirectExchangeMaxRanks);
  if (doubling && !threads) {
    MNCL_KIT_LOG(host, MNCL_LOG_WARN,
                 "flat %s: a rank has no progress thread (MPI below MPI_THREAD_MULTIPLE, or "
                 "MNCL_FLAT_PROGRESS_THREAD=0), and %d ranks are too many to check each call "
                 "with a message to every rank: a posted call's check moves on only inside flat "
                 "calls, so a rank that waits elsewhere holds up its peers",
                 name.c_str(), size);
  } else {
    MNCL_KIT_LOG(host, MNCL_LOG_INFO, "flat %s: each call's check goes %s", name.c_str(),
                 doubling ? "by recursive doubling" : "from every rank to every other");
  }
  return new Comm(comm, checks, bs, host, options, !doubling);
}

Comm *Comm::split(int32_t color, const mncl_bootstrap_v1_t *bs) {
  BusyScope busy(busy_);
  check_usable(nullptr, "comm_split");
  if (color != MNCL_SPLIT_NONE && bs == nullptr) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     "flat comm_split: no bootstrap for color " + std::to_string(color));
  }
  {
    std::unique_lock<std::mutex> guard(deferred_mutex_);
    settle(guard, Clock::time_point::max(), nullptr, "comm_split");  // a collective on comm_ too
  }
  MpiLock lock;
  MPI_Comm comm = MPI_COMM_NULL;
  // Key = the rank the core assigned in the new communicator (it sorted by key, then old
  // rank, as MPI would), so MPI and MNCL agree by construction.
  const int rc = MPI_Comm_split(comm_, color == MNCL_SPLIT_NONE ? MPI_UNDEFINED : color,
                                bs != nullptr ? bs->rank : 0, &comm);
  if (rc != MPI_SUCCESS) {
    throw kit::Error(mpi_error_status(rc), kit::format("flat comm_split: MPI_Comm_split failed: %s",
                                                       mpi_error_text(rc).c_str()));
  }
  if (color == MNCL_SPLIT_NONE) return nullptr;
  return adopt(comm, *bs, host_, options_);
}

Comm::~Comm() {
  {
    Registry &all = registry();
    std::lock_guard<std::mutex> registered(all.mutex);
    all.comms.erase(std::remove(all.comms.begin(), all.comms.end(), this), all.comms.end());
    std::lock_guard<std::mutex> guard(deferred_mutex_);
    // Destroy ended them (the core's job); exchanges left are orphans' (freed below or leaked).
    deferred_.clear();
    for (Request *r : exchanges_) r->exchanging.store(false);
    exchanges_.clear();
    update_queued();
  }
  if (mpi_finalized()) return;  // MPI released everything already
  MpiLock lock;
  size_t leaked = 0;
  for (auto &r : orphans_) {
    int done = 0;
    MPI_Testall(static_cast<int>(r->mpi.size()), r->mpi.data(), &done, MPI_STATUSES_IGNORE);
    // MPI may still write into these buffers: leaking them is the only safe choice.
    if (!done) {
      r.release();
      ++leaked;
    }
  }
  if (leaked > 0) {
    MNCL_KIT_LOG(host_, MNCL_LOG_WARN,
                 "%zu abandoned operation(s) still in MPI at comm_destroy; their buffers "
                 "are leaked",
                 leaked);
  }
  MPI_Comm_free(&checks_comm_);
  MPI_Comm_free(&comm_);  // pending operations still complete, as MPI specifies
}

// ---------------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------------

void Comm::check_usable(const mncl_coll_v1_t *c, const char *what) const {
  if (!aborted_.load() && !broken_.load()) return;  // the hot path: no message to format
  const std::string op = c != nullptr ? describe(*c) : std::string(what);
  if (aborted_.load()) {
    throw kit::Error(MNCL_ERR_ABORTED,
                     kit::format("flat %s: the communicator was aborted", op.c_str()));
  }
  if (broken_.load()) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(broken_mutex_);
      why = broken_why_;
    }
    throw kit::Error(MNCL_ERR_REMOTE,
                     kit::format("flat %s: the communicator is unusable since an earlier "
                                 "operation failed with data it could not take back (%s); "
                                 "destroy the communicator",
                                 op.c_str(), why.empty() ? "an abort or timeout" : why.c_str()));
  }
}

void Comm::mark_broken(const std::string &why) {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (broken_why_.empty()) broken_why_ = why;
  broken_.store(true);
}

void Comm::throw_broken(mncl_status_t status, const std::string &message) {
  mark_broken(message);
  throw kit::Error(status, message);
}

void Comm::prepare_device_buffers(const mncl_coll_v1_t &c) const {
  bool device = cuda::is_device_pointer(c.sendbuf) || cuda::is_device_pointer(c.recvbuf);
  for (size_t i = 0; !device && c.kind == MNCL_COLL_ALLREDUCE_COALESCED && i < c.nbufs; ++i) {
    device = cuda::is_device_pointer(c.sendbufs[i]) || cuda::is_device_pointer(c.recvbufs[i]);
  }
  if (c.kind == MNCL_COLL_SENDRECV_BATCH) {
    const auto *ops = static_cast<const mncl_p2p_v4_t *>(c.sendbuf);
    for (size_t i = 0; !device && i < c.nbufs; ++i) device = cuda::is_device_pointer(ops[i].buf);
  }
  // Host buffers: nothing of the caller's stream is MPI's business (as for the core's own
  // host path).
  if (!device) return;
  // Forms whose last step runs on the host: AVG's division, the coalesced pack, the copy of
  // an in-place reduce_scatter result.
  const bool packs = c.kind == MNCL_COLL_ALLREDUCE_COALESCED && c.nbufs > 1;
  const bool copies =
      c.kind == MNCL_COLL_REDUCE_SCATTER &&
      static_cast<const char *>(c.sendbuf) + c.count * kit::dtype_size(c.dtype) * rank_ ==
          c.recvbuf;
  if ((kit::is_reduction(c.kind) && c.op == MNCL_AVG) || packs || copies) {
    throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                     kit::format("flat %s: %s on CUDA memory is not supported (flat would finish "
                                 "it on the host); use host buffers, or SUM and scale",
                                 describe(c).c_str(),
                                 packs    ? "a coalesced allreduce of several buffers"
                                 : copies ? "an in-place reduce_scatter"
                                          : "AVG"));
  }
  // MPI reads the buffers now: the work the caller queued on its stream before must be done.
  const int64_t timeout_ms = c.timeout_ms > 0 ? c.timeout_ms : kDefaultTimeoutMs;
  kit::PollResult waited;
  try {
    waited = cuda::wait_for_stream(c.stream, Clock::now() + std::chrono::milliseconds(timeout_ms),
                                   &aborted_);
  } catch (const kit::Error &e) {
    throw kit::Error(e.status(), kit::format("flat %s: %s", describe(c).c_str(), e.what()));
  }
  if (waited == kit::PollResult::kTimedOut) {
    throw kit::Error(MNCL_ERR_TIMEOUT,
                     kit::format("flat %s: the caller's CUDA stream did not finish the work "
                                 "queued on it before the call within the operation's timeout "
                                 "of %.1f s",
                                 describe(c).c_str(), static_cast<double>(timeout_ms) / 1000.0));
  }
  if (waited == kit::PollResult::kStopped) {
    throw kit::Error(MNCL_ERR_ABORTED, kit::format("flat %s: the communicator was aborted while "
                                                   "waiting for the caller's CUDA stream",
                                                   describe(c).c_str()));
  }
}

void Comm::check(int rc, const char *call, const mncl_coll_v1_t &c) const {
  if (rc == MPI_SUCCESS) return;
  throw kit::Error(mpi_error_status(rc),
                   kit::format("flat %s: %s failed on rank %d of %d: %s", describe(c).c_str(), call,
                               rank_, size_, mpi_error_text(rc).c_str()));
}

void Comm::execute(const mncl_coll_v1_t &c) {
  BusyScope busy(busy_);
  check_usable(&c, nullptr);
  if (options_.cuda) prepare_device_buffers(c);
  // Point to point always: its receives are then matched and size-checked before they are
  // received, and the wait stays bounded by the timeout and abort (MPI_Recv's would not be).
  if (is_p2p(c.kind)) {
    // Non-blocking underneath, polled here: the timeout and abort can then end the wait.
    std::unique_ptr<Request> r = post(c, true);
    try {
      poll_until_done(*r);
    } catch (...) {
      retire(std::move(r));
      throw;
    }
    return;
  }
  if (options_.bounded) {
    execute_bounded(c);
    return;
  }
  // On the heap: a call that fails part way (an MPI error while its point-to-point blocks are
  // in flight) leaves requests that still use its scratch, which retire() keeps until MPI is
  // done with them.
  auto r = std::make_unique<Request>();
  r->kind = c.kind;
  r->dtype = c.dtype;
  r->op = c.op;
  r->seq = c.seq;
  try {
    MpiLock lock;
    if (is_v_kind(c.kind)) check_counts_now(c, v_device_refusal(c));
    issue(c, *r, false);
  } catch (...) {
    retire(std::move(r));
    throw;
  }
  finish(*r, nullptr);
}

namespace {
// A request for c, its deadline counted from now (the call that issues it).
std::unique_ptr<Request> new_request(const mncl_coll_v1_t &c, bool polled) {
  auto r = std::make_unique<Request>();
  r->polled = polled;
  r->kind = c.kind;
  r->dtype = c.dtype;
  r->op = c.op;
  r->seq = c.seq;
  r->deadline =
      Clock::now() + std::chrono::milliseconds(c.timeout_ms > 0 ? c.timeout_ms : kDefaultTimeoutMs);
  return r;
}

// A copy of c that outlives the post() call (Request::Deferred).
std::unique_ptr<Request::Deferred> keep_call(const mncl_coll_v1_t &c) {
  auto d = std::make_unique<Request::Deferred>();
  d->coll = c;
  kit::keep_arrays(d->coll, d->sendbufs, d->recvbufs, d->counts);
  return d;
}

std::string timeout_message(const std::string &what, int rank, int size) {
  return kit::format(
      "flat %s: not complete after the communicator's timeout on rank %d of %d (a "
      "peer is missing or stuck); MPI cannot cancel it, so destroy the communicator",
      what.c_str(), rank, size);
}

std::string checks_failed_message(const std::string &what, int rank, int size, int rc) {
  return kit::format("flat %s: the exchange that checks the call failed on rank %d of %d: %s",
                     what.c_str(), rank, size, mpi_error_text(rc).c_str());
}
}  // namespace

// Spins on test(); after 50 us it yields between polls (another thread's flat calls may need
// the MPI lock), without sleeping, which would add latency.
void Comm::poll_until_done(Request &r) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(50);
  while (!test(r)) {
    if (Clock::now() > spin_until) std::this_thread::yield();
  }
}

// Bounded blocking collectives: the checks first (fingerprint, allgatherv / alltoallv counts),
// then the data, each polled so the timeout and abort end the wait. In that order nothing moves
// between mismatched calls: Open MPI 4.1's shared memory writes a longer message past the end
// of a receive buffer before it reports the truncation, and posted together the data could
// land before the check failed. A mismatch or a refusal then fails every rank alike with the
// communicator still usable. Device buffers (a CUDA-aware MPI): the data by MPI's blocking
// collectives, which take device memory (its non-blocking ones do not, in Open MPI 4.x).
void Comm::execute_bounded(const mncl_coll_v1_t &c) {
  std::unique_ptr<Request> r = new_request(c, true);
  r->fused = fuses(c);
  // A fused call's data come with the checks: test() finishes it (result copied out) once.
  r->checks_only = !r->fused;
  try {
    const std::string refusal = is_v_kind(c.kind) ? v_device_refusal(c) : std::string();
    {
      std::unique_lock<std::mutex> guard(deferred_mutex_);
      if (r->fused) {
        // No data on comm_ that posted collectives' data must precede: its checks follow
        // theirs on checks_comm_, which step_exchanges keeps in order. Their data go out as tests
        // move the queue on, this call's own included.
        advance();
        check_usable(&c, nullptr);
      } else {
        // Posted collectives' data go before this call's, on every rank.
        settle(guard, r->deadline, &c, nullptr);
      }
      MpiLock lock;
      post_checks(c, *r, !refusal.empty());
    }
    poll_until_done(*r);  // the checks alone: test() runs check_call once they complete
    if (r->fused) return;
    r->checks_only = false;
    if (!refusal.empty()) throw kit::Error(MNCL_ERR_NOT_SUPPORTED, refusal);
    if (options_.cuda && has_device_buffer(c)) {
      {
        MpiLock lock;
        issue(c, *r, false);
      }
      finish(*r, nullptr);
      return;
    }
    {
      MpiLock lock;
      issue(c, *r, true);
    }
    poll_until_done(*r);
  } catch (...) {
    retire(std::move(r));
    throw;
  }
}

bool Comm::fuses(const mncl_coll_v1_t &c) const {
  // Not where flat advertises CUDA memory: its operation reduces on the host. options_.cuda,
  // not the buffers, decides, so that ranks with device buffers and without agree; ranks
  // whose options_.cuda differ fail the call's checks (the fused field).
  const size_t esize = kit::dtype_size(c.dtype);
  if (!options_.bounded || options_.cuda || esize == 0) return false;
  const size_t most = Request::kFusedBytes / esize;  // elements in one element's data
  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
    case MNCL_COLL_REDUCE:
      return c.count <= most;
    case MNCL_COLL_REDUCE_SCATTER:  // its whole input, reduced as an allreduce's
      return c.count <= most / static_cast<size_t>(size_);
    case MNCL_COLL_BCAST:
    case MNCL_COLL_ALLGATHER:
      // Each rank's data differ: only the direct exchange hands every rank every element.
      return direct_exchange_ && c.count <= most;
    default:
      return false;
  }
}

size_t Comm::fused_elements(const mncl_coll_v1_t &c) const {
  return c.kind == MNCL_COLL_REDUCE_SCATTER ? c.count * static_cast<size_t>(size_) : c.count;
}

const uint64_t *Comm::direct_element(const Request &r, int q) const {
  if (q == rank_) return r.check_in;
  return r.incoming.get() + static_cast<size_t>(q < rank_ ? q : q - 1) * Request::kElementWords;
}

bool Comm::has_device_buffer(const mncl_coll_v1_t &c) const {
  if (cuda::is_device_pointer(c.sendbuf) || cuda::is_device_pointer(c.recvbuf)) return true;
  for (size_t i = 0; c.kind == MNCL_COLL_ALLREDUCE_COALESCED && i < c.nbufs; ++i) {
    if (cuda::is_device_pointer(c.sendbufs[i]) || cuda::is_device_pointer(c.recvbufs[i])) {
      return true;
    }
  }
  return false;
}

Request::~Request() {
  if (in_flight) g_in_flight.fetch_sub(1);
}

void stop_progress_thread() {
  ProgressBackstop::get().stop();
}

std::unique_ptr<Request> Comm::post(const mncl_coll_v1_t &c, bool polled) {
  BusyScope busy(busy_);
  check_usable(&c, nullptr);
  if (options_.cuda) prepare_device_buffers(c);
  std::unique_ptr<Request> r = new_request(c, polled);
  if (!polled && options_.progress_thread) {
    note_flat_call();
    r->in_flight = true;
    const bool resting = extend_in_flight_until(r->deadline);
    if (g_in_flight.fetch_add(1) == 0 || resting) ProgressBackstop::get().wake();
  }
  // Bounded mode: a collective's data wait for its checks (advance()), so mismatched calls
  // move no data here either. A fused call has no data apart from its checks: nothing waits.
  r->fused = fuses(c);
  const bool checked = options_.bounded && !is_p2p(c.kind);
  const bool defer = checked && !r->fused;
  try {
    // The check exchanges and the queue of data (start_exchange, advance).
    std::unique_lock<std::mutex> guard(deferred_mutex_, std::defer_lock);
    if (checked) guard.lock();
    {
      MpiLock lock;
      // A refusal is posted too, so that the other ranks learn of it and fail alike.
      const std::string refusal = is_v_kind(c.kind) ? v_device_refusal(c) : std::string();
      if (options_.bounded) {
        post_checks(c, *r, !refusal.empty());
      } else if (is_v_kind(c.kind)) {
        post_counts_check(c, *r, !refusal.empty());
      }
      if (!refusal.empty()) {
        // Unbounded, the other ranks post their data beside their checks: this communicator is
        // out of step with theirs from now on. Bounded, they skip their data.
        if (!defer) mark_broken(refusal);
        throw kit::Error(MNCL_ERR_NOT_SUPPORTED, refusal);
      }
      if (!defer && !r->fused) issue(c, *r, true);
    }
    if (defer) {
      r->checks_only = true;
      r->deferred = keep_call(c);
      r->data_deferred.store(true);
      deferred_.push_back(r.get());  // the thread was woken above for the posted request
      update_queued();
    }
    if (checked) advance();  // sends the exchange's first step
  } catch (...) {
    retire(std::move(r));  // chunks already started stay with MPI
    throw;
  }
  return r;
}

bool Comm::test(Request &r) {
  BusyScope busy(busy_);
  note_flat_call();
  const auto what = [&r] { return request_name(r); };
  // Settled while queued (never started, a mismatch): that says more than a later abort.
  if (!r.data_deferred.load(std::memory_order_acquire) && r.settled_status != MNCL_OK) {
    throw kit::Error(r.settled_status, r.settled_message);
  }
  if (aborted_.load()) {
    mark_broken(what() + " was aborted");
    throw kit::Error(MNCL_ERR_ABORTED,
                     kit::format("flat %s: the communicator was aborted while the operation was "
                                 "in flight",
                                 what().c_str()));
  }
  // Any test moves the queues on, this communicator's and the others': the application may
  // be waiting on another operation (a receive whose sender waits for this data, a blocking
  // collective on another communicator) while MPI progresses the checks.
  if (queued_.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> guard(deferred_mutex_);
    advance();
  }
  progress_all(this);
  if (r.data_deferred.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> guard(deferred_mutex_);
    if (r.data_deferred.load()) {  // its checks, or those of a call posted before it, are out
      if (Clock::now() < r.deadline) return false;
      throw_broken(MNCL_ERR_TIMEOUT, timeout_message(what(), rank_, size_));
    }
  }
  if (r.settled_status != MNCL_OK) throw kit::Error(r.settled_status, r.settled_message);
  if (r.fingerprinted && !r.checked) {
    // Its exchange is stepped by advance() above (queued_ counts it while it is queued).
    if (r.exchanging.load(std::memory_order_acquire)) {
      if (Clock::now() < r.deadline) return false;
      throw_broken(MNCL_ERR_TIMEOUT, timeout_message(what(), rank_, size_));
    }
    if (r.exchange_rc != MPI_SUCCESS) {
      // Its output was never complete: comparing it would report a mismatch that is not one.
      throw_broken(mpi_error_status(r.exchange_rc),
                   checks_failed_message(what(), rank_, size_, r.exchange_rc));
    }
    check_call(r);  // before the data are trusted, and before they hang
    if (r.checks_only) return true;
  }
  int done = 0;
  if (r.checks > 0 && !r.checked) {
    int checks_rc;
    {
      MpiLock lock;
      checks_rc = MPI_Testall(r.checks, r.mpi.data(), &done, MPI_STATUSES_IGNORE);
    }
    if (checks_rc != MPI_SUCCESS) {
      // Its output was never written: comparing it would report a mismatch that is not one.
      throw_broken(mpi_error_status(checks_rc),
                   checks_failed_message(what(), rank_, size_, checks_rc));
    }
    if (done) check_call(r);  // before the data are trusted, and before they hang
    done = 0;
    if (r.checked && r.checks_only) return true;
  }
  int rc;
  std::vector<MPI_Status> statuses;
  {
    MpiLock lock;
    // Gatherv / scatterv: receives are posted as their messages arrive. Until all are, the
    // requests are left alone: a Testall that completed them would lose their statuses.
    if (r.unmatched == 0 || progress_probes(r)) {
      statuses.resize(r.mpi.size());
      rc = MPI_Testall(static_cast<int>(r.mpi.size()), r.mpi.data(), &done, statuses.data());
    } else {
      rc = MPI_SUCCESS;
      done = 0;
    }
  }
  // The checks may have completed in this very call: they still come first, whether the data
  // completed (a short message is no error to MPI) or failed (a mismatch explains why).
  if (r.checks > 0 && !r.checked) {
    bool checks_done = rc == MPI_SUCCESS ? done != 0 : rc == MPI_ERR_IN_STATUS;
    for (int i = 0; checks_done && rc != MPI_SUCCESS && i < r.checks; ++i) {
      checks_done = statuses[static_cast<size_t>(i)].MPI_ERROR == MPI_SUCCESS;
    }
    if (checks_done) check_call(r);
  }
  if (rc != MPI_SUCCESS) {
    int code = rc;
    if (rc == MPI_ERR_IN_STATUS) {  // the first request that failed says why
      const size_t failed = first_failure(statuses.data(), statuses.size(), code);
      // A message longer than its receive (MPI_ERR_TRUNCATE): the peer's count differs.
      const std::string longer = longer_message(r.expected, failed, code);
      if (!longer.empty()) {
        throw kit::Error(MNCL_ERR_REMOTE, kit::format("flat %s: %s (do the ranks' counts agree?)",
                                                      what().c_str(), longer.c_str()));
      }
    }
    const std::string message =
        kit::format("flat %s: MPI_Testall failed on rank %d of %d: %s", what().c_str(), rank_,
                    size_, mpi_error_text(code).c_str());
    // A ring's neighbours wait for its next steps, and its other message may still be posted.
    if (r.ring != nullptr) throw_broken(mpi_error_status(code), message);
    throw kit::Error(mpi_error_status(code), message);
  }
  if (!done) {
    if (Clock::now() < r.deadline) return false;
    throw_broken(MNCL_ERR_TIMEOUT, timeout_message(what(), rank_, size_));
  }
  if (r.ring != nullptr && !advance_ring(r)) return false;  // its next step is out
  finish(r, statuses.data());
  return true;
}

// allreduce_coalesced: nbufs in the low word, kit::split_digest of nbufs and counts in the high
// one (the total alone lets ranks that split it differently, 8+12 vs 12+8, mix elements across
// buffers in the packed MPI_Allreduce). 0 for every other kind.
namespace {
uint64_t coalesced_split(const mncl_coll_v1_t &c) {
  if (c.kind != MNCL_COLL_ALLREDUCE_COALESCED) return 0;
  return static_cast<uint64_t>(kit::split_digest(c.counts, c.nbufs)) << 32 |
         static_cast<uint32_t>(c.nbufs);
}
}  // namespace

namespace {
// The fingerprint field i of a (partly) combined element, if every rank in it gave the same.
bool agreed_field(const uint64_t *e, int i, uint64_t *value) {
  *value = e[i];
  return e[i] == ~e[Request::kFields + i];
}

// Whether the fused data of elements a and b may be reduced: both agree within and with each
// other on the call, and it is a fused reduction (an allreduce, reduce or reduce-scatter:
// Comm::fuses); the dtype, op and count (the fused field less one) to reduce with.
bool fused_call(const uint64_t *a, const uint64_t *b, int32_t *dtype, int32_t *op, size_t *count) {
  uint64_t fields[5];
  const int which[5] = {0, 1, 2, 4, Request::kFusedField};  // kind, dtype, op, count, fused
  for (int k = 0; k < 5; ++k) {
    uint64_t other = 0;
    if (!agreed_field(a, which[k], &fields[k]) || !agreed_field(b, which[k], &other) ||
        other != fields[k]) {
      return false;
    }
  }
  const int32_t kind = static_cast<int32_t>(static_cast<uint32_t>(fields[0]));
  if (fields[4] == 0 || (kind != MNCL_COLL_ALLREDUCE && kind != MNCL_COLL_REDUCE &&
                         kind != MNCL_COLL_REDUCE_SCATTER)) {
    return false;
  }
  *dtype = static_cast<int32_t>(static_cast<uint32_t>(fields[1]));
  *op = static_cast<int32_t>(static_cast<uint32_t>(fields[2]));
  *count = fields[4] - 1;
  const size_t esize = kit::dtype_size(*dtype);
  return esize > 0 && *count <= Request::kFusedBytes / esize;
}

// The words of element e that hold something: its check words, and a fused reduction's data
// where e agrees within itself on it (an element combined from calls that disagree carries
// only its check words on). Copies and doubling's sends take these, so that no word this call
// never wrote moves between elements or ranks; an element that claims data received them,
// since its sender sent the same count.
int element_words(const uint64_t *e) {
  int32_t dtype = 0, op = 0;
  size_t count = 0;
  if (!fused_call(e, e, &dtype, &op, &count)) return Request::kCheckWords;
  return Request::kCheckWords + static_cast<int>((count * kit::dtype_size(dtype) + 7) / 8);
}

// One check element: a fused reduction's data reduced first (fused_call reads both sides'
// words before they are combined), then kSumsAt words combined by max and the counts sums
// added.
// Commutative, bit for bit (reduce_into is on the fused data), so that both ends of a step of
// the exchange get the same element.
void combine_checks(const uint64_t *a, uint64_t *b) {
  int32_t dtype = 0, op = 0;
  size_t count = 0;
  // An op reduce_into does not know (the core validated it) reduces nothing: the checks
  // still agree, so that would copy out this rank's own data; it cannot happen.
  if (fused_call(a, b, &dtype, &op, &count)) {
    kit::reduce_into(b + Request::kCheckWords, a + Request::kCheckWords, count, dtype, op);
  }
  for (int i = 0; i < Request::kSumsAt; ++i) b[i] = std::max(a[i], b[i]);
  for (int i = Request::kSumsAt; i < Request::kCheckWords; ++i) b[i] += a[i];
}
}  // namespace

namespace {
// The check exchange's messages, on checks_comm_'s point-to-point space (beside the ring's).
constexpr int kCheckTag = 2;
}  // namespace

void Comm::start_exchange(const mncl_coll_v1_t &c, Request &r) {
  // The element so far is this rank's own; a fused call's data are its words (a broadcast's
  // other ranks send none).
  r.send_words = Request::kCheckWords;
  if (r.fused && !(c.kind == MNCL_COLL_BCAST && c.root != rank_)) {
    r.send_words += static_cast<int>((fused_elements(c) * kit::dtype_size(c.dtype) + 7) / 8);
  }
  std::memcpy(r.check_out, r.check_in, static_cast<size_t>(r.send_words) * sizeof(uint64_t));
  if (size_ == 1) return;  // that is the result
  // Every receive now (direct: every send too): each peer's messages then match this rank's
  // calls in the order they were started (recursive doubling's sends keep that order too:
  // step_exchanges).
  const size_t steps = direct_exchange_ ? static_cast<size_t>(size_ - 1) : exchange_plan_.size();
  size_t combining = steps;
  if (!direct_exchange_) {
    combining = 0;
    for (const ExchangeStep &step : exchange_plan_) combining += step.combine ? 1 : 0;
  }
  if (combining > 0) {
    // Not zeroed: a peer's shorter element (a mismatched call) leaves stale words after it,
    // which nothing reads (element_words).
    const size_t words = combining * Request::kElementWords;
    if (spare_incoming_words_ >= words) {
      r.incoming = std::move(spare_incoming_);
      r.incoming_words = spare_incoming_words_;
      spare_incoming_words_ = 0;
    } else {
      r.incoming.reset(new uint64_t[words]);
      r.incoming_words = words;
    }
  }
  r.exchange_first = r.mpi.size();
  r.mpi.resize(r.mpi.size() + 2 * steps, MPI_REQUEST_NULL);
  uint64_t *incoming = r.incoming.get();
  for (size_t k = 0; k < steps; ++k) {
    MPI_Request *requests = &r.mpi[r.exchange_first + 2 * k];
    int rc = MPI_SUCCESS;
    if (direct_exchange_) {  // slot k: the peer k, or k + 1 from this rank on
      const int peer = static_cast<int>(k) < rank_ ? static_cast<int>(k) : static_cast<int>(k) + 1;
      rc = MPI_Irecv(incoming + k * Request::kElementWords, Request::kElementWords, MPI_UINT64_T,
                     peer, kCheckTag, checks_comm_, &requests[0]);
      if (rc == MPI_SUCCESS) {
        rc = MPI_Isend(r.check_in, r.send_words, MPI_UINT64_T, peer, kCheckTag, checks_comm_,
                       &requests[1]);
      }
    } else if (exchange_plan_[k].recv_from >= 0) {
      const ExchangeStep &step = exchange_plan_[k];
      uint64_t *target = step.combine ? incoming : r.check_out;
      if (step.combine) incoming += Request::kElementWords;
      rc = MPI_Irecv(target, Request::kElementWords, MPI_UINT64_T, step.recv_from, kCheckTag,
                     checks_comm_, &requests[0]);
    }
    // Messages already posted would meet a later call's: out of step from here on.
    if (rc != MPI_SUCCESS) {
      throw_broken(mpi_error_status(rc),
                   kit::format("flat %s: posting the call's checks failed on rank %d of %d: %s",
                               describe(c).c_str(), rank_, size_, mpi_error_text(rc).c_str()));
    }
  }
  r.exchanging.store(true);
  exchanges_.push_back(&r);
  update_queued();
}

namespace {
// MPI_Testall over n requests; its error, that of the first failed request where MPI says
// MPI_ERR_IN_STATUS.
int test_all(int n, MPI_Request *requests, int *done) {
  MPI_Status statuses[2 * 8];  // enough for the direct exchange's and a step's requests
  std::vector<MPI_Status> more;
  MPI_Status *st = statuses;
  if (n > static_cast<int>(sizeof statuses / sizeof statuses[0])) {
    more.resize(static_cast<size_t>(n));
    st = more.data();
  }
  int rc = MPI_Testall(n, requests, done, st);
  if (rc == MPI_ERR_IN_STATUS) first_failure(st, static_cast<size_t>(n), rc);
  return rc;
}
}  // namespace

void Comm::step_exchanges() {
  if (exchanges_.empty()) return;
  const int steps = direct_exchange_ ? 1 : static_cast<int>(exchange_plan_.size());
  // The steps the exchange before may have entered; none after a failed one, whose peers
  // would take a later call's messages as its.
  int bound = exchange_failed_ ? 0 : steps;
  MpiLock lock;
  for (auto it = exchanges_.begin(); it != exchanges_.end();) {
    Request &r = **it;
    if (direct_exchange_ && r.exchange_rc == MPI_SUCCESS) {
      // Everything was posted at the start: MPI completes it unaided. Combined in rank order,
      // so that every rank computes the same bits.
      int done = 0;
      r.exchange_rc = test_all(2 * (size_ - 1), &r.mpi[r.exchange_first], &done);
      if (r.exchange_rc == MPI_SUCCESS && done) {
        // A broadcast's and an allgather's data are copied out of each element.
        const uint64_t *first = direct_element(r, 0);
        std::memcpy(r.check_out, first, static_cast<size_t>(element_words(first)) * 8);
        for (int q = 1; q < size_; ++q) combine_checks(direct_element(r, q), r.check_out);
        r.steps_entered = r.steps_finished = 1;
      }
    }
    while (!direct_exchange_ && r.exchange_rc == MPI_SUCCESS && r.steps_finished < steps) {
      const size_t k = static_cast<size_t>(r.steps_finished);
      MPI_Request *requests = &r.mpi[r.exchange_first + 2 * k];
      if (r.steps_entered == r.steps_finished) {
        if (r.steps_entered >= bound) break;  // the exchange before has not sent this step yet
        const ExchangeStep &step = exchange_plan_[k];
        if (step.send_to >= 0) {
          // The result's receiver (an even rank of the pairs) sends its own element: its
          // check_out is where the result comes.
          const uint64_t *element = step.combine || step.recv_from < 0 ? r.check_out : r.check_in;
          r.exchange_rc = MPI_Isend(element, element_words(element), MPI_UINT64_T, step.send_to,
                                    kCheckTag, checks_comm_, &requests[1]);
          if (r.exchange_rc != MPI_SUCCESS) break;
        }
        ++r.steps_entered;
      }
      int done = 0;
      r.exchange_rc = test_all(2, requests, &done);
      if (r.exchange_rc != MPI_SUCCESS || !done) break;
      const ExchangeStep &step = exchange_plan_[k];
      if (step.combine) {
        size_t index = 0;  // among the combining steps
        for (size_t j = 0; j < k; ++j) index += exchange_plan_[j].combine ? 1 : 0;
        uint64_t *in = r.incoming.get() + index * Request::kElementWords;
        // The lower rank's element first on both ends (reduce_into keeps its destination's
        // zero on a MIN / MAX tie, its NaN payload), so that both compute the same bits.
        if (step.recv_from < rank_) {
          combine_checks(r.check_out, in);
          std::memcpy(r.check_out, in, static_cast<size_t>(element_words(in)) * 8);
        } else {
          combine_checks(in, r.check_out);
        }
      }
      ++r.steps_finished;
    }
    bound = exchange_failed_ ? 0 : r.steps_entered;
    if (r.exchange_rc == MPI_SUCCESS && r.steps_finished < steps) {
      ++it;
      continue;
    }
    // Over: a failed one leaves its peers waiting for messages, and the next call's would
    // match this one's receives.
    if (r.exchange_rc != MPI_SUCCESS) {
      exchange_failed_ = true;
      bound = 0;
      mark_broken(checks_failed_message(request_name(r), rank_, size_, r.exchange_rc));
    }
    it = exchanges_.erase(it);
    if (r.exchange_rc == MPI_SUCCESS && !r.data_in_elements &&
        r.incoming_words > spare_incoming_words_) {
      // Every receive completed: the next exchange takes the buffers.
      spare_incoming_ = std::move(r.incoming);
      spare_incoming_words_ = r.incoming_words;
      r.incoming_words = 0;
    }
    r.exchanging.store(false, std::memory_order_release);
  }
  update_queued();
}

bool Comm::update_queued() {
  const size_t now = deferred_.size() + exchanges_.size();
  const size_t before = queued_.load(std::memory_order_relaxed);
  queued_.store(now, std::memory_order_release);
  if (before == 0 && now > 0) return g_queued_comms.fetch_add(1) == 0;
  if (before > 0 && now == 0) g_queued_comms.fetch_sub(1);
  return false;
}

void Comm::post_checks(const mncl_coll_v1_t &c, Request &r, bool refusing) {
  // Point to point: no other rank makes the same call (each receiver checks its sizes).
  if (is_p2p(c.kind)) return;
  const bool rooted = kit::is_rooted(c.kind) || kit::is_rooted_v_kind(c.kind);
  const bool barrier = c.kind == MNCL_COLL_BARRIER;
  uint64_t count = barrier ? 0 : c.count;
  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    count = 0;
    for (size_t i = 0; i < c.nbufs; ++i) count += c.counts[i];
  }
  // Per-rank counts differ between ranks: allgatherv's total must agree, alltoallv has none;
  // the counts sums check each block's two ends.
  if (c.kind == MNCL_COLL_ALLGATHERV) count = v_total(c.counts, c.nbufs);
  // Gatherv / scatterv: each rank has its own count; the receiving end checks each block's.
  if (c.kind == MNCL_COLL_ALLTOALLV || kit::is_rooted_v_kind(c.kind)) count = 0;
  const auto field = [](int32_t v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)); };
  const uint64_t fields[Request::kFields] = {field(c.kind),
                                             field(barrier ? -1 : c.dtype),
                                             field(kit::is_reduction(c.kind) ? c.op : -1),
                                             field(rooted ? c.root : -1),
                                             count,
                                             coalesced_split(c),
                                             c.seq,
                                             r.fused ? 1 + fused_elements(c) : 0};
  for (int i = 0; i < Request::kFields; ++i) {
    r.check_in[i] = fields[i];
    r.check_in[Request::kFields + i] = ~fields[i];  // max of the complement: the minimum
  }
  uint64_t *sums = r.check_in + Request::kSumsAt;
  if (is_v_kind(c.kind)) {
    pair_sums(c, rank_, refusing, sums);
  } else {
    sums[0] = sums[1] = sums[2] = 0;
  }
  r.check_in[Request::kRingVotes] = offers_ring(c, r, count) ? 0 : 1;
  if (r.fused) {
    // This rank's data into its element (a broadcast's: the root's buffer; its other ranks
    // send none).
    const size_t esize = kit::dtype_size(c.dtype);
    const bool sends = !(c.kind == MNCL_COLL_BCAST && c.root != rank_);
    const size_t bytes = sends ? fused_elements(c) * esize : 0;
    const void *data = c.kind == MNCL_COLL_BCAST ? c.recvbuf : c.sendbuf;
    // The last word's bytes past the data go out too: defined ones.
    if (bytes % 8 != 0) r.check_in[Request::kCheckWords + bytes / 8] = 0;
    if (bytes > 0) std::memcpy(r.check_in + Request::kCheckWords, data, bytes);
    r.data_in_elements = c.kind == MNCL_COLL_BCAST || c.kind == MNCL_COLL_ALLGATHER;
  }
  start_exchange(c, r);
  if (r.fused) {
    // The result is copied out (after AVG's division) only once the call passed its checks:
    // a reduction's from check_out, a broadcast's and an allgather's from each rank's element.
    const size_t esize = kit::dtype_size(c.dtype);
    const size_t block = c.count * esize;
    char *result = reinterpret_cast<char *>(r.check_out + Request::kCheckWords);
    char *recv = static_cast<char *>(c.recvbuf);
    const auto data_of = [&](int q) { return direct_element(r, q) + Request::kCheckWords; };
    const bool averages = c.op == MNCL_AVG && kit::is_reduction(c.kind);
    switch (c.kind) {
      case MNCL_COLL_REDUCE_SCATTER:  // this rank's block of the reduced input
        result += static_cast<size_t>(rank_) * block;
        r.copy_out.push_back({recv, result, block});
        break;
      case MNCL_COLL_REDUCE:
        if (rank_ == c.root) r.copy_out.push_back({recv, result, block});
        break;
      case MNCL_COLL_BCAST:
        if (rank_ != c.root) r.copy_out.push_back({recv, data_of(c.root), block});
        break;
      case MNCL_COLL_ALLGATHER:
        for (int q = 0; q < size_; ++q) {
          r.copy_out.push_back({recv + static_cast<size_t>(q) * block, data_of(q), block});
        }
        break;
      default:
        r.copy_out.push_back({recv, result, block});
    }
    if (averages && !r.copy_out.empty()) {
      r.avg_buf = result;
      r.avg_count = c.count;
    }
  }
  r.fingerprinted = true;
  r.counts_summed = true;
}

void Comm::post_counts_check(const mncl_coll_v1_t &c, Request &r, bool refusing) {
  pair_sums(c, rank_, refusing, r.check_in + Request::kSumsAt);
  r.mpi.push_back(MPI_REQUEST_NULL);
  check(MPI_Iallreduce(r.check_in + Request::kSumsAt, r.check_out + Request::kSumsAt, 3,
                       MPI_UINT64_T, MPI_SUM, checks_comm_, &r.mpi.back()),
        "MPI_Iallreduce (counts check)", c);
  r.counts_summed = true;
  ++r.checks;
}

// One small allreduce before the data: every rank gets the same sums, so either all go on or
// all fail here, with nothing in flight (the communicator stays usable).
void Comm::check_counts_now(const mncl_coll_v1_t &c, const std::string &refusal) {
  uint64_t in[3], out[3];
  pair_sums(c, rank_, !refusal.empty(), in);
  check(MPI_Allreduce(in, out, 3, MPI_UINT64_T, MPI_SUM, checks_comm_),
        "MPI_Allreduce (counts check)", c);
  if (!refusal.empty()) throw kit::Error(MNCL_ERR_NOT_SUPPORTED, refusal);
  if (out[2] != 0) {
    throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                     kit::format("flat %s: %llu other rank(s) refused this call (see their "
                                 "errors); no data was moved",
                                 describe(c).c_str(), static_cast<unsigned long long>(out[2])));
  }
  if (out[0] == out[1]) return;
  throw kit::Error(MNCL_ERR_REMOTE,
                   kit::format("flat %s: the ranks' counts disagree: %s; no data was moved",
                               describe(c).c_str(), counts_disagreement(c.kind).c_str()));
}

void Comm::check_call(Request &r) {
  r.checked = true;
  // execute_bounded() checks before it issues the data: then nothing is in flight, every rank
  // fails alike, and the communicator stays usable.
  const bool data_in_flight = !r.checks_only && !r.fused;
  const uint64_t *sums = r.check_out + Request::kSumsAt;
  if (r.counts_summed && sums[2] != 0) {
    const std::string message =
        kit::format("flat %s: %llu other rank(s) refused this call (see their errors); %s",
                    request_name(r).c_str(), static_cast<unsigned long long>(sums[2]),
                    data_in_flight ? "the communicator is unusable" : "no data was moved");
    if (data_in_flight) mark_broken(message);  // the data went out to ranks that never posted
    throw kit::Error(MNCL_ERR_NOT_SUPPORTED, message);
  }
  std::string differences;
  const char *const names[Request::kFields] = {
      "kind",
      "dtype",
      "op",
      "root",
      r.kind == MNCL_COLL_ALLGATHERV ? "count in all" : "count",
      "buffers",
      "sequence number",
      "elements inside the check, plus one (0: none; an allreduce, reduce or reduce-scatter of "
      "at most 3840 bytes in all; with the direct exchange, a broadcast or allgather block of at "
      "most 3840 bytes; never where flat advertises CUDA memory)"};
  for (int i = 0; r.fingerprinted && i < Request::kFields; ++i) {
    const uint64_t hi = r.check_out[i], lo = ~r.check_out[Request::kFields + i];
    if (hi == lo) continue;
    const auto as_int = [](uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); };
    std::string a, b;
    switch (i) {
      case 0:
        a = kind_name(as_int(lo));
        b = kind_name(as_int(hi));
        break;
      case 1:
        a = kit::dtype_name(as_int(lo));
        b = kit::dtype_name(as_int(hi));
        break;
      case 2:
        a = kit::op_name(as_int(lo));
        b = kit::op_name(as_int(hi));
        break;
      case 3:
        a = std::to_string(as_int(lo));
        b = std::to_string(as_int(hi));
        break;
      case 5: {  // coalesced_split(): nbufs, and the digest of the counts
        const auto split = [](uint64_t v) {
          return kit::format("%u (counts digest %08x)", static_cast<unsigned>(v & 0xffffffffu),
                             static_cast<unsigned>(v >> 32));
        };
        a = split(lo);
        b = split(hi);
        break;
      }
      default:
        a = std::to_string(lo);
        b = std::to_string(hi);
    }
    differences += kit::format("%s%s %s vs %s", differences.empty() ? "" : ", ", names[i],
                               a.c_str(), b.c_str());
  }
  if (differences.empty() && r.counts_summed && sums[0] != sums[1]) {
    differences = "counts: " + counts_disagreement(r.kind);
  }
  if (differences.empty()) return;
  if (!data_in_flight) {
    throw kit::Error(MNCL_ERR_REMOTE,
                     kit::format("flat %s: mismatched collective calls across the ranks (%s); no "
                                 "data was moved",
                                 request_name(r).c_str(), differences.c_str()));
  }
  // The data operation was issued against mismatched peers: MPI may never finish it.
  throw_broken(MNCL_ERR_REMOTE,
               kit::format("flat %s: mismatched collective calls across the ranks (%s); "
                           "the result buffers are undefined and the communicator unusable",
                           request_name(r).c_str(), differences.c_str()));
}

void Comm::advance() {
  // Even once aborted or broken: peers may still wait for this rank's part of an exchange.
  step_exchanges();
  while (!deferred_.empty()) {
    if (aborted_.load() || broken_.load()) {
      abandon_queue();
      return;
    }
    Request &d = *deferred_.front();
    if (d.exchanging.load(std::memory_order_relaxed)) break;  // later calls wait for its data
    deferred_.pop_front();
    const int rc = d.exchange_rc;
    try {
      if (rc != MPI_SUCCESS) {
        // Its output was never written: comparing it would report a mismatch that is not one.
        throw_broken(mpi_error_status(rc),
                     checks_failed_message(request_name(d), rank_, size_, rc));
      }
      check_call(d);  // checks_only: a mismatch leaves the communicator usable
      const size_t issued_before = d.mpi.size();
      try {
        MpiLock lock;
        issue(d.deferred->coll, d, true);
      } catch (const std::exception &e) {
        // Part of the data may have gone out (an error before any MPI call, the same on every
        // rank for the same call, leaves the communicator usable).
        if (d.mpi.size() > issued_before) mark_broken(e.what());
        throw;
      } catch (...) {
        if (d.mpi.size() > issued_before) mark_broken("an unknown error while issuing its data");
        throw;
      }
      d.checks_only = false;
    } catch (const kit::Error &e) {
      d.settled_status = e.status();
      d.settled_message = e.what();
    } catch (const std::exception &e) {
      d.settled_status = MNCL_ERR_INTERNAL;
      d.settled_message = kit::format("flat %s: %s", request_name(d).c_str(), e.what());
      mark_broken(d.settled_message);
    }
    d.data_deferred.store(false, std::memory_order_release);
  }
  update_queued();
}

void Comm::abandon_queue() {
  const bool aborted = aborted_.load();
  for (Request *d : deferred_) {
    d->settled_status = aborted ? MNCL_ERR_ABORTED : MNCL_ERR_REMOTE;
    d->settled_message =
        kit::format("flat %s: never started: %s before its checks had passed; no data was moved",
                    request_name(*d).c_str(),
                    aborted ? "the communicator was aborted"
                            : "an operation on this communicator timed out or failed inside MPI");
    d->data_deferred.store(false, std::memory_order_release);
  }
  deferred_.clear();
  update_queued();
}

void Comm::settle(std::unique_lock<std::mutex> &lock, Clock::time_point deadline,
                  const mncl_coll_v1_t *c, const char *what) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(50);
  for (;;) {
    advance();  // abandons the queue on an abort: check_usable below says so
    if (deferred_.empty()) {
      check_usable(c, what);
      return;
    }
    const Request &head = *deferred_.front();
    const auto now = Clock::now();
    if (now >= head.deadline || now >= deadline) {
      // This call posted no checks where its peers may have: this rank is out of step, and
      // what is queued fails (abandon_queue) rather than go out.
      throw_broken(MNCL_ERR_TIMEOUT,
                   kit::format("flat %s: %s (posted earlier, whose data go first) did not "
                               "pass its checks in time on rank %d of %d (a peer is missing "
                               "or stuck)",
                               (c != nullptr ? describe(*c) : std::string(what)).c_str(),
                               request_name(head).c_str(), rank_, size_));
    }
    // Unlocked meanwhile: other threads' tests of this communicator's requests go on.
    lock.unlock();
    progress_all(this);
    if (now > spin_until) std::this_thread::yield();
    lock.lock();
  }
}

void Comm::progress_all(const Comm *self) {
  // None queued, or only self (a blocking call's own exchange, which its caller steps): no
  // other communicator to move on, and no registry lock for each poll of every thread. Read
  // without the locks: a queue that starts meanwhile is seen at the next poll.
  const int queued = g_queued_comms.load();
  if (queued == 0 ||
      (queued == 1 && self != nullptr && self->queued_.load(std::memory_order_acquire) > 0)) {
    return;
  }
  Registry &all = registry();
  std::lock_guard<std::mutex> registered(all.mutex);
  for (Comm *other : all.comms) {
    if (other == self || other->queued_.load(std::memory_order_acquire) == 0) continue;
    // Never waits for another communicator's lock: its holder moves that queue itself (and
    // may be waiting for this registry).
    std::unique_lock<std::mutex> guard(other->deferred_mutex_, std::try_to_lock);
    if (guard.owns_lock()) other->advance();
  }
}

void Comm::retire(std::unique_ptr<Request> r) {
  if (r == nullptr) return;
  if (r->in_flight) {  // an orphan keeps no progress thread polling
    r->in_flight = false;
    g_in_flight.fetch_sub(1);
  }
  bool exchanging = false;
  if (r->data_deferred.load() || r->exchanging.load()) {
    std::lock_guard<std::mutex> guard(deferred_mutex_);
    if (r->data_deferred.load()) {
      // Failed while queued (timed out, aborted): this rank's order of calls may no longer be
      // its peers', so nothing queued may go out.
      mark_broken(request_name(*r) + " failed while queued behind other posted calls");
      abandon_queue();
    }
    exchanging = r->exchanging.load();
  }
  if (exchanging) {
    // Its exchange goes on (step_exchanges tests its requests): the peers wait for its part
    // (a refusal is posted so that they learn of it and fail alike), and the next call's
    // exchange follows it.
    std::lock_guard<std::mutex> guard(orphans_mutex_);
    orphans_.push_back(std::move(r));
    return;
  }
  if (r->mpi.empty() || mpi_finalized()) return;
  MpiLock lock;
  int done = 0;
  MPI_Testall(static_cast<int>(r->mpi.size()), r->mpi.data(), &done, MPI_STATUSES_IGNORE);
  // Its own lock: under MPI_THREAD_MULTIPLE MpiLock locks nothing, and a failed blocking call on
  // one thread may retire beside a posted one's test on another.
  std::lock_guard<std::mutex> guard(orphans_mutex_);
  if (!done) orphans_.push_back(std::move(r));
}

void Comm::finish(const Request &r, const MPI_Status *statuses) {
  if (statuses != nullptr) {
    for (const Request::Expected &e : r.expected) {
      int got = 0;
      MPI_Get_count(&statuses[e.index], mpi_datatype(e.dtype), &got);
      if (got != e.count) {
        throw kit::Error(MNCL_ERR_REMOTE,
                         kit::format("flat %s: received %d elements from rank %d, expected "
                                     "%d (%s)",
                                     request_name(r).c_str(), got, e.peer, e.count,
                                     r.kind == MNCL_COLL_RECV ? "the sender's count differs"
                                                              : "do the ranks' counts agree?"));
      }
    }
  }
  if (!r.mismatch.empty()) {
    throw kit::Error(MNCL_ERR_REMOTE, kit::format("flat %s: %s (do the ranks' counts agree?)",
                                                  request_name(r).c_str(), r.mismatch.c_str()));
  }
  if (r.avg_buf != nullptr) kit::finish_avg(r.avg_buf, r.avg_count, r.dtype, size_);
  for (const Request::Copy &copy : r.copy_out) {
    if (copy.bytes > 0 && copy.dst != copy.src) std::memcpy(copy.dst, copy.src, copy.bytes);
  }
}

void Comm::issue(const mncl_coll_v1_t &c, Request &r, bool nonblocking) {
  const MPI_Datatype type = mpi_datatype(c.dtype);
  const size_t esize = kit::dtype_size(c.dtype);
  const MPI_Op op = kit::is_reduction(c.kind) ? mpi_op(c.dtype, c.op) : MPI_OP_NULL;
  const bool avg = kit::is_reduction(c.kind) && c.op == MNCL_AVG;
  const bool is_root = c.root == rank_;
  const size_t block = c.count * esize;  // bytes of one rank's block
  const char *send = static_cast<const char *>(c.sendbuf);
  char *recv = static_cast<char *>(c.recvbuf);
  // The request slot of the next non-blocking call.
  auto next = [&r] {
    r.mpi.push_back(MPI_REQUEST_NULL);
    return &r.mpi.back();
  };

  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE_COALESCED:
      if (c.nbufs != 1) break;  // packed below; a single buffer is a plain allreduce
      send = static_cast<const char *>(c.sendbufs[0]);
      recv = static_cast<char *>(c.recvbufs[0]);
      [[fallthrough]];
    case MNCL_COLL_ALLREDUCE:
      issue_allreduce(c, r, send, recv, c.kind == MNCL_COLL_ALLREDUCE ? c.count : c.counts[0],
                      nonblocking);
      return;
    case MNCL_COLL_REDUCE: {
      if (avg && is_root) {
        r.avg_buf = recv;
        r.avg_count = c.count;
      }
      if (nonblocking && ring_agreed(r)) {
        start_ring(r, send, is_root ? recv : nullptr, c.count, c.root);
        return;
      }
      note_ring_declined(r);
      const void *s = is_root && send == recv ? MPI_IN_PLACE : send;
      char *rb = is_root ? recv : nullptr;  // ignored elsewhere, possibly NULL
      for_chunks(c.count, [&](size_t first, int n) {
        const void *cs = shift(s, first, esize);
        void *cr = shift(rb, first, esize);
        check(nonblocking ? MPI_Ireduce(cs, cr, n, type, op, c.root, comm_, next())
                          : MPI_Reduce(cs, cr, n, type, op, c.root, comm_),
              "MPI_Reduce", c);
      });
      return;
    }
    case MNCL_COLL_BCAST:
      for_chunks(c.count, [&](size_t first, int n) {
        void *b = shift(recv, first, esize);
        check(nonblocking ? MPI_Ibcast(b, n, type, c.root, comm_, next())
                          : MPI_Bcast(b, n, type, c.root, comm_),
              "MPI_Bcast", c);
      });
      return;
    case MNCL_COLL_SCATTER: {
      const int n = whole_count(c);
      void *rb = is_root && send + block * rank_ == recv ? MPI_IN_PLACE : recv;
      check(nonblocking ? MPI_Iscatter(send, n, type, rb, n, type, c.root, comm_, next())
                        : MPI_Scatter(send, n, type, rb, n, type, c.root, comm_),
            "MPI_Scatter", c);
      return;
    }
    case MNCL_COLL_GATHER: {
      const int n = whole_count(c);
      const void *s = is_root && recv + block * rank_ == send ? MPI_IN_PLACE : send;
      check(nonblocking ? MPI_Igather(s, n, type, recv, n, type, c.root, comm_, next())
                        : MPI_Gather(s, n, type, recv, n, type, c.root, comm_),
            "MPI_Gather", c);
      return;
    }
    case MNCL_COLL_ALLGATHER: {
      if (nonblocking && ring_agreed(r)) {
        start_ring(r, send, recv, c.count * static_cast<size_t>(size_), -1);
        return;
      }
      note_ring_declined(r);
      const int n = whole_count(c);
      const void *s = recv + block * rank_ == send ? MPI_IN_PLACE : send;
      check(nonblocking ? MPI_Iallgather(s, n, type, recv, n, type, comm_, next())
                        : MPI_Allgather(s, n, type, recv, n, type, comm_),
            "MPI_Allgather", c);
      return;
    }
    case MNCL_COLL_REDUCE_SCATTER: {
      if (nonblocking && ring_agreed(r)) {
        if (avg) {
          r.avg_buf = recv;
          r.avg_count = c.count;
        }
        start_ring(r, send, recv, c.count * static_cast<size_t>(size_), -1);
        return;
      }
      note_ring_declined(r);
      const int n = whole_count(c);
      // MPI's in-place form reads the input from recvbuf and leaves the result at its start;
      // MNCL's keeps the result in the rank's own block. Reduce into scratch, then copy there.
      char *out = recv;
      if (send + block * rank_ == recv) {
        std::vector<unsigned char> &scratch = nonblocking ? r.owned : pack_;
        if (scratch.size() < block) scratch.resize(block);
        out = reinterpret_cast<char *>(scratch.data());
        r.copy_out.push_back({recv, out, block});
      }
      check(nonblocking ? MPI_Ireduce_scatter_block(send, out, n, type, op, comm_, next())
                        : MPI_Reduce_scatter_block(send, out, n, type, op, comm_),
            "MPI_Reduce_scatter_block", c);
      if (avg) {
        r.avg_buf = out;
        r.avg_count = c.count;
      }
      return;
    }
    case MNCL_COLL_ALLTOALL: {
      const int n = whole_count(c);
      const void *s = send == recv ? MPI_IN_PLACE : send;
      check(nonblocking ? MPI_Ialltoall(s, n, type, recv, n, type, comm_, next())
                        : MPI_Alltoall(s, n, type, recv, n, type, comm_),
            "MPI_Alltoall", c);
      return;
    }
    case MNCL_COLL_BARRIER:
      check(nonblocking ? MPI_Ibarrier(comm_, next()) : MPI_Barrier(comm_), "MPI_Barrier", c);
      return;
    case MNCL_COLL_ALLGATHERV:
    case MNCL_COLL_ALLTOALLV:
      issue_v(c, r, nonblocking);
      return;
    case MNCL_COLL_GATHERV:
    case MNCL_COLL_SCATTERV:
      issue_rooted_v(c, r, nonblocking);
      return;
    case MNCL_COLL_SEND:
      for_chunks(c.count, [&](size_t first, int n) {
        const void *b = shift(send, first, esize);
        check(nonblocking ? MPI_Isend(b, n, type, c.root, kTag, comm_, next())
                          : MPI_Send(b, n, type, c.root, kTag, comm_),
              "MPI_Send", c);
      });
      return;
    case MNCL_COLL_RECV: {
      const size_t first_request = r.mpi.size();
      receive(c, r, recv, c.count, c.root, c.dtype, 0, nonblocking);
      if (!r.probes.empty()) complete_probed(c, r, first_request, nonblocking);
      return;
    }
    case MNCL_COLL_SENDRECV_BATCH:
      issue_batch(c, r, nonblocking);
      return;
    default:
      throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                       kit::format("flat: collective kind %d is not implemented", c.kind));
  }

  // ALLREDUCE_COALESCED of several buffers: pack them into one, one MPI_Allreduce in place,
  // divide for AVG once over the whole pack, and copy each part back out.
  size_t total = 0;
  for (size_t i = 0; i < c.nbufs; ++i) total += c.counts[i];
  std::vector<unsigned char> &pack = nonblocking ? r.owned : pack_;
  if (pack.size() < total * esize) pack.resize(total * esize);
  char *packed = reinterpret_cast<char *>(pack.data());
  r.copy_out.reserve(c.nbufs);
  size_t offset = 0;
  for (size_t i = 0; i < c.nbufs; ++i) {
    const size_t bytes = c.counts[i] * esize;
    if (bytes > 0) std::memcpy(packed + offset, c.sendbufs[i], bytes);
    r.copy_out.push_back({c.recvbufs[i], packed + offset, bytes});
    offset += bytes;
  }
  issue_allreduce(c, r, packed, packed, total, nonblocking);
}

void Comm::issue_allreduce(const mncl_coll_v1_t &c, Request &r, const char *send, char *recv,
                           size_t count, bool nonblocking) {
  const MPI_Datatype type = mpi_datatype(c.dtype);
  const size_t esize = kit::dtype_size(c.dtype);
  if (c.op == MNCL_AVG) {
    r.avg_buf = recv;
    r.avg_count = count;
  }
  if (nonblocking && ring_agreed(r)) {
    start_ring(r, send, recv, count, -1);
    return;
  }
  note_ring_declined(r);
  const MPI_Op op = mpi_op(c.dtype, c.op);
  const void *s = send == recv ? MPI_IN_PLACE : send;
  for_chunks(count, [&](size_t first, int n) {
    const void *cs = shift(s, first, esize);
    void *cr = shift(recv, first, esize);
    if (!nonblocking) {
      check(MPI_Allreduce(cs, cr, n, type, op, comm_), "MPI_Allreduce", c);
      return;
    }
    r.mpi.push_back(MPI_REQUEST_NULL);
    check(MPI_Iallreduce(cs, cr, n, type, op, comm_, &r.mpi.back()), "MPI_Iallreduce", c);
  });
}

namespace {
// The ring's point-to-point messages, on checks_comm_ (whose point-to-point space carries
// nothing else): one ring at a time per communicator (only blocking calls ring), and each
// neighbour's messages match in step order.
constexpr int kRingTag = 1;

// The largest ring scratch a communicator keeps between calls.
constexpr size_t kKeptRingScratch = size_t{256} << 20;
constexpr size_t kPageBytes = 4096;
}  // namespace

void FreeDeleter::operator()(unsigned char *p) const noexcept {
  std::free(p);
}

PageAlignedBytes allocate_page_aligned(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment.
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPageBytes - 1) / kPageBytes * kPageBytes;
  void *p = std::aligned_alloc(kPageBytes, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return PageAlignedBytes(static_cast<unsigned char *>(p));
}

namespace {

// Chunk i of a ring over count elements among size ranks: [ring_begin(i), ring_begin(i + 1)).
size_t ring_begin(size_t count, int size, int i) {
  return count / static_cast<size_t>(size) * static_cast<size_t>(i) +
         std::min(count % static_cast<size_t>(size), static_cast<size_t>(i));
}

// (a mod size) for a in [-size, 2 size).
int ring_index(int a, int size) {
  return (a % size + size) % size;
}
}  // namespace

bool Comm::offers_ring(const mncl_coll_v1_t &c, const Request &r, size_t count) const {
  if (!options_.bounded || options_.cuda || !r.polled || r.fused || size_ < 2) return false;
  const bool blocks = c.kind == MNCL_COLL_REDUCE_SCATTER || c.kind == MNCL_COLL_ALLGATHER;
  if (!blocks && c.kind != MNCL_COLL_ALLREDUCE && c.kind != MNCL_COLL_ALLREDUCE_COALESCED &&
      c.kind != MNCL_COLL_REDUCE) {
    return false;
  }
  // Per rank: the ring takes up to 2 (size - 1) steps of one chunk each, so more ranks need
  // more bytes before its steps stop being latency bound. A chunk's bytes are also one
  // message's int count (MPI_BYTE); bigger ones keep MPI's chunking.
  const size_t esize = kit::dtype_size(c.dtype);
  const size_t largest_chunk = blocks ? c.count * esize : ring_chunk_bytes(count, esize);
  // MPI's reduce-scatter reduces the whole input at one rank before it scatters the result,
  // moving about size times the ring's bytes: the ring pays from a quarter of the threshold
  // (measured: 0.2-0.4x MPI's time from 64 KiB per rank at 2 to 4 ranks, 1.2-2x below 16 KiB).
  const size_t threshold = ring_min_bytes(c.kind);
  const size_t min_bytes = c.kind == MNCL_COLL_REDUCE_SCATTER ? (threshold + 3) / 4 : threshold;
  return threshold > 0 && largest_chunk >= min_bytes &&
         largest_chunk <= static_cast<size_t>(INT_MAX);
}

size_t Comm::ring_min_bytes(int32_t kind) const {
  if (options_.ring_min_bytes != Options::kRingMinAuto) return options_.ring_min_bytes;
  if (size_ != 2) return size_t{128} << 10;
  // Past what the check exchange carries (Request::kFusedBytes): allreduces of 4 KiB, allgather
  // blocks of 4 KiB, reduce-scatter blocks of 2 KiB (a quarter of the value).
  switch (kind) {
    case MNCL_COLL_REDUCE:
      return size_t{32} << 10;
    case MNCL_COLL_ALLGATHER:
      return size_t{4} << 10;
    case MNCL_COLL_REDUCE_SCATTER:
      return size_t{8} << 10;
    default:
      return size_t{2} << 10;
  }
}

size_t Comm::ring_chunk_bytes(size_t count, size_t esize) const {
  const size_t n = static_cast<size_t>(size_);
  return (count / n + (count % n != 0 ? 1 : 0)) * esize;
}

bool Comm::ring_agreed(const Request &r) {
  return r.fingerprinted && r.checked && r.check_out[Request::kRingVotes] == 0;
}

void Comm::start_ring(Request &r, const char *send, char *recv, size_t count, int root) {
  auto ring = std::make_unique<Request::Ring>();
  Request::Ring &g = *ring;
  g.kind = r.kind == MNCL_COLL_ALLREDUCE_COALESCED ? MNCL_COLL_ALLREDUCE : r.kind;
  g.send = send;
  g.recv = recv;
  g.count = count;
  g.esize = kit::dtype_size(r.dtype);
  g.root = root;
  const bool allgather = g.kind == MNCL_COLL_ALLGATHER;
  const bool scatter = g.kind == MNCL_COLL_REDUCE_SCATTER;
  // A reduce-scatter ends with each rank's own block reduced, and an allgather starts from it.
  g.shift = scatter || allgather ? -1 : 0;
  g.reduce_steps = allgather ? 0 : size_ - 1;
  g.gather_steps = g.kind == MNCL_COLL_ALLREDUCE || allgather ? size_ - 1 : 0;
  g.steps = g.reduce_steps + g.gather_steps + (root >= 0 ? 1 : 0);
  const size_t chunk_bytes = ring_chunk_bytes(count, g.esize);
  // MNCL's in-place forms: the input at the result (allreduce, reduce), or at this rank's block
  // of it (allgather), or the result at this rank's block of the input (reduce-scatter).
  g.in_place = allgather || scatter ? (allgather ? recv + rank_ * chunk_bytes == send
                                                 : send + rank_ * chunk_bytes == recv)
                                    : send == recv;
  // Scratch: in place, one chunk (a received chunk before it is reduced). With no result
  // buffer for the partial sums (a reduce's non-root, a reduce-scatter), two: one step's
  // partial sums are received into one while the last step's go out from the other; a
  // reduce-scatter's last step receives into the result, or in place into one of them.
  constexpr size_t align = Request::Ring::kScratchAlign;
  const size_t slot_bytes = (chunk_bytes + align - 1) / align * align + align;
  size_t scratch_bytes = g.in_place && !allgather ? slot_bytes : 0;
  if ((root >= 0 && recv == nullptr) || scatter) {
    // A reduce-scatter on 2 ranks has one step, the last: out of place it needs no scratch.
    if (!scatter || g.reduce_steps > 1) scratch_bytes = 2 * slot_bytes;
    if (scratch_bytes > 0) {
      g.half = chunk_bytes;
      g.slot = slot_bytes;
    }
  }
  if (scratch_bytes > 0) {
    // The scratch of the last ring, kept (tens of MiB, which glibc would map and page-fault
    // anew on every call), or a larger one; never zero-filled.
    std::lock_guard<std::mutex> guard(ring_scratch_mutex_);
    if (ring_scratch_bytes_ >= scratch_bytes) {
      g.scratch = std::move(ring_scratch_);
      g.scratch_bytes = ring_scratch_bytes_;
      ring_scratch_bytes_ = 0;
    } else {
      g.scratch = allocate_page_aligned(scratch_bytes);
      g.scratch_bytes = scratch_bytes;
    }
  }
  // A reduce's root receives every other rank's chunk in its last step.
  g.first_request = r.mpi.size();
  r.mpi.resize(r.mpi.size() + static_cast<size_t>(std::max(2, size_ - 1)), MPI_REQUEST_NULL);
  r.ring = std::move(ring);
  MNCL_KIT_LOG(host_, MNCL_LOG_TRACE, "flat %s: flat's ring over %d ranks, %zu bytes",
               request_name(r).c_str(), size_, count * g.esize);
  post_ring_step(r);
  // An allgather's own block, copied into place while the first step's messages travel.
  if (allgather && !g.in_place) std::memcpy(recv + rank_ * chunk_bytes, send, chunk_bytes);
}

void Comm::note_ring_declined(const Request &r) const {
  if (!r.fingerprinted || !r.checked || r.check_in[Request::kRingVotes] != 0) return;
  MNCL_KIT_LOG(host_, MNCL_LOG_TRACE,
               "flat %s: %llu rank(s) declined flat's ring (a posted call, their "
               "MNCL_FLAT_RING_MIN_BYTES or a CUDA-aware MPI): MPI's own",
               request_name(r).c_str(),
               static_cast<unsigned long long>(r.check_out[Request::kRingVotes]));
}

void Comm::post_ring_step(Request &r) {
  Request::Ring &g = *r.ring;
  const bool reducing = g.step < g.reduce_steps;
  const auto offset = [&](int chunk) { return ring_begin(g.count, size_, chunk) * g.esize; };
  const auto bytes = [&](int chunk) { return static_cast<int>(offset(chunk + 1) - offset(chunk)); };
  const auto failed = [&](int rc) {
    // Its neighbours wait for this step: the communicator is out of step with theirs.
    throw_broken(
        mpi_error_status(rc),
        kit::format("flat %s: posting step %d of its ring failed on rank %d of %d: %s",
                    request_name(r).c_str(), g.step, rank_, size_, mpi_error_text(rc).c_str()));
  };
  if (g.step == g.reduce_steps + g.gather_steps) {
    // A reduce's last step: each rank's reduced chunk, (rank + 1), to the root.
    const int own = ring_index(rank_ + 1, size_);
    if (rank_ != g.root) {
      const int rc = MPI_Isend(g.partial(size_ - 2, offset(own)), bytes(own), MPI_BYTE, g.root,
                               kRingTag, checks_comm_, &r.mpi[g.first_request]);
      if (rc != MPI_SUCCESS) failed(rc);
      return;
    }
    size_t slot = g.first_request;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      const int chunk = ring_index(peer + 1, size_);
      const int rc = MPI_Irecv(g.recv + offset(chunk), bytes(chunk), MPI_BYTE, peer, kRingTag,
                               checks_comm_, &r.mpi[slot++]);
      if (rc != MPI_SUCCESS) failed(rc);
    }
    return;
  }
  // With base = rank + shift: reduce-scatter: step s sends chunk (base - s), reduced over s + 1
  // ranks, and receives chunk (base - s - 1) to reduce. Allgather: step t sends chunk
  // (base + 1 - t), which is complete, and receives chunk (base - t) into place.
  const int base = rank_ + g.shift;
  const int t = reducing ? g.step : g.step - g.reduce_steps;
  const int out = ring_index(reducing ? base - t : base + 1 - t, size_);
  const int in = ring_index(reducing ? base - t - 1 : base - t, size_);
  const bool last_scatter_step = g.kind == MNCL_COLL_REDUCE_SCATTER && g.step == g.reduce_steps - 1;
  const char *source;
  if (reducing && g.step == 0) {
    source = g.send + offset(out);
  } else if (reducing && g.half > 0) {
    source = g.partial(g.step - 1, offset(out));  // the chunk received in the step before
  } else if (g.reduce_steps == 0 && t == 0) {
    source = g.send;  // an allgather's own block
  } else {
    source = g.recv + offset(out);
  }
  char *target = !reducing                  ? g.recv + offset(in)
                 : last_scatter_step        ? (g.in_place ? g.partial(g.step, offset(in)) : g.recv)
                 : g.half > 0 || g.in_place ? g.partial(g.step, offset(in))
                                            : g.recv + offset(in);
  const int left = ring_index(rank_ - 1, size_), right = ring_index(rank_ + 1, size_);
  int rc =
      MPI_Irecv(target, bytes(in), MPI_BYTE, left, kRingTag, checks_comm_, &r.mpi[g.first_request]);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Isend(source, bytes(out), MPI_BYTE, right, kRingTag, checks_comm_,
                   &r.mpi[g.first_request + 1]);
  }
  if (rc != MPI_SUCCESS) failed(rc);
}

bool Comm::advance_ring(Request &r) {
  Request::Ring &g = *r.ring;
  if (g.step < g.reduce_steps) {
    const int in = ring_index(rank_ + g.shift - g.step - 1, size_);
    const size_t first = ring_begin(g.count, size_, in);
    const size_t n = ring_begin(g.count, size_, in + 1) - first;
    const char *input = g.send + first * g.esize;
    // Out of place the chunk was received into the result (partial sums without a result: into
    // this step's half of the scratch), and this rank's input is added; in place the result
    // still holds the input there, and the chunk came into the scratch.
    char *own = g.half > 0 ? g.partial(g.step, first * g.esize) : g.recv + first * g.esize;
    const void *other = g.in_place ? g.partial(g.step, first * g.esize) : input;
    if (g.kind == MNCL_COLL_REDUCE_SCATTER) {
      // Its partial sums all in scratch, but the last: received into the result, or in place
      // (where the result holds this rank's input) into scratch.
      const bool last = g.step == g.reduce_steps - 1;
      own = last ? g.recv : g.partial(g.step, first * g.esize);
      other = last && g.in_place ? g.partial(g.step, first * g.esize) : input;
    }
    kit::reduce_into(own, other, n, r.dtype, r.op);
  }
  if (++g.step == g.steps) {
    // Done with it: the next ring takes it, unless it is too large to keep idle.
    if (g.scratch != nullptr && g.scratch_bytes <= kKeptRingScratch) {
      std::lock_guard<std::mutex> guard(ring_scratch_mutex_);
      if (g.scratch_bytes > ring_scratch_bytes_) {
        ring_scratch_ = std::move(g.scratch);
        ring_scratch_bytes_ = g.scratch_bytes;
      }
    }
    return true;
  }
  MpiLock lock;
  post_ring_step(r);
  return false;
}

void Comm::issue_v(const mncl_coll_v1_t &c, Request &r, bool nonblocking) {
  const kit::VLayout v = kit::v_layout(c);
  const size_t n = c.nbufs, me = static_cast<size_t>(rank_);
  const size_t big = v_big(size_);
  const bool gather = c.kind == MNCL_COLL_ALLGATHERV;
  const MPI_Datatype type = mpi_datatype(c.dtype);
  const size_t esize = kit::dtype_size(c.dtype);
  const char *send = static_cast<const char *>(c.sendbuf);
  char *recv = static_cast<char *>(c.recvbuf);
  const bool in_place =
      gather && v.recvcounts[me] != 0 && send == shift(recv, v.rdispls[me], esize);
  const auto send_count = [&](size_t j) { return gather ? c.count : v.sendcounts[j]; };
  const auto send_block = [&](size_t j) {
    return gather || send_count(j) == 0 ? send : shift(send, v.sdispls[j], esize);
  };

  // Blocks above `big`: point-to-point, receives first. An in-place block stays where it is;
  // this rank's own block goes through MPI too (device buffers: no host copy).
  const size_t first_request = r.mpi.size(), first_expected = r.expected.size();
  for (size_t peer = 0; peer < n; ++peer) {
    if (v.recvcounts[peer] <= big || (in_place && peer == me)) continue;
    char *block = shift(recv, v.rdispls[peer], esize);
    for_chunks(v.recvcounts[peer], [&](size_t first, int count) {
      const size_t index = r.mpi.size();
      r.mpi.push_back(MPI_REQUEST_NULL);
      check(MPI_Irecv(shift(block, first, esize), count, type, static_cast<int>(peer), kVTag, comm_,
                      &r.mpi.back()),
            "MPI_Irecv", c);
      r.expected.push_back({index, count, static_cast<int>(peer), c.dtype});
    });
  }
  for (size_t peer = 0; peer < n; ++peer) {
    if (send_count(peer) <= big || (in_place && peer == me)) continue;
    const char *block = send_block(peer);
    for_chunks(send_count(peer), [&](size_t first, int count) {
      r.mpi.push_back(MPI_REQUEST_NULL);
      check(MPI_Isend(shift(block, first, esize), count, type, static_cast<int>(peer), kVTag, comm_,
                      &r.mpi.back()),
            "MPI_Isend", c);
    });
  }

  // The other blocks: one MPI collective, on MPI's int arrays (filled before the call and
  // kept in r: a non-blocking call reads them until it ends).
  std::vector<int> &ints = r.v_ints;
  ints.assign((gather ? 2 : 4) * n, 0);
  int *rcounts = ints.data() + (gather ? 0 : 2 * n), *rdispls = rcounts + n;
  const VSide rs = v_side(v.recvcounts, v.rdispls, n, big, rcounts, rdispls);
  char *rb = shift(recv, rs.base, esize);
  if (rs.packed) {
    // Received packed into scratch, then copied to the displacements once MPI is done.
    r.owned.resize(rs.total * esize);
    rb = reinterpret_cast<char *>(r.owned.data());
    for (size_t i = 0; i < n; ++i) {
      if (rcounts[i] == 0 || (in_place && i == me)) continue;
      r.copy_out.push_back({recv + v.rdispls[i] * esize,
                            rb + static_cast<size_t>(rdispls[i]) * esize, v.recvcounts[i] * esize});
    }
  }
  MPI_Request *request = nullptr;
  if (nonblocking) {
    r.mpi.push_back(MPI_REQUEST_NULL);
    request = &r.mpi.back();
  }
  if (gather) {
    const int own = c.count <= big ? static_cast<int>(c.count) : 0;
    // In place: this rank's block is already at its displacement in rb (unless rb is scratch).
    const void *s = in_place && own != 0 && !rs.packed ? MPI_IN_PLACE : c.sendbuf;
    check(nonblocking ? MPI_Iallgatherv(s, own, type, rb, rcounts, rdispls, type, comm_, request)
                      : MPI_Allgatherv(s, own, type, rb, rcounts, rdispls, type, comm_),
          "MPI_Allgatherv", c);
  } else {
    int *scounts = ints.data(), *sdispls = ints.data() + n;
    const VSide ss = v_side(v.sendcounts, v.sdispls, n, big, scounts, sdispls);
    const char *sb = shift(send, ss.base, esize);
    if (ss.packed) {
      r.owned_send.resize(ss.total * esize);
      for (size_t j = 0; j < n; ++j) {
        if (scounts[j] == 0) continue;
        std::memcpy(r.owned_send.data() + static_cast<size_t>(sdispls[j]) * esize, send_block(j),
                    v.sendcounts[j] * esize);
      }
      sb = reinterpret_cast<const char *>(r.owned_send.data());
    }
    // Never in place (the core refuses overlapping extents). But Open MPI's non-blocking
    // alltoallv (libnbc) reads sendbuf == recvbuf as MPI_IN_PLACE, which a side that moves
    // nothing may well be (a gatherv's root passes its own empty block): that side then points
    // elsewhere, or the in-place exchange would wait for blocks nobody sends.
    static char nothing[1];
    if (sb == rb && ss.total == 0) {
      sb = nothing;
    } else if (sb == rb && rs.total == 0) {
      rb = nothing;
    }
    check(
        nonblocking
            ? MPI_Ialltoallv(sb, scounts, sdispls, type, rb, rcounts, rdispls, type, comm_, request)
            : MPI_Alltoallv(sb, scounts, sdispls, type, rb, rcounts, rdispls, type, comm_),
        "MPI_Alltoallv", c);
  }
  if (nonblocking || r.mpi.size() == first_request) return;

  // Blocking, with point-to-point blocks: wait for them now.
  wait_p2p(c, r, first_request, first_expected);
}

void Comm::wait_p2p(const mncl_coll_v1_t &c, Request &r, size_t first_request,
                    size_t first_expected) {
  std::vector<MPI_Status> statuses(r.mpi.size() - first_request);
  int rc =
      MPI_Waitall(static_cast<int>(statuses.size()), r.mpi.data() + first_request, statuses.data());
  if (rc == MPI_ERR_IN_STATUS) {
    const size_t failed = first_failure(statuses.data(), statuses.size(), rc);
    const std::string longer = longer_message(r.expected, first_request + failed, rc);
    if (!longer.empty()) {
      throw kit::Error(MNCL_ERR_REMOTE, kit::format("flat %s: %s (do the ranks' counts agree?)",
                                                    describe(c).c_str(), longer.c_str()));
    }
  }
  check(rc, "MPI_Waitall (point-to-point messages)", c);
  for (size_t i = first_expected; i < r.expected.size(); ++i) {
    const Request::Expected &e = r.expected[i];
    int got = 0;
    MPI_Get_count(&statuses[e.index - first_request], mpi_datatype(e.dtype), &got);
    if (got != e.count) {
      throw kit::Error(MNCL_ERR_REMOTE,
                       kit::format("flat %s: received %d elements from rank %d, expected %d (do "
                                   "the ranks' counts agree?)",
                                   describe(c).c_str(), got, e.peer, e.count));
    }
  }
  r.mpi.resize(first_request);
  r.expected.resize(first_expected);
}

void Comm::issue_rooted_v(const mncl_coll_v1_t &c, Request &r, bool nonblocking) {
  const bool gather = c.kind == MNCL_COLL_GATHERV;
  const MPI_Datatype type = mpi_datatype(c.dtype);
  const size_t esize = kit::dtype_size(c.dtype);
  const char *send = static_cast<const char *>(c.sendbuf);
  char *recv = static_cast<char *>(c.recvbuf);
  const size_t first_request = r.mpi.size();
  // The operation's own tag: its messages can match no other operation's, whatever the order
  // in which their receives are probed (2 .. tag_ub_; 0 and 1 are kTag and kVTag).
  r.tag = 2 + static_cast<int>(c.seq % static_cast<uint64_t>(tag_ub_ - 1));
  // One block, received or sent whole: one message (an empty one for count 0, so that the
  // receiver always matches one and sees a disagreement), or chunks of at most kMaxChunk.
  // An empty block's displacement is unchecked (mncl_plugin_v5.h): no pointer is made from it.
  const auto block_at = [&](auto *base, size_t displ, size_t count) {
    return count == 0 ? nullptr : shift(base, displ, esize);
  };
  const auto expect = [&](char *block, size_t count, int peer) {
    for_chunks(count, [&](size_t first, int n) {
      r.probes.push_back({peer, shift(block, first, esize), n, c.dtype, 0, false});
      ++r.unmatched;
    });
  };
  const auto post_send = [&](const char *block, size_t count, int peer) {
    for_chunks(count, [&](size_t first, int n) {
      r.mpi.push_back(MPI_REQUEST_NULL);
      check(MPI_Isend(shift(block, first, esize), n, type, peer, r.tag, comm_, &r.mpi.back()),
            "MPI_Isend", c);
    });
  };

  if (c.root != rank_) {
    // This rank's block, to or from the root. A blocking gatherv sends it with MPI_Send.
    if (gather && !nonblocking) {
      for_chunks(c.count, [&](size_t first, int n) {
        check(MPI_Send(shift(send, first, esize), n, type, c.root, r.tag, comm_), "MPI_Send", c);
      });
      return;
    }
    if (gather) {
      post_send(send, c.count, c.root);
    } else {
      expect(recv, c.count, c.root);
    }
  } else {
    // The root: one block per other rank, received (gatherv) or sent (scatterv). Its own block
    // (counts[root] == count elements) stays put in place, else is copied: on the host by
    // memcpy, on device memory (CUDA-aware MPI) as a message to itself.
    const kit::RootedVLayout v = kit::rooted_v_layout(c);
    const size_t me = static_cast<size_t>(rank_);
    const char *own_src = gather ? send : block_at(send, v.displs[me], c.count);
    char *own_dst = gather ? block_at(recv, v.displs[me], c.count) : recv;
    const bool own_copy = c.count != 0 && own_src != own_dst;
    const bool own_by_mpi = own_copy && options_.cuda &&
                            (cuda::is_device_pointer(own_src) || cuda::is_device_pointer(own_dst));
    for (size_t i = 0; i < c.nbufs; ++i) {
      if (i == me) continue;
      if (gather) {
        expect(block_at(recv, v.displs[i], v.counts[i]), v.counts[i], static_cast<int>(i));
      } else {
        post_send(block_at(send, v.displs[i], v.counts[i]), v.counts[i], static_cast<int>(i));
      }
    }
    if (own_by_mpi) {
      expect(own_dst, c.count, rank_);
      post_send(own_src, c.count, rank_);
    } else if (own_copy) {
      std::memcpy(own_dst, own_src, c.count * esize);
    }
  }
  complete_probed(c, r, first_request, nonblocking);
}

void Comm::issue_batch(const mncl_coll_v1_t &c, Request &r, bool nonblocking) {
  const mncl_p2p_v4_t *ops = kit::p2p_ops(c);
  const size_t first_request = r.mpi.size();
  // Sends first: a blocking batch then only waits for its receives' messages to arrive.
  for (size_t i = 0; i < c.nbufs; ++i) {
    const mncl_p2p_v4_t &o = ops[i];
    if (o.kind != MNCL_COLL_SEND) continue;
    const size_t esize = kit::dtype_size(o.dtype);
    for_chunks(o.count, [&](size_t first, int n) {
      r.mpi.push_back(MPI_REQUEST_NULL);
      check(MPI_Isend(shift(static_cast<const char *>(o.buf), first, esize), n,
                      mpi_datatype(o.dtype), o.peer, kTag, comm_, &r.mpi.back()),
            "MPI_Isend", c);
    });
  }
  for (size_t i = 0; i < c.nbufs; ++i) {
    const mncl_p2p_v4_t &o = ops[i];
    if (o.kind == MNCL_COLL_RECV) {
      receive(c, r, static_cast<char *>(o.buf), o.count, o.peer, o.dtype, i, nonblocking);
    }
  }
  // Each peer's probes adjacent, in the batch's order (progress_probes' rule).
  std::stable_sort(
      r.probes.begin(), r.probes.end(),
      [](const Request::Probe &a, const Request::Probe &b) { return a.peer < b.peer; });
  if (!r.probes.empty()) {
    complete_probed(c, r, first_request, nonblocking);
  } else if (!nonblocking && r.mpi.size() > first_request) {
    wait_p2p(c, r, first_request, 0);  // sends only
  }
}

void Comm::receive(const mncl_coll_v1_t &c, Request &r, char *block, size_t count, int peer,
                   int32_t dtype, size_t op, bool nonblocking) {
  const size_t esize = kit::dtype_size(dtype);
  const MPI_Datatype type = mpi_datatype(dtype);
  for_chunks(count, [&](size_t first, int n) {
    if (nonblocking && !r.polled) {
      // MPI must progress it inside the application's own MPI calls: a pending probe would not
      // be, and a peer's rendezvous send could then wait for ever. So a longer message is left
      // to MPI (plugins/flat/README.md).
      const size_t index = r.mpi.size();
      r.mpi.push_back(MPI_REQUEST_NULL);
      check(MPI_Irecv(shift(block, first, esize), n, type, peer, kTag, comm_, &r.mpi.back()),
            "MPI_Irecv", c);
      r.expected.push_back({index, n, peer, dtype});
      return;
    }
    r.tag = kTag;
    r.probes.push_back({peer, shift(block, first, esize), n, dtype, op, false});
    ++r.unmatched;
  });
}

void Comm::complete_probed(const mncl_coll_v1_t &c, Request &r, size_t first_request,
                           bool nonblocking) {
  if (nonblocking) {
    progress_probes(r);  // what has arrived already; test() does the rest
    return;
  }
  // Blocking: match every message (polling, as MPI's own waits do), then wait for the data.
  while (!progress_probes(r)) {
  }
  wait_p2p(c, r, first_request, r.expected.size());
  if (!r.mismatch.empty()) {
    throw kit::Error(MNCL_ERR_REMOTE, kit::format("flat %s: %s (do the ranks' counts agree?)",
                                                  describe(c).c_str(), r.mismatch.c_str()));
  }
}

bool Comm::progress_probes(Request &r) {
  const auto fail = [&](int rc, const char *call) {
    if (rc == MPI_SUCCESS) return;
    // Messages of MNCL's point-to-point tag left unreceived would be taken by the next receive
    // from their sender (an operation's own tag, gatherv's, strands nothing).
    const std::string message =
        kit::format("flat %s: %s failed on rank %d of %d: %s", request_name(r).c_str(), call, rank_,
                    size_, mpi_error_text(rc).c_str());
    if (r.tag == kTag && r.unmatched > 0) mark_broken(message);
    throw kit::Error(mpi_error_status(rc), message);
  };
  for (size_t i = 0; i < r.probes.size() && r.unmatched > 0; ++i) {
    Request::Probe &p = r.probes[i];
    // A peer's messages arrive in order, and its probes are adjacent: only its first unmatched
    // one can be matched now.
    if (p.matched || (i > 0 && r.probes[i - 1].peer == p.peer && !r.probes[i - 1].matched)) {
      continue;
    }
    const MPI_Datatype type = mpi_datatype(p.dtype);
    const size_t esize = kit::dtype_size(p.dtype);
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    fail(MPI_Improbe(p.peer, r.tag, comm_, &flag, &message, &status), "MPI_Improbe");
    if (!flag) continue;
    p.matched = true;
    --r.unmatched;
    int got = 0;
    MPI_Get_count(&status, type, &got);
    void *dst = p.dst;
    int n = p.count;
    MPI_Datatype as = type;
    if (got != p.count) {
      // Received all the same (the sender must complete, and nothing may stay in flight), but
      // never past the block: a shorter message into it, anything else into scratch.
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      // A batch reports its first mismatched op in array order, whatever the matching order.
      if (r.mismatch.empty() || p.op < r.mismatch_op) {
        r.mismatch_op = p.op;
        r.mismatch =
            (r.kind == MNCL_COLL_SENDRECV_BATCH ? kit::format("op %zu: ", p.op) : std::string()) +
            (got == MPI_UNDEFINED
                 ? kit::format("rank %d sent %d bytes, not a whole number of %s elements (%d "
                               "expected here)",
                               p.peer, bytes, kit::dtype_name(p.dtype), p.count)
                 : kit::format("rank %d sent %d elements, %d expected here", p.peer, got, p.count));
      }
      if (got != MPI_UNDEFINED && got < p.count) {
        n = got;
      } else if (got != MPI_UNDEFINED) {
        r.drained.emplace_back(static_cast<size_t>(got) * esize);
        dst = r.drained.back().data();
        n = got;
      } else if (bytes != MPI_UNDEFINED) {
        r.drained.emplace_back(static_cast<size_t>(bytes));
        dst = r.drained.back().data();
        n = bytes;
        as = MPI_BYTE;
      } else {
        // A message that fits no int count stays unreceived.
        throw_broken(MNCL_ERR_REMOTE, kit::format("flat %s: %s (do the ranks' counts agree?); the "
                                                  "communicator is unusable",
                                                  request_name(r).c_str(), r.mismatch.c_str()));
      }
    }
    r.mpi.push_back(MPI_REQUEST_NULL);
    fail(MPI_Imrecv(dst, n, as, &message, &r.mpi.back()), "MPI_Imrecv");
  }
  return r.unmatched == 0;
}

std::string Comm::v_device_refusal(const mncl_coll_v1_t &c) const {
  if (!options_.cuda) return "";
  const kit::VLayout v = kit::v_layout(c);
  const size_t n = c.nbufs, big = v_big(size_);
  std::vector<int> counts(n), displs(n);
  bool packs = v_side(v.recvcounts, v.rdispls, n, big, counts.data(), displs.data()).packed;
  if (c.kind == MNCL_COLL_ALLTOALLV) {
    packs = packs || v_side(v.sendcounts, v.sdispls, n, big, counts.data(), displs.data()).packed;
  }
  if (!packs || !(cuda::is_device_pointer(c.sendbuf) || cuda::is_device_pointer(c.recvbuf))) {
    return "";
  }
  return kit::format(
      "flat %s: its blocks on CUDA memory lie more than %d elements apart (MPI's "
      "int displacements), so flat would pack them on the host; use host buffers "
      "or a tighter layout",
      describe(c).c_str(), INT_MAX);
}

}  // namespace mncl::flat

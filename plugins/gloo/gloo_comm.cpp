#include "gloo/gloo_comm.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/types.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>

#include "common/coll.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/host.h"
#include "common/reduce.h"
#include "gloo/gloo_store.h"

namespace mncl::gloo_plugin {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Slot prefixes of our own transfers; Gloo's collectives use 0x01..0x08 (gloo/types.h).
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kP2PSlotPrefix = 0x41;
constexpr uint8_t kShutdownSlotPrefix = 0x42;
// GATHERV / SCATTERV: each block's count as its sender sees it (0x43), its elements (0x44),
// and its count as its receiver sees it (0x45); see post_block().
constexpr uint8_t kBlockCountSlotPrefix = 0x43;
constexpr uint8_t kBlockDataSlotPrefix = 0x44;
constexpr uint8_t kBlockExpectSlotPrefix = 0x45;
// A disagreeing block's acknowledgement, from its non-root end once it has both counts (0x46).
constexpr uint8_t kBlockAckSlotPrefix = 0x46;
// Tag of the barrier that ends comm_create (done before any collective's tag is used).
constexpr uint32_t kCreateBarrierTag = 0xffffffffu;
constexpr int64_t kFallbackTimeoutMs = 300000;

// Gloo writes to its sockets without MSG_NOSIGNAL, so a peer that dies mid-transfer would kill
// this whole process with SIGPIPE instead of failing the collective. Ignore the signal unless
// the application installed its own handler (then EPIPE still reaches Gloo as an error).
void ignore_sigpipe_once(const mncl_host_v1_t *host) {
  static std::once_flag once;
  std::call_once(once, [host] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
      MNCL_KIT_LOG(host, MNCL_LOG_INFO,
                   "gloo: SIGPIPE is now ignored, so a lost peer is an error, not a crash");
    }
  });
}

using kit::kind_name;

using kit::mix64;
using kit::v_total;

// Where blocks with these counts and displacements (elements) lie back to back in rank order,
// as Gloo's allgatherv / alltoallv lay them out: true, with *base the displacement of the
// first non-empty block (0 if none). Empty blocks address nothing, so their displacements
// do not matter.
bool packed_from(const size_t *counts, const size_t *displs, size_t n, size_t *base) {
  *base = 0;
  bool first = true;
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    if (counts[i] == 0) continue;
    if (first) {
      *base = next = displs[i];
      first = false;
    } else if (displs[i] != next) {
      return false;
    }
    next += counts[i];
  }
  return true;
}

// Block `displ` elements of `es` bytes into p; p itself for an empty block (whose displacement
// may be anything).
template <typename P>
P at(P p, size_t displ, size_t count, size_t es) {
  return count == 0 ? p : p + displ * es;
}

// Calls f(T{}) with the unsigned integer type of `size` bytes: Gloo's typed setters only use
// sizeof(T), so data of any dtype travels as unsigned words of its width.
template <typename F>
void with_word(size_t size, F &&f) {
  switch (size) {
    case 1:
      f(uint8_t{});
      break;
    case 2:
      f(uint16_t{});
      break;
    case 4:
      f(uint32_t{});
      break;
    default:
      f(uint64_t{});
      break;
  }
}

using mncl::kit::is_reduction;
using mncl::kit::is_rooted;

// 32-bit digest of what every rank must agree on for one call (issue 9). It is xor-ed into
// every Gloo tag and slot, so ranks that disagree on the call address different slots and
// never exchange bytes: they time out instead of folding another dtype, using another root's
// data, or tripping Gloo's size check in its I/O thread (std::terminate). XOR with the
// sequence number keeps the tags of consecutive calls with the same digest distinct. Two
// different calls share a digest with probability 2^-32: the only way left to a wrong result.
uint32_t call_digest(int32_t kind, int32_t dtype, int32_t op, int32_t root, uint64_t count) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h](uint64_t v) {
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  };
  mix(static_cast<uint32_t>(kind) | static_cast<uint64_t>(static_cast<uint32_t>(dtype)) << 32);
  mix(static_cast<uint32_t>(op) | static_cast<uint64_t>(static_cast<uint32_t>(root)) << 32);
  mix(count);
  h *= 0xc4ceb9fe1a85ec53ull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

// The tag of collective c: its digest (op only for reductions, root only for rooted kinds,
// as in naive's header) mixed with the low 32 bits of seq, identical on every rank.
uint32_t collective_tag(const mncl_coll_v1_t &c) {
  uint64_t count = c.count;
  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    // The total and how it is split into buffers: ranks that split the same total differently
    // (2+3 vs 3+2) would otherwise mix elements across buffers.
    count = 0;
    for (size_t i = 0; i < c.nbufs; ++i) count += c.counts[i];
    count = mix64(count, kit::split_digest(c.counts, c.nbufs));
  }
  if (c.kind == MNCL_COLL_ALLGATHERV) {
    // c.count is this rank's block; every rank must agree on all of recvcounts, which size
    // every message of the ring.
    count = 1;
    for (size_t i = 0; i < c.nbufs; ++i) count = mix64(count, c.counts[i]);
  }
  // gatherv / scatterv: c.count is this rank's own block, so it differs between ranks; each
  // block's count is checked by its receiver instead (gatherv()).
  const bool rooted_v = kit::is_rooted_v_kind(c.kind);
  if (rooted_v) count = 0;
  return static_cast<uint32_t>(c.seq) ^
         call_digest(c.kind, c.dtype, is_reduction(c.kind) ? c.op : -1,
                     is_rooted(c.kind) || rooted_v ? c.root : -1, count);
}

// The slot of a gatherv / scatterv block's elements: the call's tag mixed with the block's
// count, so a receiver that expects another count posts another slot and never takes the
// message (Gloo's TCP transport answers a size mismatch with std::terminate; two counts share
// a slot with probability 2^-32, as two calls share a tag).
uint64_t block_data_slot(uint32_t tag, uint64_t count) {
  return gloo::Slot::build(kBlockDataSlotPrefix, static_cast<uint32_t>(mix64(tag, count)));
}

// Point-to-point: the per-pair message number mixed with count and dtype, so a receive that
// disagrees with the matching send on either times out instead of receiving other bytes.
uint32_t p2p_tag(uint32_t number, const mncl_coll_v1_t &c) {
  return number ^ call_digest(MNCL_COLL_SEND, c.dtype, -1, -1, c.count);
}

bool is_half(int32_t dtype) {
  return dtype == MNCL_FLOAT16 || dtype == MNCL_BFLOAT16;
}

void widen_any(float *dst, const void *src, size_t n, int32_t dtype) {
  if (dtype == MNCL_FLOAT16) {
    kit::widen(dst, static_cast<const kit::float16 *>(src), n);
  } else {
    kit::widen(dst, static_cast<const kit::bfloat16 *>(src), n);
  }
}

void narrow_any(void *dst, const float *src, size_t n, int32_t dtype) {
  if (dtype == MNCL_FLOAT16) {
    kit::narrow(static_cast<kit::float16 *>(dst), src, n);
  } else {
    kit::narrow(static_cast<kit::bfloat16 *>(dst), src, n);
  }
}

// Gloo's new-style reduce function: c = a op b over n elements (c may alias a or b).
// All MNCL ops are commutative, so aliasing b is folded the other way round.
gloo::AllreduceOptions::Func reduce_fn(int32_t dtype, int32_t mop) {
  const size_t es = kit::dtype_size(dtype);
  return [dtype, mop, es](void *c, const void *a, const void *b, size_t n) {
    if (c == a) {
      kit::reduce_into(c, b, n, dtype, mop);
    } else if (c == b) {
      kit::reduce_into(c, a, n, dtype, mop);
    } else {
      std::memcpy(c, a, n * es);
      kit::reduce_into(c, b, n, dtype, mop);
    }
  };
}

// The classic (templated) algorithms take a ReductionFunction<T> holding a plain function.
template <typename T, int32_t D, int32_t O>
void classic_reduce(T *x, const T *y, size_t n) {
  kit::reduce_into(x, y, n, D, O);
}

template <typename T, int32_t D>
const gloo::ReductionFunction<T> *classic_fn_for(int32_t op) {
  static const gloo::ReductionFunction<T> sum(gloo::CUSTOM, &classic_reduce<T, D, MNCL_SUM>);
  static const gloo::ReductionFunction<T> prod(gloo::CUSTOM, &classic_reduce<T, D, MNCL_PROD>);
  static const gloo::ReductionFunction<T> min(gloo::CUSTOM, &classic_reduce<T, D, MNCL_MIN>);
  static const gloo::ReductionFunction<T> max(gloo::CUSTOM, &classic_reduce<T, D, MNCL_MAX>);
  switch (op) {
    case MNCL_PROD:
      return &prod;
    case MNCL_MIN:
      return &min;
    case MNCL_MAX:
      return &max;
    default:
      return &sum;  // SUM, and AVG (a SUM then a division)
  }
}

template <typename T>
const gloo::ReductionFunction<T> *classic_fn(int32_t dtype, int32_t op) {
  // Only dtypes as wide as T can reach here; the others are not even instantiated.
#define MNCL_GLOO_CASE(D)                                                           \
  case D:                                                                           \
    if constexpr (kit::dtype_size(D) == sizeof(T)) return classic_fn_for<T, D>(op); \
    break;
  switch (dtype) {
    MNCL_GLOO_CASE(MNCL_INT8)
    MNCL_GLOO_CASE(MNCL_UINT8)
    MNCL_GLOO_CASE(MNCL_INT32)
    MNCL_GLOO_CASE(MNCL_UINT32)
    MNCL_GLOO_CASE(MNCL_INT64)
    MNCL_GLOO_CASE(MNCL_UINT64)
    MNCL_GLOO_CASE(MNCL_FLOAT16)
    MNCL_GLOO_CASE(MNCL_BFLOAT16)
    MNCL_GLOO_CASE(MNCL_FLOAT32)
    MNCL_GLOO_CASE(MNCL_FLOAT64)
    default:
      break;
  }
#undef MNCL_GLOO_CASE
  throw kit::Error(MNCL_ERR_INTERNAL, "gloo: no reduction for this dtype width");
}

}  // namespace

bool parse_algo(const char *text, Algo *algo) {
  const std::string s = kit::lower(text == nullptr ? "" : text);
  if (s.empty() || s == "auto") {
    *algo = Algo::kAuto;
  } else if (s == "ring") {
    *algo = Algo::kRing;
  } else if (s == "ring_chunked") {
    *algo = Algo::kRingChunked;
  } else if (s == "halving_doubling") {
    *algo = Algo::kHalvingDoubling;
  } else if (s == "bcube") {
    *algo = Algo::kBcube;
  } else {
    return false;
  }
  return true;
}

const char *algo_name(Algo algo) {
  switch (algo) {
    case Algo::kRing:
      return "ring";
    case Algo::kRingChunked:
      return "ring_chunked";
    case Algo::kHalvingDoubling:
      return "halving_doubling";
    case Algo::kBcube:
      return "bcube";
    default:
      return "auto";
  }
}

struct Comm::Op {
  std::string desc;  // "gloo allreduce #12 (1024 x float32, sum)"
  int32_t kind;
  int peer;  // SEND/RECV: the peer; -1 otherwise
  uint32_t tag;
  int64_t timeout_ms;         // the caller's bound
  milliseconds gloo_timeout;  // what Gloo's waits get: the bound, + kGlooBackstop if enforced_
  Clock::time_point deadline;
  bool listed = false;     // in running_ (under mutex_)
  bool timed_out = false;  // set by the watchdog, under mutex_, while the op is listed
};

// What an op that ran out of time reports (and what every op it interrupts quotes).
std::string Comm::timeout_message(const Op &op) {
  const double s = static_cast<double>(op.timeout_ms) / 1000.0;
  if (op.kind == MNCL_COLL_RECV) {
    return kit::format(
        "%s: no message from rank %d within %.1f s (it sent none, or one of "
        "another count or dtype)",
        op.desc.c_str(), op.peer, s);
  }
  if (op.kind == MNCL_COLL_SEND) {
    return kit::format(
        "%s: rank %d did not receive the message within %.1f s (it posted no "
        "receive, or one of another count or dtype)",
        op.desc.c_str(), op.peer, s);
  }
  return kit::format(
      "%s: no progress within %.1f s (a peer stalled, or made a different call: "
      "kind, count, dtype, op and root must agree)",
      op.desc.c_str(), s);
}

// ---------------------------------------------------------------------------------------------
// Creation, destruction, abort
// ---------------------------------------------------------------------------------------------

Comm::Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host, const Settings &settings)
    : host_(host),
      rank_(bs.rank),
      size_(bs.size),
      default_timeout_ms_(bs.timeout_ms > 0 ? bs.timeout_ms : kFallbackTimeoutMs),
      settings_(settings),
      comm_id_(bs.comm_id != nullptr ? bs.comm_id : "?"),
      registry_(std::make_shared<AbortRegistry>()),
      sent_(static_cast<size_t>(bs.size), 0),
      received_(static_cast<size_t>(bs.size), 0) {
  if (size_ == 1) return;  // nothing to connect: every collective is a local copy
  ignore_sigpipe_once(host_);
  device_ = create_device(settings_.transport, registry_);
  // The (TCP) device tracks its buffers, which the watchdog needs to knock.
  enforced_ = true;
  const std::string where = kit::format("gloo comm_create ('%s', rank %d of %d, %s)",
                                        comm_id_.c_str(), rank_, size_, device_->str().c_str());
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    // The pairs keep this as the timeout of the classic algorithms' pinned buffers: with the
    // watchdog in charge it is only a backstop, like every other Gloo timeout.
    context->setTimeout(milliseconds(default_timeout_ms_) +
                        (enforced_ ? kGlooBackstop : milliseconds(0)));
    StoreAdapter store(bs.store, default_timeout_ms_);
    context->connectFullMesh(store, device_);
    context_ = context;
    // A connected pair does not prove the peer has read our address yet (the kernel accepts
    // before the peer's accept()); once everyone is past this barrier, all have.
    gloo::BarrierOptions barrier(context_);
    barrier.setTag(kCreateBarrierTag);
    barrier.setTimeout(milliseconds(default_timeout_ms_));
    gloo::barrier(barrier);
    store.delete_created();
  } catch (const kit::Error &) {
    throw;  // the store callback set the message
  } catch (const gloo::IoException &e) {
    const bool timeout = std::strstr(e.what(), "imeout") || std::strstr(e.what(), "imed out");
    throw kit::Error(
        timeout ? MNCL_ERR_TIMEOUT : MNCL_ERR_BOOTSTRAP,
        kit::format("%s: connecting to the peers failed: %s", where.c_str(), e.what()));
  } catch (const std::bad_alloc &) {
    throw;
  } catch (const std::exception &e) {
    throw kit::Error(MNCL_ERR_BOOTSTRAP,
                     kit::format("%s: rendezvous failed: %s", where.c_str(), e.what()));
  }
  MNCL_KIT_LOG(host_, MNCL_LOG_INFO, "gloo: comm '%s' rank %d of %d connected over %s, algo %s",
               comm_id_.c_str(), rank_, size_, device_->str().c_str(), algo_name(settings_.algo));
  // Last: nothing may throw after it starts (a joinable thread must not be destroyed).
  if (enforced_) watchdog_ = std::thread([this] { watch(); });
}

Comm::~Comm() {
  close();
  context_.reset();  // closes the pairs before their device goes
  device_.reset();
}

// The teardown's waiting part (kit::destroy_comm calls it before freeing): comm_abort from
// another thread ends the final exchange.
void Comm::close() {
  if (closed_) return;
  closed_ = true;
  if (watchdog_.joinable()) {  // no execute() runs any more (comm_destroy is never concurrent)
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
  }
  if (aborted_.load()) return;
  // Counted in flight, so that an abort keeps knocking until the exchange has let go.
  in_flight_.fetch_add(1);
  struct Leave {
    std::atomic<int> &count;
    ~Leave() { count.fetch_sub(1); }
  } leave{in_flight_};
  try {
    if (aborted_.load()) throw kit::Error(MNCL_ERR_ABORTED, "aborted while closing");
    quiesce();
  } catch (const std::exception &e) {
    MNCL_KIT_LOG(host_, MNCL_LOG_WARN,
                 "gloo: comm '%s' rank %d: closing without the final "
                 "exchange: %s",
                 comm_id_.c_str(), rank_, e.what());
  }
}

// Some Gloo algorithms (ring_chunked) return before their last send has left this process, and
// closing the pairs then would cut it off. Every rank sends a token to every peer and waits
// for all tokens in and out: TCP keeps each pair's bytes in order, so every earlier message has
// been delivered when the peer's token arrives, and every peer has its token before we close.
void Comm::quiesce() {
  if (size_ == 1 || !context_) return;
  // One deadline for the whole exchange (the communicator's timeout), not one per token: a
  // late peer after another must not stretch it to (size - 1) timeouts.
  const auto deadline = Clock::now() + milliseconds(default_timeout_ms_);
  const auto left = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  char token = 1;
  std::vector<char> tokens(static_cast<size_t>(size_));
  auto out = context_->createUnboundBuffer(&token, 1);
  auto in = context_->createUnboundBuffer(tokens.data(), tokens.size());
  const uint64_t slot = gloo::Slot::build(kShutdownSlotPrefix, 0);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    in->recv(peer, slot, static_cast<size_t>(peer), 1);
    out->send(peer, slot);
  }
  for (int i = 1; i < size_; ++i) {
    if (!in->waitRecv(left())) throw kit::Error(MNCL_ERR_ABORTED, "aborted while closing");
  }
  for (int i = 1; i < size_; ++i) {
    if (!out->waitSend(left())) throw kit::Error(MNCL_ERR_ABORTED, "aborted while closing");
  }
}

void Comm::abort() {
  aborted_.store(true);
  if (!context_) return;
  registry_->poison(
      "the MNCL communicator was aborted (comm_abort: mncl_comm_abort, or the core's watchdog)");
  knock_until_idle(Clock::now() + milliseconds(default_timeout_ms_));
}

// The poison wakes every pending transfer; a wait on a half-read message or a queued send is
// not reached by it, so keep knocking until every running call has left Gloo. A knocked wait
// returns false; a Gloo collective may ignore that and return normally, which is why finish()
// fails every op that was running when the communicator was aborted or broken.
void Comm::knock_until_idle(Clock::time_point limit) {
  while (in_flight_.load() > 0 && Clock::now() < limit) {
    registry_->abort_waits();
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// Deadlines (TCP): sleeps until the earliest deadline of the running ops. When one passes, the
// op is marked and its timeout recorded as the communicator's failure *before* the context is
// poisoned, so every op woken by the poison finds the cause recorded (see finish()). One
// timeout breaks the communicator, so the watchdog is idle from then on.
void Comm::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Op *due = nullptr;
    if (broken_.empty() && !aborted_.load()) {
      for (Op *op : running_) {
        if (due == nullptr || op->deadline < due->deadline) due = op;
      }
    }
    if (due != nullptr && now >= due->deadline) {
      due->timed_out = true;
      broken_ = timeout_message(*due);
      const std::string why = broken_;
      lock.unlock();  // the ops must be able to leave meanwhile (finish() takes the lock)
      MNCL_KIT_LOG(host_, MNCL_LOG_INFO, "gloo: comm '%s' rank %d: %s", comm_id_.c_str(), rank_,
                   why.c_str());
      registry_->poison("a concurrent MNCL operation timed out: " + why);
      knock_until_idle(Clock::now() + milliseconds(default_timeout_ms_));
      lock.lock();
      continue;
    }
    // Sleep until the earliest deadline. Idle, keep a planned wake-up that is still ahead:
    // ops issued one after the other then register without waking this thread each time
    // (execute() only notifies for a deadline earlier than wake_at_).
    if (due != nullptr) {
      wake_at_ = due->deadline;
    } else if (wake_at_ <= now) {
      wake_at_ = Clock::time_point::max();
    }
    if (wake_at_ == Clock::time_point::max()) {
      cv_.wait(lock);
    } else {
      const Clock::time_point until = wake_at_;  // wait_until reads it again after waking
      cv_.wait_until(lock, until);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dispatch and error mapping
// ---------------------------------------------------------------------------------------------

void Comm::execute(const mncl_coll_v1_t &c) {
  const bool p2p = c.kind == MNCL_COLL_SEND || c.kind == MNCL_COLL_RECV;
  Op op;
  op.kind = c.kind;
  op.peer = p2p ? c.root : -1;
  op.timeout_ms = c.timeout_ms > 0 ? c.timeout_ms : default_timeout_ms_;
  op.gloo_timeout = milliseconds(op.timeout_ms) + (enforced_ ? kGlooBackstop : milliseconds(0));
  op.deadline = Clock::now() + milliseconds(op.timeout_ms);
  op.tag = collective_tag(c);
  const bool reduction = is_reduction(c.kind);
  op.desc = kit::format("gloo %s #%llu", kind_name(c.kind), static_cast<unsigned long long>(c.seq));
  if (c.kind == MNCL_COLL_ALLGATHERV) {
    op.desc += kit::format(" (%zu of %zu x %s)", c.count, v_total(c.counts, c.nbufs),
                           kit::dtype_name(c.dtype));
  } else if (c.kind == MNCL_COLL_ALLTOALLV) {
    const kit::VLayout v = kit::v_layout(c);
    op.desc += kit::format(" (%s, %zu sent, %zu received)", kit::dtype_name(c.dtype),
                           v_total(v.sendcounts, c.nbufs), v_total(v.recvcounts, c.nbufs));
  } else if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    op.desc += kit::format(" (%zu x %s in %zu buffers, %s)", v_total(c.counts, c.nbufs),
                           kit::dtype_name(c.dtype), c.nbufs, kit::op_name(c.op));
  } else if (c.kind != MNCL_COLL_BARRIER) {
    op.desc += kit::format(" (%zu x %s", c.count, kit::dtype_name(c.dtype));
    if (reduction) op.desc += kit::format(", %s", kit::op_name(c.op));
    if (p2p) {
      op.desc += kit::format(", peer %d", c.root);
    } else if (c.root >= 0) {
      op.desc += kit::format(", root %d", c.root);
    }
    op.desc += ")";
  }

  // Raised before the abort check, so an abort racing with the start still waits for us.
  in_flight_.fetch_add(1);
  struct Leave {
    std::atomic<int> &count;
    ~Leave() { count.fetch_sub(1); }
  } leave{in_flight_};
  if (aborted_.load()) {
    throw kit::Error(MNCL_ERR_ABORTED, op.desc + ": the communicator was aborted");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) {
      throw kit::Error(
          MNCL_ERR_REMOTE,
          op.desc + ": the communicator is unusable after an earlier failure: " + broken_);
    }
    if (enforced_) {
      running_.push_back(&op);
      op.listed = true;
      if (op.deadline < wake_at_) cv_.notify_all();
    }
  }
  // finish() unlists the op; this only covers an exception on the way there.
  struct Unlist {
    Comm &comm;
    Op &op;
    ~Unlist() {
      std::lock_guard<std::mutex> lock(comm.mutex_);
      comm.unlist(op);
    }
  } unlist{*this, op};
  if (size_ == 1) {
    run_single_rank(c);
    return;
  }

  mncl_status_t status = MNCL_OK;
  std::string what;
  try {
    run(op, c);
  } catch (const kit::Error &e) {
    status = e.status();
    what = e.what();
  } catch (const std::bad_alloc &) {
    status = MNCL_ERR_SYSTEM;
    what = op.desc + ": out of memory";
  } catch (const gloo::IoException &e) {
    // Gloo's "Application timeout caused pair closure": an op of this context timed out in
    // Gloo (the backstop) and Gloo closed every pair; not this op's own timeout.
    const bool closure = std::strstr(e.what(), "pair closure") != nullptr;
    const bool timeout =
        !closure && (std::strstr(e.what(), "imed out") || std::strstr(e.what(), "imeout"));
    status = timeout ? MNCL_ERR_TIMEOUT : MNCL_ERR_REMOTE;
    // Tags carry the call's digest: a peer in a different call shows up as a timeout.
    what = kit::format("%s: %s: %s", op.desc.c_str(),
                       closure   ? "another operation on this communicator timed out"
                       : timeout ? "no progress within the timeout (a peer stalled, or made a "
                                   "different call: kind, count, dtype, op and root must agree)"
                                 : "connection to a peer lost",
                       e.what());
  } catch (const std::exception &e) {
    // GLOO_ENFORCE failures land here; after an abort they are its side effects.
    status = MNCL_ERR_INTERNAL;
    what = kit::format("%s: gloo error: %s", op.desc.c_str(), e.what());
  } catch (...) {
    status = MNCL_ERR_INTERNAL;
    what = op.desc + ": gloo error: unknown exception";
  }
  finish(op, status, what);
}

void Comm::unlist(Op &op) {
  if (!op.listed) return;
  running_.erase(std::find(running_.begin(), running_.end(), &op));
  op.listed = false;
}

void Comm::finish(Op &op, mncl_status_t status, const std::string &what) {
  enum class End { kOk, kAborted, kTimedOut, kInterrupted, kFailed } end = End::kOk;
  std::string cause;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unlist(op);
    // Out of running_, op.timed_out is final. Order matters: an abort explains everything;
    // then the watchdog's verdict on this op; then a failure recorded by another op, which
    // may have knocked this one's waits even if it seemed to succeed; then our own failure,
    // recorded before the poison so the ops it interrupts find it.
    if (aborted_.load()) {
      end = End::kAborted;
    } else if (op.timed_out) {
      end = End::kTimedOut;
    } else if (!broken_.empty()) {
      end = End::kInterrupted;
      cause = broken_;
    } else if (status != MNCL_OK) {
      end = End::kFailed;
      broken_ = what;
    }
  }
  switch (end) {
    case End::kOk:
      return;
    case End::kAborted:
      throw kit::Error(MNCL_ERR_ABORTED, op.desc + ": the communicator was aborted");
    case End::kTimedOut:
      throw kit::Error(MNCL_ERR_TIMEOUT, timeout_message(op));
    case End::kInterrupted:
      throw kit::Error(MNCL_ERR_REMOTE,
                       op.desc +
                           ": stopped because a concurrent operation on this communicator "
                           "failed: " +
                           cause);
    case End::kFailed:
      // Gloo's state is undefined after a failed op: make the peers fail fast, refuse more work.
      registry_->poison("a peer's MNCL operation failed: " + what);
      throw kit::Error(status, what);
  }
}

void Comm::run(Op &op, const mncl_coll_v1_t &c) {
  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
      if (c.count > 0) allreduce(op, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
      return;
    case MNCL_COLL_ALLREDUCE_COALESCED:
      allreduce_coalesced(op, c);
      return;
    case MNCL_COLL_REDUCE:
      reduce(op, c);
      return;
    case MNCL_COLL_BCAST:
      bcast(op, c);
      return;
    case MNCL_COLL_SCATTER:
      scatter(op, c);
      return;
    case MNCL_COLL_GATHER:
      gather(op, c);
      return;
    case MNCL_COLL_ALLGATHER:
      allgather(op, c);
      return;
    case MNCL_COLL_REDUCE_SCATTER:
      reduce_scatter(op, c);
      return;
    case MNCL_COLL_ALLTOALL:
      alltoall(op, c);
      return;
    case MNCL_COLL_ALLGATHERV:
      allgatherv(op, c);
      return;
    case MNCL_COLL_ALLTOALLV:
      alltoallv(op, c);
      return;
    case MNCL_COLL_GATHERV:
      gatherv(op, c);
      return;
    case MNCL_COLL_SCATTERV:
      scatterv(op, c);
      return;
    case MNCL_COLL_BARRIER:
      barrier(op);
      return;
    case MNCL_COLL_SEND:
      send(op, c);
      return;
    case MNCL_COLL_RECV:
      recv(op, c);
      return;
    default:
      throw kit::Error(
          MNCL_ERR_NOT_SUPPORTED,
          kit::format("%s: collective kind %d is not supported by gloo", op.desc.c_str(), c.kind));
  }
}

// One rank: every collective is the identity (AVG divides by 1), so only copies remain.
void Comm::run_single_rank(const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  auto copy = [](void *dst, const void *src, size_t n) {
    if (n > 0 && dst != src) std::memmove(dst, src, n);
  };
  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
    case MNCL_COLL_REDUCE:
    case MNCL_COLL_SCATTER:
    case MNCL_COLL_GATHER:
    case MNCL_COLL_ALLGATHER:
    case MNCL_COLL_REDUCE_SCATTER:
    case MNCL_COLL_ALLTOALL:
      copy(c.recvbuf, c.sendbuf, bytes);
      return;
    case MNCL_COLL_ALLREDUCE_COALESCED:
      for (size_t i = 0; i < c.nbufs; ++i) {
        copy(c.recvbufs[i], c.sendbufs[i], c.counts[i] * kit::dtype_size(c.dtype));
      }
      return;
    case MNCL_COLL_ALLGATHERV: {  // in place: the block is already at its displacement
      const kit::VLayout v = kit::v_layout(c);
      const size_t es = kit::dtype_size(c.dtype);
      copy(at(static_cast<char *>(c.recvbuf), v.rdispls[0], c.count, es), c.sendbuf, bytes);
      return;
    }
    case MNCL_COLL_ALLTOALLV: {
      const kit::VLayout v = kit::v_layout(c);
      const size_t es = kit::dtype_size(c.dtype), n = v.recvcounts[0];
      copy(at(static_cast<char *>(c.recvbuf), v.rdispls[0], n, es),
           at(static_cast<const char *>(c.sendbuf), v.sdispls[0], n, es), n * es);
      return;
    }
    case MNCL_COLL_GATHERV:
    case MNCL_COLL_SCATTERV: {  // in place: the block is already at its displacement
      const kit::RootedVLayout v = kit::rooted_v_layout(c);
      const size_t es = kit::dtype_size(c.dtype);
      if (c.kind == MNCL_COLL_GATHERV) {
        copy(at(static_cast<char *>(c.recvbuf), v.displs[0], c.count, es), c.sendbuf, bytes);
      } else {
        copy(c.recvbuf, at(static_cast<const char *>(c.sendbuf), v.displs[0], c.count, es), bytes);
      }
      return;
    }
    case MNCL_COLL_BCAST:
    case MNCL_COLL_BARRIER:
      return;
    default:
      throw kit::Error(
          MNCL_ERR_INVALID_ARGUMENT,
          kit::format("gloo %s: no peer exists in a communicator of one rank", kind_name(c.kind)));
  }
}

// A wait that returns false was knocked by abort() or by the watchdog; finish() says which.
void Comm::wait_recv(Op &op, gloo::transport::UnboundBuffer &buf, int peer) {
  if (!buf.waitRecv(op.gloo_timeout)) {
    throw kit::Error(MNCL_ERR_ABORTED, kit::format("%s: interrupted while receiving from rank %d",
                                                   op.desc.c_str(), peer));
  }
}

void Comm::wait_send(Op &op, gloo::transport::UnboundBuffer &buf, int peer) {
  if (!buf.waitSend(op.gloo_timeout)) {
    throw kit::Error(MNCL_ERR_ABORTED, kit::format("%s: interrupted while sending to rank %d",
                                                   op.desc.c_str(), peer));
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

void Comm::allreduce(Op &op, const void *in, void *out, size_t count, int32_t dtype, int32_t mop) {
  const int32_t fold = mop == MNCL_AVG ? MNCL_SUM : mop;
  if (is_half(dtype)) {
    std::vector<float> wide(count);
    widen_any(wide.data(), in, count, dtype);
    allreduce_plain(op, wide.data(), wide.data(), count, MNCL_FLOAT32, fold);
    if (mop == MNCL_AVG) {
      const float d = static_cast<float>(size_);
      for (auto &x : wide) x /= d;
    }
    narrow_any(out, wide.data(), count, dtype);
    return;
  }
  allreduce_plain(op, in, out, count, dtype, fold);
  if (mop == MNCL_AVG) kit::finish_avg(out, count, dtype, size_);
}

void Comm::allreduce_plain(Op &op, const void *in, void *out, size_t count, int32_t dtype,
                           int32_t mop) {
  const size_t es = kit::dtype_size(dtype);
  const size_t bytes = count * es;
  Algo algo = settings_.algo;
  if (algo == Algo::kAuto) {
    const bool pow2 = (size_ & (size_ - 1)) == 0;
    algo = (bytes <= kSmallAllreduceBytes && size_ > 2 && pow2) ? Algo::kBcube : Algo::kRing;
  }
  // The classic algorithms count elements, and bytes, in an int (ring_chunked also adds its
  // chunk count to the element count): past that, ring. With a margin for those additions.
  if ((algo == Algo::kRingChunked || algo == Algo::kHalvingDoubling) &&
      bytes > static_cast<size_t>(INT_MAX) - 1024 * static_cast<size_t>(size_)) {
    algo = Algo::kRing;
  }

  if (algo == Algo::kRing || algo == Algo::kBcube) {
    gloo::AllreduceOptions opts(context_);
    opts.setAlgorithm(algo == Algo::kBcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                                           : gloo::AllreduceOptions::Algorithm::RING);
    with_word(es, [&](auto word) {
      using T = decltype(word);
      if (in != out) opts.setInput(const_cast<T *>(static_cast<const T *>(in)), count);
      opts.setOutput(static_cast<T *>(out), count);
    });
    opts.setReduceFunction(reduce_fn(dtype, mop));
    opts.setTag(op.tag);
    opts.setTimeout(op.gloo_timeout);
    gloo::allreduce(opts);
    return;
  }

  // Classic algorithms (MNCL_GLOO_ALGO=ring_chunked|halving_doubling): in place on the output,
  // pinned buffers that time out with their pairs (comm default + kGlooBackstop; the watchdog
  // enforces the op's own bound).
  // They take no tag (their slots come from context->nextSlot(), a plain counter only this
  // lane uses) and send their first chunks before the peers have registered a buffer for
  // them; a rank reads nothing else on that connection until it has. So first a barrier
  // tagged with the call's digest: every rank is in this very call before any chunk moves,
  // and ranks that disagree on count or dtype time out here instead of exchanging
  // mismatched buffers (and a p2p message never waits behind chunks of a collective its
  // receiver has not reached: see Threading in gloo_comm.h).
  barrier(op);
  if (in != out) std::memcpy(out, in, bytes);
  with_word(es, [&](auto word) {
    using T = decltype(word);
    const std::vector<T *> ptrs{static_cast<T *>(out)};
    const gloo::ReductionFunction<T> *fn = classic_fn<T>(dtype, mop);
    if (algo == Algo::kRingChunked) {
      gloo::AllreduceRingChunked<T> a(context_, ptrs, static_cast<int>(count), fn);
      a.run();
    } else {
      gloo::AllreduceHalvingDoubling<T> a(context_, ptrs, static_cast<int>(count), fn);
      a.run();
    }
  });
}

void Comm::allreduce_coalesced(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  size_t total = 0;
  for (size_t i = 0; i < c.nbufs; ++i) total += c.counts[i];
  if (total == 0) return;
  // One message instead of nbufs: the "flat" packing (small buffers are latency bound).
  std::vector<unsigned char> packed(total * es);
  size_t off = 0;
  for (size_t i = 0; i < c.nbufs; ++i) {
    if (c.counts[i] > 0) std::memcpy(packed.data() + off, c.sendbufs[i], c.counts[i] * es);
    off += c.counts[i] * es;
  }
  allreduce(op, packed.data(), packed.data(), total, c.dtype, c.op);
  off = 0;
  for (size_t i = 0; i < c.nbufs; ++i) {
    if (c.counts[i] > 0) std::memcpy(c.recvbufs[i], packed.data() + off, c.counts[i] * es);
    off += c.counts[i] * es;
  }
}

void Comm::reduce(Op &op, const mncl_coll_v1_t &c) {
  if (c.count == 0) return;
  const bool root = rank_ == c.root;
  const int32_t fold = c.op == MNCL_AVG ? MNCL_SUM : c.op;
  int32_t dtype = c.dtype;
  const void *in = c.sendbuf;
  void *out = root ? c.recvbuf : nullptr;
  std::vector<float> wide;
  std::vector<unsigned char> scratch;
  if (is_half(c.dtype)) {
    wide.resize(c.count);
    widen_any(wide.data(), c.sendbuf, c.count, c.dtype);
    in = out = wide.data();
    dtype = MNCL_FLOAT32;
  } else if (!root) {
    // Gloo's ring reduce uses the output as working space on every rank.
    scratch.resize(c.count * kit::dtype_size(dtype));
    out = scratch.data();
  }
  gloo::ReduceOptions opts(context_);
  with_word(kit::dtype_size(dtype), [&](auto word) {
    using T = decltype(word);
    if (in != out) opts.setInput(const_cast<T *>(static_cast<const T *>(in)), c.count);
    opts.setOutput(static_cast<T *>(out), c.count);
  });
  opts.setRoot(c.root);
  opts.setReduceFunction(reduce_fn(dtype, fold));
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::reduce(opts);
  if (!root) return;
  if (is_half(c.dtype)) {
    if (c.op == MNCL_AVG) {
      const float d = static_cast<float>(size_);
      for (auto &x : wide) x /= d;
    }
    narrow_any(c.recvbuf, wide.data(), c.count, c.dtype);
  } else if (c.op == MNCL_AVG) {
    kit::finish_avg(c.recvbuf, c.count, c.dtype, size_);
  }
}

void Comm::reduce_scatter(Op &op, const mncl_coll_v1_t &c) {
  if (c.count == 0) return;
  const size_t n = c.count * static_cast<size_t>(size_);
  const int32_t fold = c.op == MNCL_AVG ? MNCL_SUM : c.op;
  if (is_half(c.dtype)) {
    std::vector<float> acc(n);
    widen_any(acc.data(), c.sendbuf, n, c.dtype);
    reduce_scatter_ring(op, acc.data(), c.count, MNCL_FLOAT32, fold);
    float *mine = acc.data() + static_cast<size_t>(rank_) * c.count;
    if (c.op == MNCL_AVG) {
      for (size_t i = 0; i < c.count; ++i) mine[i] /= static_cast<float>(size_);
    }
    narrow_any(c.recvbuf, mine, c.count, c.dtype);
    return;
  }
  const size_t es = kit::dtype_size(c.dtype);
  // The ring folds into a copy: sendbuf is const, and recvbuf may be inside it (in place).
  std::vector<unsigned char> acc(n * es);
  std::memcpy(acc.data(), c.sendbuf, acc.size());
  reduce_scatter_ring(op, acc.data(), c.count, c.dtype, fold);
  std::memcpy(c.recvbuf, acc.data() + static_cast<size_t>(rank_) * c.count * es, c.count * es);
  if (c.op == MNCL_AVG) kit::finish_avg(c.recvbuf, c.count, c.dtype, size_);
}

// Ring reduce-scatter over `size` blocks of block_count elements held in acc. Step s sends
// block (rank-s-1) to the right and folds block (rank-s-2) from the left into acc; after
// size-1 steps block `rank` holds the reduction over all ranks.
void Comm::reduce_scatter_ring(Op &op, void *acc, size_t block_count, int32_t dtype, int32_t mop) {
  const size_t es = kit::dtype_size(dtype);
  const size_t block = block_count * es;
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, op.tag);
  std::vector<unsigned char> tmp(block);
  auto acc_buf = context_->createUnboundBuffer(acc, block * static_cast<size_t>(size_));
  auto tmp_buf = context_->createUnboundBuffer(tmp.data(), block);
  auto *bytes = static_cast<unsigned char *>(acc);
  auto block_of = [&](int k) { return static_cast<size_t>(((k % size_) + size_) % size_); };
  for (int s = 0; s < size_ - 1; ++s) {
    const size_t send_block = block_of(rank_ - s - 1);
    const size_t recv_block = block_of(rank_ - s - 2);
    tmp_buf->recv(left, slot, 0, block);
    acc_buf->send(right, slot, send_block * block, block);
    wait_recv(op, *tmp_buf, left);
    kit::reduce_into(bytes + recv_block * block, tmp.data(), block_count, dtype, mop);
    wait_send(op, *acc_buf, right);
  }
}

// ---------------------------------------------------------------------------------------------
// Data movement (as bytes)
// ---------------------------------------------------------------------------------------------

void Comm::bcast(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  if (bytes == 0) return;
  gloo::BroadcastOptions opts(context_);
  opts.setOutput(static_cast<uint8_t *>(c.recvbuf), bytes);
  opts.setRoot(c.root);
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::broadcast(opts);
}

void Comm::scatter(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  if (bytes == 0) return;
  gloo::ScatterOptions opts(context_);
  auto *out = static_cast<uint8_t *>(c.recvbuf);
  std::vector<uint8_t> scratch;
  if (rank_ == c.root) {
    std::vector<uint8_t *> ins(static_cast<size_t>(size_));
    auto *base = static_cast<uint8_t *>(const_cast<void *>(c.sendbuf));
    for (int r = 0; r < size_; ++r) ins[static_cast<size_t>(r)] = base + r * bytes;
    opts.setInputs(ins, bytes);
    // In place: the root's block is already where it belongs; avoid a self-memcpy.
    if (out == ins[static_cast<size_t>(rank_)]) {
      scratch.resize(bytes);
      out = scratch.data();
    }
  }
  opts.setOutput(out, bytes);
  opts.setRoot(c.root);
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::scatter(opts);
}

void Comm::gather(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  if (bytes == 0) return;
  gloo::GatherOptions opts(context_);
  auto *in = static_cast<uint8_t *>(const_cast<void *>(c.sendbuf));
  std::vector<uint8_t> scratch;
  if (rank_ == c.root) {
    auto *out = static_cast<uint8_t *>(c.recvbuf);
    if (in == out + rank_ * bytes) {  // in place: Gloo would memcpy the block onto itself
      scratch.assign(in, in + bytes);
      in = scratch.data();
    }
    opts.setOutput(out, bytes * static_cast<size_t>(size_));
  }
  opts.setInput(in, bytes);
  opts.setRoot(c.root);
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::gather(opts);
}

void Comm::allgather(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  if (bytes == 0) return;
  gloo::AllgatherOptions opts(context_);
  auto *out = static_cast<uint8_t *>(c.recvbuf);
  auto *in = static_cast<uint8_t *>(const_cast<void *>(c.sendbuf));
  if (in != out + rank_ * bytes) opts.setInput(in, bytes);  // no input: in place
  opts.setOutput(out, bytes * static_cast<size_t>(size_));
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::allgather(opts);
}

void Comm::alltoall(Op &op, const mncl_coll_v1_t &c) {
  const size_t total = c.count * kit::dtype_size(c.dtype) * static_cast<size_t>(size_);
  if (total == 0) return;
  auto *in = static_cast<uint8_t *>(const_cast<void *>(c.sendbuf));
  std::vector<uint8_t> scratch;
  if (in == c.recvbuf) {  // in place: Gloo reads and writes different buffers
    scratch.assign(in, in + total);
    in = scratch.data();
  }
  gloo::AlltoallOptions opts(context_);
  opts.setInput(in, total);
  opts.setOutput(static_cast<uint8_t *>(c.recvbuf), total);
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::alltoall(opts);
}

// gloo::allgatherv: a ring of size-1 steps over the packed blocks (an empty one is still a
// message, so that no rank waits for a step the others skip). Gloo's layout is the blocks back
// to back in rank order; recvbuf is used as is when its blocks lie that way, else through a
// packed scratch buffer whose blocks are then copied to their displacements, so elements
// between blocks are never written. In place, this rank's block is already where it belongs.
void Comm::allgatherv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
  const kit::VLayout v = kit::v_layout(c);
  std::vector<size_t> bytes(n), offsets(n);  // Gloo's layout, in bytes (uint8_t elements)
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    bytes[i] = v.recvcounts[i] * es;
    offsets[i] = total;
    total += bytes[i];
  }
  auto *recv = static_cast<uint8_t *>(c.recvbuf);
  auto *send = static_cast<uint8_t *>(const_cast<void *>(c.sendbuf));  // Gloo only reads it
  const bool in_place = bytes[me] != 0 && send == recv + v.rdispls[me] * es;
  size_t base = 0;
  const bool packed = packed_from(v.recvcounts, v.rdispls, n, &base);
  std::vector<uint8_t> scratch;
  uint8_t none = 0;  // Gloo's buffers want an address even when every block is empty
  uint8_t *out = &none;
  if (packed && total > 0) {
    out = recv + base * es;
  } else if (total > 0) {
    scratch.resize(total);
    out = scratch.data();
  }
  gloo::AllgathervOptions opts(context_);
  // Without an input Gloo takes this rank's block to be in the output already.
  if (bytes[me] != 0 && !(packed && in_place)) opts.setInput(send, bytes[me]);
  opts.setOutput(out, bytes);
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::allgatherv(opts);
  if (packed) return;
  for (size_t i = 0; i < n; ++i) {
    if (bytes[i] == 0 || (i == me && in_place)) continue;
    std::memcpy(recv + v.rdispls[i] * es, scratch.data() + offsets[i], bytes[i]);
  }
}

// Rank i's sendcounts[j] must equal rank j's recvcounts[i] before any data moves: Gloo would
// hand a message of another size to its receiver's buffer (std::terminate in its I/O thread).
// No rank can check that alone, and every rank must reach the same verdict, so each adds up
// a hash of (i, j, count) over its sends and over its receives, and one allreduce sums both
// over the ranks: the totals are equal when every pair agrees (a false match has probability
// about 2^-64). When they differ, every rank knows, and a gather of all counts names a pair.
void Comm::check_alltoallv_counts(Op &op, const mncl_coll_v1_t &c) {
  const size_t n = static_cast<size_t>(size_);
  const kit::VLayout v = kit::v_layout(c);
  uint64_t sums[2];
  kit::v_pair_sums(c, rank_, sums);
  allreduce_plain(op, sums, sums, 2, MNCL_UINT64, MNCL_SUM);
  if (sums[0] == sums[1]) return;
  std::vector<uint64_t> mine(2 * n), all(2 * n * n);
  for (size_t j = 0; j < n; ++j) {
    mine[j] = v.sendcounts[j];
    mine[n + j] = v.recvcounts[j];
  }
  gloo::AllgatherOptions gather(context_);
  gather.setInput(mine.data(), mine.size());
  gather.setOutput(all.data(), all.size());
  gather.setTag(op.tag);
  gather.setTimeout(op.gloo_timeout);
  gloo::allgather(gather);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const uint64_t sent = all[i * 2 * n + j], expected = all[j * 2 * n + n + i];
      if (sent == expected) continue;
      throw kit::Error(MNCL_ERR_REMOTE,
                       kit::format("%s: rank %zu sends %llu elements to rank %zu, which expects "
                                   "%llu (sendcounts and recvcounts must agree across the ranks)",
                                   op.desc.c_str(), i, static_cast<unsigned long long>(sent), j,
                                   static_cast<unsigned long long>(expected)));
    }
  }
  throw kit::Error(MNCL_ERR_REMOTE, op.desc + ": the ranks' sendcounts and recvcounts disagree");
}

// After check_alltoallv_counts, gloo::alltoallv: this rank's block copied locally, one message
// per peer each way (empty ones too). Gloo packs both sides in rank order; a side whose
// displacements differ goes through a packed scratch buffer (send blocks may overlap; receive
// blocks are copied to their displacements afterwards, leaving the gaps untouched).
void Comm::alltoallv(Op &op, const mncl_coll_v1_t &c) {
  check_alltoallv_counts(op, c);
  const size_t es = kit::dtype_size(c.dtype);
  const size_t n = static_cast<size_t>(size_);
  const kit::VLayout v = kit::v_layout(c);
  std::vector<int64_t> send_elems(n), recv_elems(n);  // Gloo's layout, in bytes
  std::vector<size_t> recv_offsets(n);
  size_t send_total = 0, recv_total = 0;
  for (size_t i = 0; i < n; ++i) {
    send_elems[i] = static_cast<int64_t>(v.sendcounts[i] * es);
    recv_elems[i] = static_cast<int64_t>(v.recvcounts[i] * es);
    recv_offsets[i] = recv_total;
    send_total += v.sendcounts[i] * es;
    recv_total += v.recvcounts[i] * es;
  }
  const auto *send = static_cast<const uint8_t *>(c.sendbuf);
  auto *recv = static_cast<uint8_t *>(c.recvbuf);
  uint8_t none[2] = {0, 0};  // Gloo's buffers want an address even when every block is empty
  std::vector<uint8_t> send_scratch, recv_scratch;

  size_t base = 0;
  auto *in = &none[0];
  if (send_total > 0 && packed_from(v.sendcounts, v.sdispls, n, &base)) {
    in = const_cast<uint8_t *>(send) + base * es;  // Gloo only reads it
  } else if (send_total > 0) {
    send_scratch.resize(send_total);
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t b = v.sendcounts[i] * es;
      if (b > 0) std::memcpy(send_scratch.data() + off, send + v.sdispls[i] * es, b);
      off += b;
    }
    in = send_scratch.data();
  }
  auto *out = &none[1];
  const bool packed_out = packed_from(v.recvcounts, v.rdispls, n, &base);
  if (recv_total > 0 && packed_out) {
    out = recv + base * es;
  } else if (recv_total > 0) {
    recv_scratch.resize(recv_total);
    out = recv_scratch.data();
  }

  gloo::AlltoallvOptions opts(context_);
  opts.setInput(in, send_elems);
  opts.setOutput(out, recv_elems);
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::alltoallv(opts);
  if (recv_scratch.empty()) return;
  for (size_t i = 0; i < n; ++i) {
    const size_t b = v.recvcounts[i] * es;
    if (b > 0) std::memcpy(recv + v.rdispls[i] * es, recv_scratch.data() + recv_offsets[i], b);
  }
}

// GATHERV and SCATTERV move only the root's blocks: each block travels from its sender to its
// receiver, straight from and into the caller's buffers, with both ends' counts of it: the
// sender posts its count (8 bytes, slot 0x43 + the call's tag) and, unless that count is 0, the
// elements (slot 0x44 + the tag mixed with the count, block_data_slot()); the receiver posts the
// count it expects (slot 0x45 + the tag) and a receive for that many elements. The tag carries
// kind, dtype, root and seq, so ranks in different calls never match and time out. A block of
// another count than its receiver expects never lands (another slot: no write outside a block),
// and each end, comparing the other's count with its own before it waits for the elements,
// fails with MNCL_ERR_REMOTE naming both ranks and both counts: the sender of a block that can
// never be taken learns why from the receiver's count, not from the closed connection of the
// receiver's poison (a plain "connection to a peer lost"). Each end posts its receive of the
// other's count before its own count, so when an end has the other's count, its own is on its
// way (the other end's receive notice came first on the pair); a failing end waits until its
// count has left, and the root until the other end has acknowledged it (acknowledge_disagreement),
// before it fails and poisons the context. Empty blocks send their count, so no
// end waits out its timeout for a block of 0.
void Comm::post_block(Op &op, int peer, bool source, void *data, size_t count, size_t es,
                      Block &b) {
  b.peer = peer;
  b.source = source;
  b.mine = count;
  b.theirs = 0;
  b.in = context_->createUnboundBuffer(&b.theirs, sizeof b.theirs);
  b.in->recv(peer,
             gloo::Slot::build(source ? kBlockExpectSlotPrefix : kBlockCountSlotPrefix, op.tag));
  b.out = context_->createUnboundBuffer(&b.mine, sizeof b.mine);
  b.out->send(peer,
              gloo::Slot::build(source ? kBlockCountSlotPrefix : kBlockExpectSlotPrefix, op.tag));
  if (count == 0) return;
  b.data = context_->createUnboundBuffer(data, count * es);  // a sender's is only read
  if (source) {
    b.data->send(peer, block_data_slot(op.tag, count));
  } else {
    b.data->recv(peer, block_data_slot(op.tag, count));
  }
}

std::string Comm::settle_counts(Op &op, Block &b, bool gatherv) {
  wait_recv(op, *b.in, b.peer);
  wait_send(op, *b.out, b.peer);
  if (b.theirs == b.mine) return "";
  const int from = b.source ? rank_ : b.peer, to = b.source ? b.peer : rank_;
  const int owner = gatherv ? from : to;  // the non-root whose block this is
  acknowledge_disagreement(op, b, owner == rank_);
  return kit::format(
      "rank %d sends %llu elements to rank %d, which expects %llu (does rank "
      "%d's count agree with the root's %s[%d]?)",
      from, static_cast<unsigned long long>(b.source ? b.mine : b.theirs), to,
      static_cast<unsigned long long>(b.source ? b.theirs : b.mine), owner,
      gatherv ? "recvcounts" : "sendcounts", owner);
}

void Comm::move_data(Op &op, Block &b) {
  if (!b.data) return;
  if (b.source) {
    wait_send(op, *b.data, b.peer);
  } else {
    wait_recv(op, *b.data, b.peer);
  }
}

// A count that has left has not been read yet: the root fails, and closes its connections,
// only once the non-root end of a disagreeing block has both counts, which it says with one
// byte. Without it the root's close once reached rank 1 before rank 1 had read the root's count
// (fault.mismatch.scatterv_large.gloo.np4, once, on a loaded machine): rank 1 then failed with
// a plain "connection to a peer lost" instead of naming the counts. Either end already knows
// the disagreement: a failed acknowledgement only means the other end failed first, and is not
// this end's error.
void Comm::acknowledge_disagreement(Op &op, Block &b, bool non_root) {
  uint8_t ack = 1;
  auto buf = context_->createUnboundBuffer(&ack, sizeof ack);
  const uint64_t slot = gloo::Slot::build(kBlockAckSlotPrefix, op.tag);
  try {
    if (non_root) {
      buf->send(b.peer, slot);
      wait_send(op, *buf, b.peer);
    } else {
      buf->recv(b.peer, slot);
      wait_recv(op, *buf, b.peer);
    }
  } catch (const std::exception &) {
  }
}

// The root's side of either kind: every block's counts first (and each disagreement's
// acknowledgement, so no disagreeing rank waits on other blocks' data), then the data of the
// blocks that agree, then the first disagreement, if any. Every rank whose count disagrees
// learns it from the root's count.
void Comm::finish_root_blocks(Op &op, std::vector<Block> &blocks, bool gatherv) {
  std::string first;
  int disagree = 0;
  std::vector<bool> agreed(static_cast<size_t>(size_), false);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    std::string why = settle_counts(op, blocks[static_cast<size_t>(p)], gatherv);
    agreed[static_cast<size_t>(p)] = why.empty();
    if (!why.empty() && disagree++ == 0) first = std::move(why);
  }
  for (int p = 0; p < size_; ++p) {
    if (agreed[static_cast<size_t>(p)]) move_data(op, blocks[static_cast<size_t>(p)]);
  }
  if (disagree == 0) return;
  throw kit::Error(
      MNCL_ERR_REMOTE,
      kit::format(
          "%s: %s%s", op.desc.c_str(), first.c_str(),
          disagree > 1 ? kit::format("; %d blocks disagree in all", disagree).c_str() : ""));
}

// A non-root's one block (with the root).
void Comm::finish_own_block(Op &op, Block &b, bool gatherv) {
  const std::string why = settle_counts(op, b, gatherv);
  if (!why.empty()) throw kit::Error(MNCL_ERR_REMOTE, op.desc + ": " + why);
  move_data(op, b);
}

// GATHERV: every other rank sends the root its block (see post_block); the root posts every
// block at once, at recvbuf + displs[src], and copies its own (none in place).
void Comm::gatherv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  if (rank_ != c.root) {
    Block b;
    post_block(op, c.root, true, const_cast<void *>(c.sendbuf), c.count, es, b);  // only read
    finish_own_block(op, b, true);
    return;
  }
  const kit::RootedVLayout v = kit::rooted_v_layout(c);  // counts checked by the core
  auto *recv = static_cast<char *>(c.recvbuf);
  std::vector<Block> blocks(static_cast<size_t>(size_));  // never resized: Gloo holds &mine
  for (int src = 0; src < size_; ++src) {
    if (src == rank_) continue;
    post_block(op, src, false, at(recv, v.displs[src], v.counts[src], es), v.counts[src], es,
               blocks[static_cast<size_t>(src)]);
  }
  char *own = at(recv, v.displs[rank_], c.count, es);
  if (c.count > 0 && own != c.sendbuf) std::memcpy(own, c.sendbuf, c.count * es);
  finish_root_blocks(op, blocks, true);
}

// SCATTERV: the root sends every other rank its block (send blocks may overlap: Gloo only
// reads them) and copies its own (none in place).
void Comm::scatterv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  if (rank_ != c.root) {
    Block b;
    post_block(op, c.root, false, c.recvbuf, c.count, es, b);
    finish_own_block(op, b, false);
    return;
  }
  const kit::RootedVLayout v = kit::rooted_v_layout(c);  // counts checked by the core
  auto *send = const_cast<char *>(static_cast<const char *>(c.sendbuf));  // only read
  std::vector<Block> blocks(static_cast<size_t>(size_));  // never resized: Gloo holds &mine
  for (int dst = 0; dst < size_; ++dst) {
    if (dst == rank_) continue;
    post_block(op, dst, true, at(send, v.displs[dst], v.counts[dst], es), v.counts[dst], es,
               blocks[static_cast<size_t>(dst)]);
  }
  const char *own = at(send, v.displs[rank_], c.count, es);
  if (c.count > 0 && own != c.recvbuf) std::memcpy(c.recvbuf, own, c.count * es);
  finish_root_blocks(op, blocks, false);
}

void Comm::barrier(Op &op) {
  gloo::BarrierOptions opts(context_);
  opts.setTag(op.tag);
  opts.setTimeout(op.gloo_timeout);
  gloo::barrier(opts);
}

// Zero-element messages travel too (0 bytes, under their own message number): an empty
// message still matches one call (mncl.h), and skipping it would line the pair's next message
// up with the wrong call; its count in the tag makes an empty send against a non-empty recv
// time out like any other mismatch. Gloo wants an address even for 0 bytes.
void Comm::send(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  const int peer = c.root;
  const uint64_t slot =
      gloo::Slot::build(kP2PSlotPrefix, p2p_tag(sent_[static_cast<size_t>(peer)]++, c));
  uint8_t none = 0;
  void *data = bytes > 0 ? const_cast<void *>(c.sendbuf) : &none;  // Gloo only reads it
  auto buf = context_->createUnboundBuffer(data, bytes);
  buf->send(peer, slot);
  wait_send(op, *buf, peer);
}

void Comm::recv(Op &op, const mncl_coll_v1_t &c) {
  const size_t bytes = c.count * kit::dtype_size(c.dtype);
  const int peer = c.root;
  const uint64_t slot =
      gloo::Slot::build(kP2PSlotPrefix, p2p_tag(received_[static_cast<size_t>(peer)]++, c));
  uint8_t none = 0;
  auto buf = context_->createUnboundBuffer(bytes > 0 ? c.recvbuf : &none, bytes);
  buf->recv(peer, slot);
  wait_recv(op, *buf, peer);
}

}  // namespace mncl::gloo_plugin

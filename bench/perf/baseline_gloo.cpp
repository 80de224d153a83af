// The raw Gloo baseline: Gloo's own collectives on a Gloo context of the same ranks, on the same
// buffers. The context is rendezvoused through a gloo::rendezvous::FileStore in a temporary
// directory that rank 0 creates and names to the others through MNCL (so: ranks on one host,
// or a shared /tmp). Allreduce runs the algorithm the gloo plugin runs, so the ratio measures
// MNCL, not an algorithm choice: by default bcube up to 64 KiB on a power-of-two size above 2,
// ring otherwise; MNCL_GLOO_ALGO=ring|bcube forces one of those, and
// MNCL_GLOO_ALGO=ring_chunked|halving_doubling Gloo's classic gloo::AllreduceRingChunked /
// gloo::AllreduceHalvingDoubling, in place on the output after a copy of the input when out of
// place, constructed for each call as the plugin does (past INT_MAX bytes, where their int
// counts end, ring, as the plugin). The plugin also runs a barrier before each classic call (its
// own need: a cross-rank argument check, and keeping its point-to-point messages clear of the
// classic algorithms' untagged chunks); a raw Gloo user running one allreduce after another has
// no such need, so it stays out of the raw column and MNCL/raw shows what it costs. Sendrecv posts
// Gloo's unbound-buffer receive and send and waits for both, the calls the gloo plugin makes for
// mncl_irecv/isend. Allgatherv and alltoallv call gloo::allgatherv / gloo::alltoallv directly:
// mncl-perf's blocks are packed in rank order, which is Gloo's own layout, so no copy is involved
// (the plugin adds its cross-rank count check to alltoallv, which this baseline has no need for).
// Gloo has no gatherv or scatterv: their raw column is N/A, as reduce_scatter's.
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "baseline.h"
#include "util.h"

namespace mncl::perf {

namespace {

using Func = gloo::AllreduceOptions::Func;

// Slot prefix of the sendrecv messages; the context runs nothing else that uses it.
constexpr uint8_t kSendrecvSlotPrefix = 0x7e;

template <typename T>
Func func_for(mncl_op_t op) {
  using Fn = void (*)(void *, const void *, const void *, size_t);
  switch (op) {
    case MNCL_SUM:
      return static_cast<Fn>(&gloo::sum<T>);
    case MNCL_PROD:
      return static_cast<Fn>(&gloo::product<T>);
    case MNCL_MIN:
      return static_cast<Fn>(&gloo::min<T>);
    case MNCL_MAX:
      return static_cast<Fn>(&gloo::max<T>);
    case MNCL_AVG:
      break;  // Gloo has no average
  }
  return nullptr;
}

// Calls f(T{}) with the C++ type of dtype d among those Gloo's typed functions take; false
// for the others (16-bit floats: Gloo's float16 only, no bfloat16).
template <typename F>
bool with_gloo_type(mncl_dtype_t d, F &&f) {
  switch (d) {
    case MNCL_INT8:
      f(int8_t{});
      return true;
    case MNCL_UINT8:
      f(uint8_t{});
      return true;
    case MNCL_INT32:
      f(int32_t{});
      return true;
    case MNCL_UINT32:
      f(uint32_t{});
      return true;
    case MNCL_INT64:
      f(int64_t{});
      return true;
    case MNCL_UINT64:
      f(uint64_t{});
      return true;
    case MNCL_FLOAT32:
      f(float{});
      return true;
    case MNCL_FLOAT64:
      f(double{});
      return true;
    default:
      return false;
  }
}

Func reduce_func(mncl_dtype_t d, mncl_op_t op) {
  Func fn = nullptr;
  with_gloo_type(d, [&](auto t) { fn = func_for<decltype(t)>(op); });
  return fn;
}

// Gloo's own element-wise functions for its classic algorithms.
template <typename T>
const gloo::ReductionFunction<T> *classic_fn(mncl_op_t op) {
  switch (op) {
    case MNCL_PROD:
      return gloo::ReductionFunction<T>::product;
    case MNCL_MIN:
      return gloo::ReductionFunction<T>::min;
    case MNCL_MAX:
      return gloo::ReductionFunction<T>::max;
    default:
      return gloo::ReductionFunction<T>::sum;
  }
}

// The plugin's MNCL_GLOO_ALGO values (plugins/gloo: parse_algo); empty or unknown: auto.
enum class Algo { kAuto, kRing, kBcube, kRingChunked, kHalvingDoubling };

Algo parse_algo(const char *text) {
  const std::string s = text ? text : "";
  if (s == "ring") return Algo::kRing;
  if (s == "bcube") return Algo::kBcube;
  if (s == "ring_chunked") return Algo::kRingChunked;
  if (s == "halving_doubling") return Algo::kHalvingDoubling;
  return Algo::kAuto;
}

class GlooBaseline : public Baseline {
 public:
  explicit GlooBaseline(std::shared_ptr<gloo::Context> ctx)
      : ctx_(std::move(ctx)), forced_(parse_algo(std::getenv("MNCL_GLOO_ALGO"))) {}
  const char *name() const override { return "gloo"; }

  bool supports(const Call &c) const override {
    // The v collectives' count is this rank's (or the mean) block: decide on the total, which
    // every rank sees the same, so that all ranks run the raw call or none does.
    if (c.kind == CollKind::kAllgatherv || c.kind == CollKind::kAlltoallv)
      return std::accumulate(c.recvcounts.begin(), c.recvcounts.end(), size_t(0)) > 0;
    if (c.count == 0) return false;  // Gloo divides by the count in places
    switch (c.kind) {
      case CollKind::kAllreduce:
      case CollKind::kReduce:
        return static_cast<bool>(reduce_func(c.dtype, c.op));
      case CollKind::kBcast:
      case CollKind::kScatter:
      case CollKind::kGather:
      case CollKind::kAllgather:
      case CollKind::kAlltoall:
        return true;
      case CollKind::kSendrecv:
        return c.nranks > 1;  // a Gloo context has no pair to itself
      default:
        // reduce_scatter has no one-call Gloo equivalent, and Gloo has no gatherv or scatterv
        // (gloo::gather / gloo::scatter take equal blocks only).
        return false;
    }
  }

  void run(const Call &c) override {
    // Gloo derives the element count it hands the reduction function from the pointer type:
    // pass words of the dtype's size.
    switch (mncl_dtype_size(c.dtype)) {
      case 1:
        return run_typed<uint8_t>(c);
      case 2:
        return run_typed<uint16_t>(c);
      case 4:
        return run_typed<uint32_t>(c);
      default:
        return run_typed<uint64_t>(c);
    }
  }

  template <typename W>
  void run_typed(const Call &c) {
    const size_t count = c.count, n = static_cast<size_t>(c.nranks);
    W *send = static_cast<W *>(const_cast<void *>(c.sendbuf));
    W *recv = static_cast<W *>(c.recvbuf);
    switch (c.kind) {
      case CollKind::kAllreduce: {
        const Algo algo = algo_for(count * sizeof(W));
        if (algo == Algo::kRingChunked || algo == Algo::kHalvingDoubling) {
          run_classic(c, algo == Algo::kRingChunked);
          break;
        }
        gloo::AllreduceOptions o(ctx_);
        o.setAlgorithm(algo == Algo::kBcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                                            : gloo::AllreduceOptions::Algorithm::RING);
        if (!c.inplace) o.setInput(send, count);
        o.setOutput(recv, count);
        o.setReduceFunction(reduce_func(c.dtype, c.op));
        o.setTag(tag_++);
        gloo::allreduce(o);
        break;
      }
      case CollKind::kReduce: {
        gloo::ReduceOptions o(ctx_);
        if (!c.inplace) o.setInput(send, count);
        o.setOutput(recv, count);
        o.setRoot(c.root);
        o.setReduceFunction(reduce_func(c.dtype, c.op));
        o.setTag(tag_++);
        gloo::reduce(o);
        break;
      }
      case CollKind::kBcast: {
        gloo::BroadcastOptions o(ctx_);
        o.setOutput(recv, count);
        o.setRoot(c.root);
        o.setTag(tag_++);
        gloo::broadcast(o);
        break;
      }
      case CollKind::kScatter: {
        gloo::ScatterOptions o(ctx_);
        if (c.rank == c.root) {
          std::vector<W *> ins;
          for (size_t q = 0; q < n; ++q) ins.push_back(send + q * count);
          o.setInputs(ins, count);
        }
        o.setOutput(recv, count);
        o.setRoot(c.root);
        o.setTag(tag_++);
        gloo::scatter(o);
        break;
      }
      case CollKind::kGather: {
        gloo::GatherOptions o(ctx_);
        o.setInput(send, count);
        if (c.rank == c.root) o.setOutput(recv, count * n);
        o.setRoot(c.root);
        o.setTag(tag_++);
        gloo::gather(o);
        break;
      }
      case CollKind::kAllgather: {
        gloo::AllgatherOptions o(ctx_);
        if (!c.inplace) o.setInput(send, count);
        o.setOutput(recv, count * n);
        o.setTag(tag_++);
        gloo::allgather(o);
        break;
      }
      case CollKind::kAlltoall: {
        gloo::AlltoallOptions o(ctx_);
        o.setInput(send, count * n);
        o.setOutput(recv, count * n);
        o.setTag(tag_++);
        gloo::alltoall(o);
        break;
      }
      case CollKind::kAllgatherv: {
        gloo::AllgathervOptions o(ctx_);
        // Without an input Gloo takes this rank's block to be in the output already (in place,
        // or an empty block).
        if (!c.inplace && count > 0) o.setInput(send, count);
        o.setOutput(recv, c.recvcounts);
        o.setTag(tag_++);
        gloo::allgatherv(o);
        break;
      }
      case CollKind::kAlltoallv: {
        gloo::AlltoallvOptions o(ctx_);
        o.setInput(send, std::vector<int64_t>(c.sendcounts.begin(), c.sendcounts.end()));
        o.setOutput(recv, std::vector<int64_t>(c.recvcounts.begin(), c.recvcounts.end()));
        o.setTag(tag_++);
        gloo::alltoallv(o);
        break;
      }
      case CollKind::kSendrecv: {
        const size_t bytes = count * sizeof(W);
        const int next = (c.rank + 1) % c.nranks, prev = (c.rank + c.nranks - 1) % c.nranks;
        const uint64_t slot = gloo::Slot::build(kSendrecvSlotPrefix, tag_++);
        auto in = ctx_->createUnboundBuffer(recv, bytes);
        auto out = ctx_->createUnboundBuffer(send, bytes);
        in->recv(prev, slot);
        out->send(next, slot);
        in->waitRecv();
        out->waitSend();
        break;
      }
      default:
        throw std::runtime_error("raw gloo: unsupported collective");
    }
  }

  void barrier() override {
    gloo::BarrierOptions o(ctx_);
    o.setTag(tag_++);
    gloo::barrier(o);
  }

 private:
  // What the plugin runs for an allreduce of `bytes` (plugins/gloo: Comm::allreduce_plain).
  Algo algo_for(size_t bytes) const {
    const size_t n = static_cast<size_t>(ctx_->size);
    if (forced_ == Algo::kAuto)
      return bytes <= 64 * 1024 && n > 2 && (n & (n - 1)) == 0 ? Algo::kBcube : Algo::kRing;
    // The classic algorithms count elements and bytes in an int: beyond, ring (same margin).
    if ((forced_ == Algo::kRingChunked || forced_ == Algo::kHalvingDoubling) &&
        bytes > static_cast<size_t>(INT_MAX) - 1024 * n)
      return Algo::kRing;
    return forced_;
  }

  // gloo::AllreduceRingChunked / AllreduceHalvingDoubling on the real element type (Gloo's
  // functions are typed), in place on recvbuf.
  void run_classic(const Call &c, bool chunked) {
    const bool typed =
        with_gloo_type(c.dtype, [&](auto t) { this->template classic<decltype(t)>(c, chunked); });
    if (!typed) throw std::runtime_error("raw gloo: no classic allreduce for this dtype");
  }

  template <typename T>
  void classic(const Call &c, bool chunked) {
    T *out = static_cast<T *>(c.recvbuf);
    if (!c.inplace) std::memcpy(out, c.sendbuf, c.count * sizeof(T));
    const std::vector<T *> ptrs{out};
    const int count = static_cast<int>(c.count);
    if (chunked) {
      gloo::AllreduceRingChunked<T> a(ctx_, ptrs, count, classic_fn<T>(c.op));
      a.run();
    } else {
      gloo::AllreduceHalvingDoubling<T> a(ctx_, ptrs, count, classic_fn<T>(c.op));
      a.run();
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
  Algo forced_;
  uint32_t tag_ = 1;
};

}  // namespace

std::unique_ptr<Baseline> make_gloo_baseline(mncl_comm_t comm, std::string *why) {
  int rank = 0, size = 1;
  must(mncl_comm_rank(comm, &rank), "mncl_comm_rank");
  must(mncl_comm_size(comm, &size), "mncl_comm_size");
  char dir[256] = {};
  if (rank == 0) {
    std::snprintf(dir, sizeof dir, "/tmp/mncl-perf-gloo-XXXXXX");
    if (mkdtemp(dir) == nullptr) dir[0] = '\0';
  }
  must(mncl_bcast(comm, dir, sizeof dir, MNCL_UINT8, 0, nullptr), "mncl_bcast (gloo store)");
  if (dir[0] == '\0') {
    *why = "raw gloo: cannot create a rendezvous directory in /tmp";
    return nullptr;
  }
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::string error;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";  // local ranks: the file store already assumes one host
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::seconds(60));
    ctx->connectFullMesh(store, device);
  } catch (const std::exception &e) {
    error = e.what();
  }
  // Everyone is connected (or failed) before rank 0 removes the store's files.
  int64_t failed = allreduce_sum(comm, error.empty() ? 0 : 1);
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  if (failed > 0) {
    *why = "raw gloo: rendezvous failed" + (error.empty() ? "" : ": " + error);
    return nullptr;
  }
  return std::make_unique<GlooBaseline>(ctx);
}

}  // namespace mncl::perf

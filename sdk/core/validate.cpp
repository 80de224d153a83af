#include "core/validate.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "common/coll.h"   // the plugin kit's v-collective layout
#include "common/dtype.h"  // the plugin kit's dtype/op tables
#include "common/error.h"

namespace mncl::core {

namespace {

struct KindInfo {
  const char *name;
  bool reduces;  // takes an op
  bool rooted;   // takes a root
  bool p2p;      // takes a peer
};

const KindInfo kKinds[MNCL_NUM_COLL_KINDS_V5] = {
    {"allreduce", true, false, false},
    {"reduce", true, true, false},
    {"bcast", false, true, false},
    {"scatter", false, true, false},
    {"gather", false, true, false},
    {"allgather", false, false, false},
    {"reduce_scatter", true, false, false},
    {"alltoall", false, false, false},
    {"barrier", false, false, false},
    {"send", false, false, true},
    {"recv", false, false, true},
    {"allreduce_coalesced", true, false, false},
    {"allgatherv", false, false, false},
    {"alltoallv", false, false, false},
    {"sendrecv_batch", false, false, false},
    {"gatherv", false, true, false},
    {"scatterv", false, true, false},
};

const char *kFunctionNames[MNCL_NUM_COLL_KINDS_V5] = {
    "mncl_allreduce",  "mncl_reduce",    "mncl_bcast",          "mncl_scatter",
    "mncl_gather",     "mncl_allgather", "mncl_reduce_scatter", "mncl_alltoall",
    "mncl_barrier",    "mncl_send",      "mncl_recv",           "mncl_allreduce_coalesced",
    "mncl_allgatherv", "mncl_alltoallv", "mncl_sendrecv_batch", "mncl_gatherv",
    "mncl_scatterv"};

// Byte range [begin, end) of a buffer, for overlap checks.
struct Range {
  uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
};
Range range_of(const void *p, size_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  return {b, b + bytes};
}
bool overlap(Range a, Range b) {
  return !a.empty() && !b.empty() && a.begin < b.end && b.begin < a.end;
}

// Buffers of one call, each with its index in the call's numbering (a batch's op, a coalesced
// call's buffer).
using IndexedRanges = std::vector<std::pair<Range, size_t>>;
// The first pair of buffers that may not overlap but do: two receive buffers, or a receive
// buffer and a send buffer (send buffers may share memory: they are only read).
struct Clash {
  bool found = false;
  bool with_send = false;  // recv overlaps send `other`, else receive buffer `other`
  size_t recv = 0, other = 0;
};
// Sorts `recvs` by start: n log n for a call with thousands of buffers.
Clash find_clash(IndexedRanges &recvs, const IndexedRanges &sends) {
  Clash clash;
  auto by_start = [](const auto &a, const auto &b) { return a.first.begin < b.first.begin; };
  std::sort(recvs.begin(), recvs.end(), by_start);
  for (size_t k = 1; k < recvs.size(); ++k) {
    if (!overlap(recvs[k - 1].first, recvs[k].first)) continue;
    clash.found = true;
    clash.recv = std::min(recvs[k - 1].second, recvs[k].second);
    clash.other = std::max(recvs[k - 1].second, recvs[k].second);
    return clash;
  }
  for (const auto &s : sends) {
    // The receives are sorted and disjoint: only the first one ending after s begins can be
    // the first to overlap it.
    auto it = std::lower_bound(
        recvs.begin(), recvs.end(), s.first.begin,
        [](const std::pair<Range, size_t> &r, uintptr_t b) { return r.first.end <= b; });
    if (it != recvs.end() && overlap(it->first, s.first)) {
      clash.found = clash.with_send = true;
      clash.recv = it->second;
      clash.other = s.second;
      return clash;
    }
  }
  return clash;
}

// count * factor * elem bytes, refusing overflow (and sizes no address space can hold).
size_t checked_bytes(const char *fn, size_t count, size_t factor, size_t elem) {
  const size_t limit = static_cast<size_t>(std::numeric_limits<intptr_t>::max());
  MNCL_CHECK(factor == 0 || count <= limit / factor / elem, MNCL_ERR_INVALID_ARGUMENT,
             "%s: count %zu x %zu x %zu-byte elements overflows the address space", fn, count,
             factor, elem);
  return count * factor * elem;
}

// The blocks of one buffer (counts and displacements in elements): none overflows, and with
// `disjoint`, no two with a count overlap. Returns the buffer's extent in bytes.
size_t check_blocks(const char *fn, const char *counts_name, const char *displs_name,
                    const size_t *counts, const size_t *displs, int size, size_t elem,
                    bool disjoint) {
  const size_t limit = static_cast<size_t>(std::numeric_limits<intptr_t>::max()) / elem;
  std::vector<std::pair<size_t, int>> starts;  // (displacement, rank) of non-empty blocks
  size_t extent = 0;
  for (int i = 0; i < size; ++i) {
    const size_t n = counts[i], d = displs[i];
    if (n == 0) continue;
    MNCL_CHECK(n <= limit && d <= limit - n, MNCL_ERR_INVALID_ARGUMENT,
               "%s: %s[%d] = %zu at %s[%d] = %zu overflows the address space", fn, counts_name, i,
               n, displs_name, i, d);
    extent = std::max(extent, d + n);
    starts.emplace_back(d, i);
  }
  if (disjoint) {
    std::sort(starts.begin(), starts.end());
    for (size_t k = 1; k < starts.size(); ++k) {
      const int a = starts[k - 1].second, b = starts[k].second;
      MNCL_CHECK(displs[a] + counts[a] <= displs[b], MNCL_ERR_INVALID_ARGUMENT,
                 "%s: the blocks of ranks %d and %d overlap in recvbuf (%s %zu + %zu > %zu)", fn, a,
                 b, displs_name, displs[a], counts[a], displs[b]);
    }
  }
  return extent * elem;
}

// allgatherv and alltoallv (plugin ABI v3; layout of `counts` in mncl_plugin_v3.h): every fact
// one rank can check. What only peers can (that their counts agree) the backends detect.
void validate_v_collective(const char *fn, const mncl_coll_v1_t &c, int rank, int size,
                           size_t elem) {
  MNCL_CHECK(c.counts != nullptr && c.nbufs == static_cast<size_t>(size), MNCL_ERR_INTERNAL,
             "%s: the core built a descriptor without its count arrays", fn);
  const kit::VLayout v = kit::v_layout(c);
  const bool all = c.kind == MNCL_COLL_ALLGATHERV;
  const size_t recv_bytes = check_blocks(fn, "recvcounts", all ? "displs" : "rdispls", v.recvcounts,
                                         v.rdispls, size, elem, true);
  MNCL_CHECK(recv_bytes == 0 || c.recvbuf != nullptr, MNCL_ERR_INVALID_ARGUMENT,
             "%s: recvbuf is NULL but %zu bytes are to be received", fn, recv_bytes);
  const size_t me = static_cast<size_t>(rank);
  size_t send_bytes = 0;
  if (all) {
    MNCL_CHECK(c.count == v.recvcounts[me], MNCL_ERR_INVALID_ARGUMENT,
               "%s: sendcount %zu differs from recvcounts[%d] = %zu (this rank's block)", fn,
               c.count, rank, v.recvcounts[me]);
    send_bytes = checked_bytes(fn, c.count, 1, elem);
    const bool in_place = c.recvbuf != nullptr && send_bytes != 0 &&
                          c.sendbuf == static_cast<const char *>(c.recvbuf) + v.rdispls[me] * elem;
    if (in_place) return;
  } else {
    MNCL_CHECK(v.sendcounts[me] == v.recvcounts[me], MNCL_ERR_INVALID_ARGUMENT,
               "%s: sendcounts[%d] = %zu differs from recvcounts[%d] = %zu (this rank's block "
               "to itself)",
               fn, rank, v.sendcounts[me], rank, v.recvcounts[me]);
    send_bytes =
        check_blocks(fn, "sendcounts", "sdispls", v.sendcounts, v.sdispls, size, elem, false);
  }
  MNCL_CHECK(send_bytes == 0 || c.sendbuf != nullptr, MNCL_ERR_INVALID_ARGUMENT,
             "%s: sendbuf is NULL but %zu bytes are to be sent", fn, send_bytes);
  if (send_bytes && recv_bytes) {
    MNCL_CHECK(!overlap(range_of(c.sendbuf, send_bytes), range_of(c.recvbuf, recv_bytes)),
               MNCL_ERR_INVALID_ARGUMENT, "%s: sendbuf and recvbuf overlap%s", fn,
               all ? " in a way that is not the in-place form (sendbuf == recvbuf + displs[rank])"
                   : " (alltoallv has no in-place form)");
  }
}

}  // namespace

const char *coll_function_name(int kind) {
  return kind >= 0 && kind < MNCL_NUM_COLL_KINDS_V5 ? kFunctionNames[kind] : "mncl_?";
}
size_t coll_bytes(const mncl_coll_v1_t &c) {
  const size_t elem = kit::dtype_size(static_cast<mncl_dtype_t>(c.dtype));
  if (c.kind == MNCL_COLL_BARRIER) return 0;
  if (kit::is_v_kind(c.kind)) {
    const kit::VLayout v = kit::v_layout(c);  // bytes received
    size_t total = 0;
    for (size_t i = 0; v.recvcounts && i < c.nbufs; ++i) total += v.recvcounts[i] * elem;
    return total;
  }
  if (kit::is_rooted_v_kind(c.kind)) {  // the root's blocks there, this rank's own elsewhere
    const kit::RootedVLayout v = kit::rooted_v_layout(c);
    return (v.counts ? kit::v_total(v.counts, c.nbufs) : c.count) * elem;
  }
  if (c.kind == MNCL_COLL_SENDRECV_BATCH) {
    const auto *ops = kit::p2p_ops(c);
    size_t total = 0;
    for (size_t i = 0; ops && i < c.nbufs; ++i)
      total += ops[i].count * kit::dtype_size(ops[i].dtype);
    return total;
  }
  if (c.kind != MNCL_COLL_ALLREDUCE_COALESCED) return c.count * elem;
  size_t total = 0;
  for (size_t i = 0; c.counts && i < c.nbufs; ++i) total += c.counts[i] * elem;
  return total;
}

const char *coll_kind_name(int kind) {
  return kind >= 0 && kind < MNCL_NUM_COLL_KINDS_V5 ? kKinds[kind].name : "?";
}

std::string op_label(const char *name, int kind, uint64_t seq) {
  if (kind == MNCL_COLL_SENDRECV_BATCH) return name;
  return format("%s #%llu", name, static_cast<unsigned long long>(seq));
}

void validate_collective(const mncl_coll_v1_t &c, int rank, int size,
                         const mncl_plugin_v5_t &backend) {
  const char *fn = coll_function_name(c.kind);
  const KindInfo &kind = kKinds[c.kind];
  if (c.kind == MNCL_COLL_SENDRECV_BATCH) {
    // Built by Comm::start_batch from ops validate_batch has checked, whatever the backend.
    MNCL_CHECK(c.nbufs == 0 || c.sendbuf != nullptr, MNCL_ERR_INTERNAL,
               "%s: the core built a batch descriptor without its ops", fn);
    return;
  }

  const bool typed = c.kind != MNCL_COLL_BARRIER;
  if (typed) {
    MNCL_CHECK(c.dtype >= 0 && c.dtype < MNCL_NUM_DTYPES, MNCL_ERR_INVALID_ARGUMENT,
               "%s: dtype %d is not an mncl_dtype_t (0..%d)", fn, c.dtype, MNCL_NUM_DTYPES - 1);
  }
  if (kind.reduces) {
    MNCL_CHECK(c.op >= 0 && c.op < MNCL_NUM_OPS, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %d is not an mncl_op_t (0..%d)", fn, c.op, MNCL_NUM_OPS - 1);
  }
  if (kind.rooted) {
    MNCL_CHECK(c.root >= 0 && c.root < size, MNCL_ERR_INVALID_ARGUMENT,
               "%s: root %d is out of range for a communicator of size %d", fn, c.root, size);
  }
  if (kind.p2p) {
    MNCL_CHECK(c.root >= 0 && c.root < size, MNCL_ERR_INVALID_ARGUMENT,
               "%s: peer %d is out of range for a communicator of size %d", fn, c.root, size);
    MNCL_CHECK(c.root != rank, MNCL_ERR_INVALID_ARGUMENT,
               "%s: peer %d is this rank itself; a blocking send or receive to oneself would "
               "never complete",
               fn, c.root);
  }

  // Capabilities of the backend (after the enums are known to be in range).
  const bool emulated = c.kind == MNCL_COLL_ALLREDUCE_COALESCED;  // the core loops if needed
  MNCL_CHECK(emulated || (backend.coll_mask & MNCL_COLL_BIT(c.kind)), MNCL_ERR_NOT_SUPPORTED,
             "%s: backend '%s' does not implement %s", fn, backend.name, kind.name);
  if (typed) {
    MNCL_CHECK(backend.dtype_mask & (1u << c.dtype), MNCL_ERR_NOT_SUPPORTED,
               "%s: backend '%s' does not support dtype %s", fn, backend.name,
               kit::dtype_name(static_cast<mncl_dtype_t>(c.dtype)));
  }
  if (kind.reduces) {
    MNCL_CHECK(backend.op_mask & (1u << c.op), MNCL_ERR_NOT_SUPPORTED,
               "%s: backend '%s' does not support op %s", fn, backend.name,
               kit::op_name(static_cast<mncl_op_t>(c.op)));
  }
  if (!typed) return;

  const size_t elem = kit::dtype_size(static_cast<mncl_dtype_t>(c.dtype));
  const bool is_root = kind.rooted && rank == c.root;

  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    MNCL_CHECK(c.nbufs == 0 || (c.sendbufs && c.recvbufs && c.counts), MNCL_ERR_INVALID_ARGUMENT,
               "%s: sendbufs, recvbufs or counts is NULL with nbufs = %zu", fn, c.nbufs);
    // The backends pack or count all of it: the sum must not wrap.
    for (size_t i = 0, total = 0; i < c.nbufs; ++i) {
      const size_t bytes = checked_bytes(fn, c.counts[i], 1, elem);
      MNCL_CHECK(bytes <= static_cast<size_t>(std::numeric_limits<intptr_t>::max()) - total,
                 MNCL_ERR_INVALID_ARGUMENT,
                 "%s: counts[0..%zu] add up to more bytes than the address space holds", fn, i);
      total += bytes;
    }
    IndexedRanges recvs, sends;
    for (size_t i = 0; i < c.nbufs; ++i) {
      const size_t bytes = c.counts[i] * elem;  // checked above
      if (bytes == 0) continue;
      MNCL_CHECK(c.sendbufs[i] && c.recvbufs[i], MNCL_ERR_INVALID_ARGUMENT,
                 "%s: buffer %zu is NULL but counts[%zu] = %zu", fn, i, i, c.counts[i]);
      const Range s = range_of(c.sendbufs[i], bytes), r = range_of(c.recvbufs[i], bytes);
      MNCL_CHECK(s.begin == r.begin || !overlap(s, r), MNCL_ERR_INVALID_ARGUMENT,
                 "%s: sendbufs[%zu] and recvbufs[%zu] overlap without being equal", fn, i, i);
      recvs.emplace_back(r, i);
      if (s.begin != r.begin) sends.emplace_back(s, i);  // in place: its data is recvbufs[i]
    }
    // Across buffers: the emulated form runs them one after the other, so a receive buffer
    // that another buffer reads or writes would change that buffer's result.
    const Clash clash = find_clash(recvs, sends);
    if (clash.found && clash.with_send) {
      throw Error(MNCL_ERR_INVALID_ARGUMENT,
                  format("%s: recvbufs[%zu] overlaps sendbufs[%zu]; a receive buffer may overlap "
                         "no other buffer but its own send buffer (when equal: in place)",
                         fn, clash.recv, clash.other));
    }
    MNCL_CHECK(!clash.found, MNCL_ERR_INVALID_ARGUMENT,
               "%s: recvbufs[%zu] and recvbufs[%zu] overlap; every buffer needs its own receive "
               "memory",
               fn, clash.recv, clash.other);
    return;
  }

  if (kit::is_v_kind(c.kind)) {
    validate_v_collective(fn, c, rank, size, elem);
    return;
  }
  if (kit::is_rooted_v_kind(c.kind)) {
    MNCL_CHECK(c.nbufs == static_cast<size_t>(size) && (!is_root || c.counts != nullptr),
               MNCL_ERR_INTERNAL, "%s: the core built a descriptor without the root's arrays", fn);
    const kit::RootedVLayout v = kit::rooted_v_layout(c);
    RootedV call;
    call.gather = c.kind == MNCL_COLL_GATHERV;
    call.sendbuf = c.sendbuf;
    call.recvbuf = c.recvbuf;
    call.count = c.count;
    call.counts = v.counts;
    call.displs = v.displs;
    call.dtype = c.dtype;
    call.root = c.root;
    check_rooted_v(fn, call, rank, size, backend);
    return;
  }

  // Bytes of the send and receive buffers as this rank uses them; 0 = not used here.
  size_t send_bytes = 0, recv_bytes = 0;
  const size_t one = checked_bytes(fn, c.count, 1, elem);
  const size_t all = checked_bytes(fn, c.count, static_cast<size_t>(size), elem);
  // In-place: where the own block sits inside the bigger buffer, if the form has one.
  const void *inplace_send = nullptr;  // sendbuf value that means "in place"
  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
      send_bytes = recv_bytes = one;
      inplace_send = c.recvbuf;
      break;
    case MNCL_COLL_REDUCE:
      send_bytes = one;
      recv_bytes = is_root ? one : 0;
      inplace_send = c.recvbuf;
      break;
    case MNCL_COLL_BCAST:
      recv_bytes = one;
      break;
    case MNCL_COLL_SCATTER:
      send_bytes = is_root ? all : 0;
      recv_bytes = one;
      if (is_root && c.sendbuf) {
        // In place: recvbuf == sendbuf + rank*count.
        if (static_cast<const char *>(c.sendbuf) + one * rank == c.recvbuf) recv_bytes = 0;
      }
      break;
    case MNCL_COLL_GATHER:
      send_bytes = one;
      recv_bytes = is_root ? all : 0;
      if (is_root && c.recvbuf) inplace_send = static_cast<const char *>(c.recvbuf) + one * rank;
      break;
    case MNCL_COLL_ALLGATHER:
      send_bytes = one;
      recv_bytes = all;
      if (c.recvbuf) inplace_send = static_cast<const char *>(c.recvbuf) + one * rank;
      break;
    case MNCL_COLL_REDUCE_SCATTER:
      send_bytes = all;
      recv_bytes = one;
      if (c.sendbuf && static_cast<const char *>(c.sendbuf) + one * rank == c.recvbuf) {
        recv_bytes = 0;
      }
      break;
    case MNCL_COLL_ALLTOALL:
      send_bytes = recv_bytes = all;
      inplace_send = c.recvbuf;
      break;
    case MNCL_COLL_SEND:
      send_bytes = one;
      break;
    case MNCL_COLL_RECV:
      recv_bytes = one;
      break;
    default:
      break;
  }
  const bool in_place = inplace_send != nullptr && c.sendbuf == inplace_send;
  if (in_place) send_bytes = 0;  // the send data lives inside recvbuf

  // The parameter's name in mncl.h: send, recv and bcast have one buffer, "buf".
  MNCL_CHECK(send_bytes == 0 || c.sendbuf != nullptr, MNCL_ERR_INVALID_ARGUMENT,
             "%s: %s is NULL but %zu bytes are to be sent", fn,
             c.kind == MNCL_COLL_SEND ? "buf" : "sendbuf", send_bytes);
  MNCL_CHECK(recv_bytes == 0 || c.recvbuf != nullptr, MNCL_ERR_INVALID_ARGUMENT,
             "%s: %s is NULL but %zu bytes are to be received", fn,
             c.kind == MNCL_COLL_BCAST || c.kind == MNCL_COLL_RECV ? "buf" : "recvbuf", recv_bytes);
  if (send_bytes && recv_bytes) {
    MNCL_CHECK(!overlap(range_of(c.sendbuf, send_bytes), range_of(c.recvbuf, recv_bytes)),
               MNCL_ERR_INVALID_ARGUMENT,
               "%s: sendbuf and recvbuf overlap in a way that is not the in-place form (see "
               "mncl.h)",
               fn);
  }
}

bool check_rooted_v(const char *fn, const RootedV &call, int rank, int size,
                    const mncl_plugin_v5_t &backend) {
  MNCL_CHECK(call.root >= 0 && call.root < size, MNCL_ERR_INVALID_ARGUMENT,
             "%s: root %d is out of range for a communicator of size %d", fn, call.root, size);
  MNCL_CHECK(call.dtype >= 0 && call.dtype < MNCL_NUM_DTYPES, MNCL_ERR_INVALID_ARGUMENT,
             "%s: dtype %d is not an mncl_dtype_t (0..%d)", fn, call.dtype, MNCL_NUM_DTYPES - 1);
  const int native = call.gather ? MNCL_COLL_GATHERV : MNCL_COLL_SCATTERV;
  MNCL_CHECK(backend.coll_mask & (MNCL_COLL_BIT(native) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV)),
             MNCL_ERR_NOT_SUPPORTED,
             "%s: backend '%s' implements neither %s nor alltoallv, which the core can run it as "
             "(a plugin of ABI v1 or v2?)",
             fn, backend.name, call.gather ? "gatherv" : "scatterv");
  MNCL_CHECK(backend.dtype_mask & (1u << call.dtype), MNCL_ERR_NOT_SUPPORTED,
             "%s: backend '%s' does not support dtype %s", fn, backend.name,
             kit::dtype_name(static_cast<mncl_dtype_t>(call.dtype)));
  const size_t elem = kit::dtype_size(static_cast<mncl_dtype_t>(call.dtype));
  const size_t me = static_cast<size_t>(rank);
  // The own block: gatherv's send, scatterv's receive.
  const size_t own_bytes = checked_bytes(fn, call.count, 1, elem);
  const char *own_name = call.gather ? "sendbuf" : "recvbuf";
  const void *own_buf = call.gather ? call.sendbuf : call.recvbuf;
  MNCL_CHECK(own_bytes == 0 || own_buf != nullptr, MNCL_ERR_INVALID_ARGUMENT,
             "%s: %s is NULL but %zu bytes are to be %s", fn, own_name, own_bytes,
             call.gather ? "sent" : "received");
  if (rank != call.root) return false;

  // The root's side: every rank's block.
  const char *counts_name = call.gather ? "recvcounts" : "sendcounts";
  MNCL_CHECK(call.counts != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: %s is NULL on the root", fn,
             counts_name);
  MNCL_CHECK(call.displs != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: displs is NULL on the root",
             fn);
  const size_t extent =
      check_blocks(fn, counts_name, "displs", call.counts, call.displs, size, elem, call.gather);
  const void *blocks_buf = call.gather ? static_cast<const void *>(call.recvbuf) : call.sendbuf;
  MNCL_CHECK(extent == 0 || blocks_buf != nullptr, MNCL_ERR_INVALID_ARGUMENT,
             "%s: %s is NULL on the root but %zu bytes are to be %s", fn,
             call.gather ? "recvbuf" : "sendbuf", extent, call.gather ? "received" : "sent");
  MNCL_CHECK(call.count == call.counts[me], MNCL_ERR_INVALID_ARGUMENT,
             "%s: %s %zu differs from %s[%d] = %zu (the root's own block)", fn,
             call.gather ? "sendcount" : "recvcount", call.count, counts_name, rank,
             call.counts[me]);
  // displs[me] is only meaningful (and checked) for a non-empty block.
  const char *own_in_blocks = blocks_buf == nullptr || own_bytes == 0
                                  ? nullptr
                                  : static_cast<const char *>(blocks_buf) + call.displs[me] * elem;
  const bool in_place = own_bytes != 0 && own_buf == own_in_blocks;
  if (!in_place && own_bytes != 0 && extent != 0) {
    MNCL_CHECK(!overlap(range_of(own_buf, own_bytes), range_of(blocks_buf, extent)),
               MNCL_ERR_INVALID_ARGUMENT,
               "%s: sendbuf and recvbuf overlap in a way that is not the in-place form (%s == "
               "%s + displs[root])",
               fn, own_name, call.gather ? "recvbuf" : "sendbuf");
  }
  return in_place;
}

AlltoallvForm rooted_v_as_alltoallv(const char *fn, const RootedV &call, int rank, int size,
                                    const mncl_plugin_v5_t &backend) {
  const bool in_place = check_rooted_v(fn, call, rank, size, backend);
  MNCL_CHECK(backend.coll_mask & MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV), MNCL_ERR_NOT_SUPPORTED,
             "%s: backend '%s' does not implement alltoallv, which %s runs as (a plugin of ABI "
             "v1 or v2?)",
             fn, backend.name, call.gather ? "gatherv" : "scatterv");
  const size_t n = static_cast<size_t>(size), me = static_cast<size_t>(rank),
               root = static_cast<size_t>(call.root);
  AlltoallvForm form;
  form.packed.assign(4 * n, 0);
  size_t *sendcounts = form.packed.data(), *sdispls = sendcounts + n, *recvcounts = sdispls + n,
         *rdispls = recvcounts + n;
  size_t *own_counts = call.gather ? sendcounts : recvcounts;  // this rank's pair with the root
  own_counts[root] = call.count;
  form.sendbuf = call.gather ? call.sendbuf : nullptr;
  form.recvbuf = call.gather ? nullptr : call.recvbuf;
  if (rank != call.root) return form;

  size_t *root_counts = call.gather ? recvcounts : sendcounts;
  size_t *root_displs = call.gather ? rdispls : sdispls;
  std::copy(call.counts, call.counts + n, root_counts);
  std::copy(call.displs, call.displs + n, root_displs);
  if (in_place) {
    // The root's own block is already where it belongs: nothing to send to itself.
    sendcounts[me] = recvcounts[me] = 0;
  }
  if (call.gather) {
    form.recvbuf = call.recvbuf;
    if (in_place) form.sendbuf = nullptr;
  } else {
    form.sendbuf = call.sendbuf;
    if (in_place) form.recvbuf = nullptr;
  }
  return form;
}

void validate_batch(const char *fn, const mncl_p2p_v4_t *ops, size_t n, int rank, int size,
                    const mncl_plugin_v5_t &backend) {
  MNCL_CHECK(n == 0 || ops != nullptr, MNCL_ERR_INVALID_ARGUMENT, "%s: ops is NULL with nops = %zu",
             fn, n);
  IndexedRanges recvs, sends;  // non-empty buffers and their op index
  for (size_t i = 0; i < n; ++i) {
    const mncl_p2p_v4_t &op = ops[i];
    const bool send = op.kind == MNCL_COLL_SEND;
    MNCL_CHECK(send || op.kind == MNCL_COLL_RECV, MNCL_ERR_INTERNAL,
               "%s: op %zu: the core built an op of kind %d", fn, i, op.kind);
    const char *what = send ? "send" : "recv";
    MNCL_CHECK(op.peer >= 0 && op.peer < size, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %zu (%s): peer %d is out of range for a communicator of size %d", fn, i,
               what, op.peer, size);
    MNCL_CHECK(op.peer != rank, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %zu (%s): peer %d is this rank itself; point to point needs another rank",
               fn, i, what, op.peer);
    MNCL_CHECK(op.dtype >= 0 && op.dtype < MNCL_NUM_DTYPES, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %zu (%s): dtype %d is not an mncl_dtype_t (0..%d)", fn, i, what, op.dtype,
               MNCL_NUM_DTYPES - 1);
    MNCL_CHECK(backend.dtype_mask & (1u << op.dtype), MNCL_ERR_NOT_SUPPORTED,
               "%s: op %zu (%s): backend '%s' does not support dtype %s", fn, i, what, backend.name,
               kit::dtype_name(static_cast<mncl_dtype_t>(op.dtype)));
    const size_t bytes =
        checked_bytes(fn, op.count, 1, kit::dtype_size(static_cast<mncl_dtype_t>(op.dtype)));
    MNCL_CHECK(bytes == 0 || op.buf != nullptr, MNCL_ERR_INVALID_ARGUMENT,
               "%s: op %zu (%s): buf is NULL but count is %zu", fn, i, what, op.count);
    if (bytes != 0) (send ? sends : recvs).emplace_back(range_of(op.buf, bytes), i);
  }
  // A receive buffer may overlap nothing else of the batch; sends may share memory.
  const Clash clash = find_clash(recvs, sends);
  if (clash.found && clash.with_send) {
    throw Error(MNCL_ERR_INVALID_ARGUMENT,
                format("%s: op %zu (recv) has a receive buffer that overlaps the send buffer of "
                       "op %zu",
                       fn, clash.recv, clash.other));
  }
  MNCL_CHECK(!clash.found, MNCL_ERR_INVALID_ARGUMENT,
             "%s: ops %zu and %zu (recv) have overlapping receive buffers", fn, clash.recv,
             clash.other);
}

}  // namespace mncl::core

#include "naive/naive_comm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/coll.h"
#include "common/dtype.h"
#include "common/host.h"
#include "common/reduce.h"

namespace mncl::naive {

using Clock = std::chrono::steady_clock;

namespace {

using mncl::kit::is_reduction;
using mncl::kit::is_rooted;
using mncl::kit::is_rooted_v_kind;

using mncl::kit::is_v_kind;
using mncl::kit::kind_name;

// Block i of a buffer of equal blocks.
const unsigned char *block(const void *buf, size_t i, size_t len) {
  return static_cast<const unsigned char *>(buf) + i * len;
}
unsigned char *block(void *buf, size_t i, size_t len) {
  return static_cast<unsigned char *>(buf) + i * len;
}

// In-place forms hand us the same pointer as source and destination: nothing to copy then.
void copy_block(void *dst, const void *src, size_t len) {
  if (dst != src && len > 0) std::memcpy(dst, src, len);
}

std::string rank_list(const std::vector<int> &ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// What every stored value starts with: the call that stored it (see naive_comm.h).
struct Header {
  uint32_t magic;
  int32_t kind, dtype, op, root;  // op and root are -1 where the kind has none
  // allgatherv: a hash of recvcounts (which every rank must share); allreduce_coalesced: of
  // nbufs and counts (kit::split_digest); else 0
  uint32_t digest;
  uint64_t count;  // elements (all buffers together for the coalesced allreduce)

  bool operator==(const Header &o) const {
    return magic == o.magic && kind == o.kind && dtype == o.dtype && op == o.op && root == o.root &&
           count == o.count && digest == o.digest;
  }
  std::string describe() const {
    std::string out =
        kit::format("%s(%llu x %s%s", kind_name(kind), static_cast<unsigned long long>(count),
                    kit::dtype_name(dtype), kind == MNCL_COLL_ALLGATHERV ? " in all" : "");
    if (op >= 0) out += kit::format(", %s", kit::op_name(op));
    if (root >= 0) out += kit::format(", root %d", root);
    return out + ")";
  }
};
constexpr uint32_t kHeaderMagic = 0x4e564831u;  // "NVH1"

Header header_of(const mncl_coll_v1_t &c) {
  Header h{kHeaderMagic,
           c.kind,
           c.dtype,
           is_reduction(c.kind) ? c.op : -1,
           is_rooted(c.kind) || is_rooted_v_kind(c.kind) ? c.root : -1,
           0,
           c.count};
  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    // The total alone would let ranks that split it differently (2+3 vs 3+2) mix elements
    // across buffers: the digest of the split must agree too.
    h.count = 0;
    for (size_t i = 0; i < c.nbufs; ++i) h.count += c.counts[i];
    h.digest = kit::split_digest(c.counts, c.nbufs);
  }
  if (c.kind == MNCL_COLL_RECV) h.kind = MNCL_COLL_SEND;  // a receive matches a send
  // Allgatherv: c.count is this rank's block, which differs between ranks; the total of
  // recvcounts is what every rank must agree on. Alltoallv: set per message (alltoallv()).
  if (c.kind == MNCL_COLL_ALLGATHERV) {
    h.count = 0;
    uint64_t hash = 14695981039346656037ull;  // FNV-1a over the counts
    for (size_t i = 0; i < c.nbufs; ++i) {
      h.count += c.counts[i];
      hash = (hash ^ c.counts[i]) * 1099511628211ull;
    }
    h.digest = static_cast<uint32_t>(hash ^ (hash >> 32));
  }
  if (c.kind == MNCL_COLL_ALLTOALLV) h.count = 0;
  // Gatherv / scatterv: the count of each message's block (c.count on the rank that sends or
  // receives its own block; the root sets it per peer, gatherv() and scatterv()).
  return h;
}

const void *payload(const Value &v) {
  return static_cast<const unsigned char *>(v.data()) + sizeof(Header);
}

}  // namespace

// The collective in progress: what error messages name, and its deadline.
struct Comm::Op {
  const char *name;  // "allreduce"
  std::string noun;  // what other ranks owe us, for messages: "contribution", "message #3"
  uint64_t seq;      // the core's number, for messages
  uint64_t key_id;   // <k>, the collective's number in store keys
  int64_t timeout_ms;
  Clock::time_point deadline;
  Header header;      // what this rank's call stores, and expects to read
  std::string split;  // allreduce_coalesced: this rank's buffers, for messages (" {2, 3}")

  std::string key(const std::string &suffix) const { return std::to_string(key_id) + "/" + suffix; }
  std::string where() const {
    return kit::format("naive %s #%llu", name, static_cast<unsigned long long>(seq));
  }
  int64_t remaining_ms() const {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return std::max<int64_t>(0, left.count());
  }
};

// MNCL_NAIVE_PART_BYTES: the largest store value before a message travels in parts (tests set
// it small to take that path at every size).
size_t part_bytes_from_env(const mncl_host_v1_t *host) {
  const char *text = host && host->get_env ? host->get_env("MNCL_NAIVE_PART_BYTES") : nullptr;
  if (text == nullptr || *text == '\0') return StoreClient::kDefaultPartBytes;
  char *end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || value == 0 || value > StoreClient::kDefaultPartBytes || text[0] == '-') {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("MNCL_NAIVE_PART_BYTES='%s' is not a byte count from 1 to %zu",
                                 text, StoreClient::kDefaultPartBytes));
  }
  return static_cast<size_t>(value);
}

Comm::Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host)
    : host_(host),
      store_(bs.store, part_bytes_from_env(host)),
      rank_(bs.rank),
      size_(bs.size),
      default_timeout_ms_(bs.timeout_ms > 0 ? bs.timeout_ms : 300000),
      sent_(static_cast<size_t>(bs.size), 0),
      received_(static_cast<size_t>(bs.size), 0) {}

void Comm::execute(const mncl_coll_v1_t &c) {
  const bool p2p = c.kind == MNCL_COLL_SEND || c.kind == MNCL_COLL_RECV;
  Op op{kind_name(c.kind),
        "contribution",
        c.seq,
        p2p ? 0 : next_collective_++,
        c.timeout_ms > 0 ? c.timeout_ms : default_timeout_ms_,
        Clock::time_point(),
        Header{},
        std::string()};
  op.deadline = Clock::now() + std::chrono::milliseconds(op.timeout_ms);
  if (aborted_.load()) {
    throw kit::Error(MNCL_ERR_ABORTED, op.where() + ": the communicator was aborted");
  }
  // The core validated the descriptor; these checks only keep a bad caller from corrupting
  // memory when the plugin is driven directly (as its unit test does).
  if (c.kind != MNCL_COLL_BARRIER && kit::dtype_size(c.dtype) == 0) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: unknown dtype %d", op.where().c_str(), c.dtype));
  }
  if (is_reduction(c.kind) && (c.op < MNCL_SUM || c.op > MNCL_AVG)) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: unknown op %d", op.where().c_str(), c.op));
  }
  if (is_v_kind(c.kind) && (c.counts == nullptr || c.nbufs != static_cast<size_t>(size_))) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: needs %d counts per array, got %zu%s", op.where().c_str(),
                                 size_, c.nbufs, c.counts == nullptr ? " (counts is NULL)" : ""));
  }
  if (is_rooted_v_kind(c.kind)) {
    const bool root = rank_ == c.root;
    if (c.root < 0 || c.root >= size_ || c.nbufs != static_cast<size_t>(size_) ||
        (root && c.counts == nullptr)) {
      throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                       kit::format("%s: needs a root in [0, %d) and, on the root, %d counts and "
                                   "displacements; got root %d, nbufs %zu%s",
                                   op.where().c_str(), size_, size_, c.root, c.nbufs,
                                   root && c.counts == nullptr ? " (counts is NULL)" : ""));
    }
    if (root && c.count != c.counts[rank_]) {
      throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                       kit::format("%s: the root's own block is %zu elements but counts[%d] is %zu",
                                   op.where().c_str(), c.count, rank_, c.counts[rank_]));
    }
  }
  op.header = header_of(c);
  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    op.split = " {";
    for (size_t i = 0; i < c.nbufs && i < 8; ++i) {
      op.split += kit::format("%s%zu", i > 0 ? ", " : "", c.counts[i]);
    }
    op.split += c.nbufs > 8 ? kit::format(", ... (%zu buffers)}", c.nbufs) : "}";
  }
  MNCL_KIT_LOG(host_, MNCL_LOG_TRACE, "%s: rank %d/%d %s %s count %zu root %d", op.where().c_str(),
               rank_, size_, kit::dtype_name(c.dtype),
               is_reduction(c.kind) ? kit::op_name(c.op) : "-", c.count, c.root);

  switch (c.kind) {
    case MNCL_COLL_ALLREDUCE:
      return allreduce(op, c);
    case MNCL_COLL_REDUCE:
      return reduce(op, c);
    case MNCL_COLL_BCAST:
      return bcast(op, c);
    case MNCL_COLL_SCATTER:
      return scatter(op, c);
    case MNCL_COLL_GATHER:
      return gather(op, c);
    case MNCL_COLL_ALLGATHER:
      return allgather(op, c);
    case MNCL_COLL_REDUCE_SCATTER:
      return reduce_scatter(op, c);
    case MNCL_COLL_ALLTOALL:
      return alltoall(op, c);
    case MNCL_COLL_BARRIER:
      return barrier(op);
    case MNCL_COLL_SEND:
      return send(op, c);
    case MNCL_COLL_RECV:
      return recv(op, c);
    case MNCL_COLL_ALLREDUCE_COALESCED:
      return allreduce_coalesced(op, c);
    case MNCL_COLL_ALLGATHERV:
      return allgatherv(op, c);
    case MNCL_COLL_ALLTOALLV:
      return alltoallv(op, c);
    case MNCL_COLL_GATHERV:
      return gatherv(op, c);
    case MNCL_COLL_SCATTERV:
      return scatterv(op, c);
    default:
      throw kit::Error(MNCL_ERR_NOT_SUPPORTED,
                       kit::format("naive: collective kind %d is not supported", c.kind));
  }
}

// ---------------------------------------------------------------------------------------------
// Data-movement patterns
// ---------------------------------------------------------------------------------------------

// Everyone publishes `mine` under <k>/r<rank> and calls use(src, data) for every rank's
// contribution in rank order (its own without a round trip).
template <typename Use>
void Comm::exchange_shared(Op &op, const void *mine, size_t len, Use use) {
  auto key_of = [&](int src) { return op.key("r" + std::to_string(src)); };
  if (size_ > 1) put(op, key_of(rank_), mine, len);
  read_in_rank_order(op, mine, len, key_of, /*delete_after=*/false, use);
  if (size_ == 1) return;
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(key_of(r));
  done_reading(op, size_, keys);  // every rank reads the others' keys
}

// Calls use(src, data) for src = 0 .. size-1: `mine` for this rank, otherwise the `len` bytes
// stored under key_of(src). delete_after: the key has no other reader, delete it once read.
template <typename KeyOf, typename Use>
void Comm::read_in_rank_order(Op &op, const void *mine, size_t len, KeyOf key_of, bool delete_after,
                              Use use) {
  for (int src = 0; src < size_; ++src) {
    if (src == rank_) {
      use(src, mine);
      continue;
    }
    const std::string key = key_of(src);
    Value value = fetch(op, src, key_of);
    check_length(op, src, value, len);
    use(src, payload(value));
    if (delete_after) store_.del(key);
  }
}

// What rank src stored under key_of(src), unchecked; waits up to the op's deadline. Callers
// read in rank order, so on a timeout every later rank still missing is named too.
template <typename KeyOf>
Value Comm::fetch(Op &op, int src, KeyOf key_of) {
  Value value;
  const mncl_status_t st = store_.get(key_of(src), op.remaining_ms(), &value);
  if (st != MNCL_OK) {
    // Name every rank still missing, not only the first one, to point at the culprit(s).
    std::vector<int> missing{src};
    for (int later = src + 1; st == MNCL_ERR_TIMEOUT && later < size_; ++later) {
      if (later != rank_ && store_.exists(key_of(later)) != MNCL_OK) missing.push_back(later);
    }
    throw_missing(op, st, missing);
  }
  return value;
}

// The `len` bytes that rank src stored under key (not deleted: the caller decides).
Value Comm::read_one(Op &op, int src, const std::string &key, size_t len) {
  Value value;
  const mncl_status_t st = store_.get(key, op.remaining_ms(), &value);
  if (st != MNCL_OK) throw_missing(op, st, {src});
  check_length(op, src, value, len);
  return value;
}

// Called by each of the `readers` ranks once it has read all of `keys`: the last one to get
// here deletes them, and the counter, so nothing outlives the op. One add per rank.
void Comm::done_reading(Op &op, int readers, const std::vector<std::string> &keys) {
  if (readers == 1) {  // the only reader needs no counter
    for (const std::string &k : keys) store_.del(k);
    return;
  }
  const std::string counter = op.key("n");
  if (store_.add(counter, 1) == readers) {
    for (const std::string &k : keys) store_.del(k);
    store_.del(counter);
  }
}

void Comm::put(const Op &op, const std::string &key, const void *data, size_t len) {
  std::vector<unsigned char> framed(sizeof(Header) + len);
  std::memcpy(framed.data(), &op.header, sizeof(Header));
  if (len > 0) std::memcpy(framed.data() + sizeof(Header), data, len);
  store_.set(key, framed.data(), framed.size());
}

// A header or size mismatch means the ranks disagree on the call: say so rather than combine
// bytes of another meaning, or overrun.
void Comm::check_length(const Op &op, int src, const Value &value, size_t len) const {
  Header theirs{};
  if (value.size() >= sizeof(Header)) std::memcpy(&theirs, value.data(), sizeof(Header));
  if (value.size() < sizeof(Header) || theirs.magic != kHeaderMagic) {
    throw kit::Error(MNCL_ERR_REMOTE,
                     kit::format("%s: rank %d stored %zu bytes that are not a naive "
                                 "contribution (another backend or version on that rank?)",
                                 op.where().c_str(), src, value.size()));
  }
  if (op.header.kind == MNCL_COLL_ALLTOALLV && theirs.kind == op.header.kind &&
      theirs.dtype == op.header.dtype && theirs.count != op.header.count) {
    // The header of an alltoallv message carries what its sender expects back (alltoallv()).
    throw kit::Error(
        MNCL_ERR_REMOTE,
        kit::format("%s: rank %d expects %llu elements from rank %d, which sends it "
                    "%llu (do sendcounts and recvcounts agree across ranks?)",
                    op.where().c_str(), src, static_cast<unsigned long long>(theirs.count), rank_,
                    static_cast<unsigned long long>(op.header.count)));
  }
  if (is_rooted_v_kind(op.header.kind) && theirs.kind == op.header.kind &&
      theirs.dtype == op.header.dtype && theirs.root == op.header.root &&
      theirs.count != op.header.count) {
    // The header of a gatherv / scatterv message carries its block's count as the sender sees
    // it; op.header.count is this rank's (gatherv() and scatterv()).
    const bool gatherv = op.header.kind == MNCL_COLL_GATHERV;
    const int peer = gatherv ? src : rank_;  // the rank whose block this is
    throw kit::Error(
        MNCL_ERR_REMOTE,
        kit::format("%s: rank %d sends %llu elements to rank %d, which expects %llu (does rank "
                    "%d's count agree with the root's %s[%d]?)",
                    op.where().c_str(), src, static_cast<unsigned long long>(theirs.count), rank_,
                    static_cast<unsigned long long>(op.header.count), peer,
                    gatherv ? "recvcounts" : "sendcounts", peer));
  }
  if (op.header.kind == MNCL_COLL_ALLGATHERV && theirs.kind == op.header.kind &&
      theirs.dtype == op.header.dtype && theirs.count == op.header.count &&
      theirs.digest != op.header.digest) {
    throw kit::Error(MNCL_ERR_REMOTE,
                     kit::format("%s: rank %d passes other recvcounts than rank %d (same total, "
                                 "%llu elements; recvcounts must be the same on every rank)",
                                 op.where().c_str(), src, rank_,
                                 static_cast<unsigned long long>(op.header.count)));
  }
  if (op.header.kind == MNCL_COLL_ALLREDUCE_COALESCED && theirs.kind == op.header.kind &&
      theirs.dtype == op.header.dtype && theirs.op == op.header.op &&
      theirs.count == op.header.count && theirs.digest != op.header.digest) {
    throw kit::Error(
        MNCL_ERR_REMOTE,
        kit::format("%s: mismatched collective calls: rank %d called %s with other buffer "
                    "counts than rank %d's %s with counts%s (same total; nbufs and counts must "
                    "be the same on every rank)",
                    op.where().c_str(), src, theirs.describe().c_str(), rank_,
                    op.header.describe().c_str(), op.split.c_str()));
  }
  if (!(theirs == op.header)) {
    const size_t sent = value.size() - sizeof(Header);
    // A receive expects a send's header (header_of): name it as the call it is.
    std::string mine = op.header.describe();
    if (std::strcmp(op.name, "recv") == 0 && mine.compare(0, 5, "send(") == 0) {
      mine.replace(0, 4, "recv");
    }
    throw kit::Error(
        MNCL_ERR_REMOTE,
        kit::format("%s: mismatched %scalls: rank %d called %s where rank %d calls %s%s",
                    op.where().c_str(), op.header.kind == MNCL_COLL_SEND ? "" : "collective ", src,
                    theirs.describe().c_str(), rank_, mine.c_str(),
                    sent == len ? ""
                                : kit::format(" (rank %d sent %zu bytes where rank %d expects %zu)",
                                              src, sent, rank_, len)
                                      .c_str()));
  }
  if (value.size() == sizeof(Header) + len) return;
  throw kit::Error(MNCL_ERR_REMOTE,
                   kit::format("%s: rank %d sent %zu bytes where rank %d expects %zu (do %s "
                               "agree on every rank?)",
                               op.where().c_str(), src, value.size() - sizeof(Header), rank_, len,
                               is_v_kind(op.header.kind) || is_rooted_v_kind(op.header.kind)
                                   ? "the counts"
                                   : "count and dtype"));
}

void Comm::throw_missing(Op &op, mncl_status_t st, std::vector<int> missing) {
  if (st == MNCL_ERR_ABORTED) {
    throw kit::Error(MNCL_ERR_ABORTED,
                     kit::format("%s: communicator aborted while waiting for the %s of %s",
                                 op.where().c_str(), op.noun.c_str(), rank_list(missing).c_str()));
  }
  throw kit::Error(
      MNCL_ERR_TIMEOUT,
      kit::format("%s: no %s from %s within %.1f s", op.where().c_str(), op.noun.c_str(),
                  rank_list(missing).c_str(), static_cast<double>(op.timeout_ms) / 1000.0));
}

// ---------------------------------------------------------------------------------------------
// Collectives. A zero-byte collective moves nothing (every rank sees the same count), so it
// returns at once; send/recv of zero elements still exchange a message to keep pairs in order.
// ---------------------------------------------------------------------------------------------

void Comm::allreduce(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);
  if (len == 0) return;
  kit::Accumulator acc(c.dtype, c.op, c.count);
  exchange_shared(op, c.sendbuf, len, [&](int, const void *data) { acc.add(data); });
  acc.finish(c.recvbuf, size_);  // in place is fine: the accumulator is a separate buffer
}

// One allreduce over all buffers packed end to end: one exchange instead of nbufs.
void Comm::allreduce_coalesced(Op &op, const mncl_coll_v1_t &c) {
  const size_t esize = kit::dtype_size(c.dtype);
  size_t total = 0;
  for (size_t i = 0; i < c.nbufs; ++i) total += c.counts[i];
  if (total == 0) return;
  std::vector<unsigned char> packed(total * esize);
  for (size_t i = 0, off = 0; i < c.nbufs; off += c.counts[i] * esize, ++i) {
    copy_block(packed.data() + off, c.sendbufs[i], c.counts[i] * esize);
  }
  kit::Accumulator acc(c.dtype, c.op, total);
  exchange_shared(op, packed.data(), packed.size(), [&](int, const void *data) { acc.add(data); });
  acc.finish(packed.data(), size_);  // our own input is consumed by now: reuse its buffer
  for (size_t i = 0, off = 0; i < c.nbufs; off += c.counts[i] * esize, ++i) {
    copy_block(c.recvbufs[i], packed.data() + off, c.counts[i] * esize);
  }
}

void Comm::reduce(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);
  if (len == 0) return;
  auto key_of = [&](int src) { return op.key(kit::format("%d>%d", src, c.root)); };
  if (rank_ != c.root) {
    put(op, key_of(rank_), c.sendbuf, len);
    return;
  }
  kit::Accumulator acc(c.dtype, c.op, c.count);
  read_in_rank_order(op, c.sendbuf, len, key_of, /*delete_after=*/true,
                     [&](int, const void *data) { acc.add(data); });
  acc.finish(c.recvbuf, size_);
}

void Comm::bcast(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);
  if (len == 0 || size_ == 1) return;
  op.noun = "data";
  const std::string key = op.key("r" + std::to_string(c.root));
  if (rank_ == c.root) {
    put(op, key, c.recvbuf, len);  // BCAST uses recvbuf only
    return;
  }
  Value value = read_one(op, c.root, key, len);
  std::memcpy(c.recvbuf, payload(value), len);
  done_reading(op, size_ - 1, {key});
}

void Comm::scatter(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);
  if (len == 0) return;
  op.noun = "data";
  auto key_of = [&](int dst) { return op.key(kit::format("%d>%d", c.root, dst)); };
  if (rank_ == c.root) {
    for (int dst = 0; dst < size_; ++dst) {
      if (dst != rank_) put(op, key_of(dst), block(c.sendbuf, dst, len), len);
    }
    copy_block(c.recvbuf, block(c.sendbuf, rank_, len), len);
    return;
  }
  const std::string key = key_of(rank_);
  Value value = read_one(op, c.root, key, len);
  std::memcpy(c.recvbuf, payload(value), len);
  store_.del(key);
}

void Comm::gather(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);
  if (len == 0) return;
  auto key_of = [&](int src) { return op.key(kit::format("%d>%d", src, c.root)); };
  if (rank_ != c.root) {
    put(op, key_of(rank_), c.sendbuf, len);
    return;
  }
  read_in_rank_order(
      op, c.sendbuf, len, key_of, /*delete_after=*/true,
      [&](int src, const void *data) { copy_block(block(c.recvbuf, src, len), data, len); });
}

void Comm::allgather(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);
  if (len == 0) return;
  exchange_shared(op, c.sendbuf, len, [&](int src, const void *data) {
    copy_block(block(c.recvbuf, src, len), data, len);
  });
}

void Comm::reduce_scatter(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);  // count is the per-rank recvcount
  if (len == 0) return;
  auto key_of = [&](int src, int dst) { return op.key(kit::format("%d>%d", src, dst)); };
  for (int dst = 0; dst < size_; ++dst) {
    if (dst != rank_) put(op, key_of(rank_, dst), block(c.sendbuf, dst, len), len);
  }
  kit::Accumulator acc(c.dtype, c.op, c.count);
  read_in_rank_order(
      op, block(c.sendbuf, rank_, len), len, [&](int src) { return key_of(src, rank_); },
      /*delete_after=*/true, [&](int, const void *data) { acc.add(data); });
  acc.finish(c.recvbuf, size_);
}

void Comm::alltoall(Op &op, const mncl_coll_v1_t &c) {
  const size_t len = c.count * kit::dtype_size(c.dtype);
  if (len == 0) return;
  auto key_of = [&](int src, int dst) { return op.key(kit::format("%d>%d", src, dst)); };
  // Everything goes out before anything comes in, which is what makes in place safe.
  for (int dst = 0; dst < size_; ++dst) {
    if (dst != rank_) put(op, key_of(rank_, dst), block(c.sendbuf, dst, len), len);
  }
  read_in_rank_order(
      op, block(c.sendbuf, rank_, len), len, [&](int src) { return key_of(src, rank_); },
      /*delete_after=*/true,
      [&](int src, const void *data) { copy_block(block(c.recvbuf, src, len), data, len); });
}

// Every rank stores its block (empty ones too: a rank expecting data from it must not wait
// out its timeout), then reads rank i's into recvbuf + displs[i], checking its length against
// recvcounts[i]. The headers carry the total and a digest of recvcounts, so every rank fails
// when any two differ, even where the block lengths it sees happen to agree.
void Comm::allgatherv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const kit::VLayout v = kit::v_layout(c);
  if (c.count != v.recvcounts[rank_]) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: sends %zu elements but recvcounts[%d] is %zu",
                                 op.where().c_str(), c.count, rank_, v.recvcounts[rank_]));
  }
  auto dst_of = [&](int src) { return block(c.recvbuf, v.rdispls[src], es); };
  copy_block(dst_of(rank_), c.sendbuf, c.count * es);  // in place: already there
  if (size_ == 1) return;
  auto key_of = [&](int src) { return op.key("r" + std::to_string(src)); };
  put(op, key_of(rank_), c.sendbuf, c.count * es);
  std::vector<std::string> keys;
  for (int src = 0; src < size_; ++src) {
    keys.push_back(key_of(src));
    if (src == rank_) continue;
    const size_t len = v.recvcounts[src] * es;
    Value value = fetch(op, src, key_of);
    check_length(op, src, value, len);  // before any write: never past the block
    copy_block(dst_of(src), payload(value), len);
  }
  done_reading(op, size_, keys);
}

// Like alltoall, with a message per ordered pair, empty blocks included (so a peer expecting
// data never waits out its timeout). The header of the message from s to d carries s's
// recvcounts[d], which d checks against its sendcounts[s], while its length is checked against
// d's recvcounts[s]: both ends of a pair whose counts disagree fail with MNCL_ERR_REMOTE.
void Comm::alltoallv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  const kit::VLayout v = kit::v_layout(c);
  if (v.sendcounts[rank_] != v.recvcounts[rank_]) {
    throw kit::Error(
        MNCL_ERR_INVALID_ARGUMENT,
        kit::format("%s: sendcounts[%d] is %zu but recvcounts[%d] is %zu", op.where().c_str(),
                    rank_, v.sendcounts[rank_], rank_, v.recvcounts[rank_]));
  }
  // Never in place (the core refuses overlaps), so the own block can go first.
  copy_block(block(c.recvbuf, v.rdispls[rank_], es), block(c.sendbuf, v.sdispls[rank_], es),
             v.recvcounts[rank_] * es);
  auto key_of = [&](int src, int dst) { return op.key(kit::format("%d>%d", src, dst)); };
  for (int dst = 0; dst < size_; ++dst) {
    if (dst == rank_) continue;
    op.header.count = v.recvcounts[dst];
    put(op, key_of(rank_, dst), block(c.sendbuf, v.sdispls[dst], es), v.sendcounts[dst] * es);
  }
  for (int src = 0; src < size_; ++src) {
    if (src == rank_) continue;
    auto from = [&](int s) { return key_of(s, rank_); };
    Value value = fetch(op, src, from);
    op.header.count = v.sendcounts[src];  // what src's header must say
    const size_t len = v.recvcounts[src] * es;
    check_length(op, src, value, len);
    copy_block(block(c.recvbuf, v.rdispls[src], es), payload(value), len);
    store_.del(from(src));
  }
}

// GATHERV: every other rank sends the root one message, empty blocks included (so the root
// never waits out its timeout for a block of 0, and a block sent to a root that expects none is
// still caught), under <k>/<src>><root>; its header carries the sender's count. The root copies
// its own block (none in place), then reads rank src's message, checks it against
// recvcounts[src] before writing anything and writes it at recvbuf + displs[src]: a count
// disagreement fails the root with MNCL_ERR_REMOTE naming the rank and both counts (the sender
// has completed by then). Nothing outside the blocks is written.
void Comm::gatherv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  auto key_of = [&](int src) { return op.key(kit::format("%d>%d", src, c.root)); };
  if (rank_ != c.root) {
    put(op, key_of(rank_), c.sendbuf, c.count * es);  // header.count: c.count (header_of)
    return;
  }
  const kit::RootedVLayout v = kit::rooted_v_layout(c);  // counts checked by execute()
  auto write_block = [&](int src, const void *data) {
    const size_t len = v.counts[src] * es;
    if (len > 0) copy_block(block(c.recvbuf, v.displs[src], es), data, len);
  };
  write_block(rank_, c.sendbuf);  // in place: already there
  for (int src = 0; src < size_; ++src) {
    if (src == rank_) continue;
    Value value = fetch(op, src, key_of);
    store_.del(key_of(src));          // its only reader, even when the check below fails
    op.header.count = v.counts[src];  // what src's header must say
    check_length(op, src, value, v.counts[src] * es);
    write_block(src, payload(value));
  }
}

// SCATTERV: the root sends every other rank one message, empty blocks included, under
// <k>/<root>><dst>, with sendcounts[dst] in its header, and copies its own block (none in
// place). Each receiver checks the message against its own count before writing anything: a
// disagreement fails it with MNCL_ERR_REMOTE naming the root and both counts.
void Comm::scatterv(Op &op, const mncl_coll_v1_t &c) {
  const size_t es = kit::dtype_size(c.dtype);
  op.noun = "data";
  auto key_of = [&](int dst) { return op.key(kit::format("%d>%d", c.root, dst)); };
  if (rank_ == c.root) {
    const kit::RootedVLayout v = kit::rooted_v_layout(c);  // counts checked by execute()
    auto block_of = [&](int dst) -> const void * {
      return v.counts[dst] > 0 ? block(c.sendbuf, v.displs[dst], es) : nullptr;
    };
    for (int dst = 0; dst < size_; ++dst) {
      if (dst == rank_) continue;
      op.header.count = v.counts[dst];
      put(op, key_of(dst), block_of(dst), v.counts[dst] * es);
    }
    copy_block(c.recvbuf, block_of(rank_), c.count * es);  // in place: already there
    return;
  }
  const std::string key = key_of(rank_);
  Value value;
  const mncl_status_t st = store_.get(key, op.remaining_ms(), &value);
  if (st != MNCL_OK) throw_missing(op, st, {c.root});
  store_.del(key);  // its only reader, even when the check below fails
  check_length(op, c.root, value, c.count * es);
  copy_block(c.recvbuf, payload(value), c.count * es);
}

// Arrive: add 1 to <k>/n; the rank that makes it `size` opens <k>/go. Leave: add 1 again;
// the rank that makes it 2*size knows everyone has seen go and deletes both keys.
void Comm::barrier(Op &op) {
  if (size_ == 1) return;
  const std::string counter = op.key("n");
  const std::string go = op.key("go");
  if (store_.add(counter, 1) == size_) {
    store_.set(go, "1", 1);
  } else {
    Value value;
    const mncl_status_t st = store_.get(go, op.remaining_ms(), &value);
    if (st == MNCL_ERR_ABORTED) {
      throw kit::Error(MNCL_ERR_ABORTED,
                       op.where() + ": communicator aborted while waiting for the other ranks");
    }
    // The last rank may have arrived just as the wait ran out (it then returns MNCL_OK):
    // the counter says so (past `size`, ranks are leaving already), and so does this rank.
    // Only a count below `size` is a timeout; it cannot say who is missing, only how many.
    const int64_t arrived = st == MNCL_OK ? size_ : store_.add(counter, 0);
    if (arrived < size_) {
      throw kit::Error(MNCL_ERR_TIMEOUT,
                       kit::format("%s: only %lld of %d ranks arrived within %.1f s",
                                   op.where().c_str(), static_cast<long long>(arrived), size_,
                                   static_cast<double>(op.timeout_ms) / 1000.0));
    }
  }
  if (store_.add(counter, 1) == 2 * static_cast<int64_t>(size_)) {
    store_.del(go);
    store_.del(counter);
  }
}

void Comm::send(Op &op, const mncl_coll_v1_t &c) {
  const int peer = c.root;
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: bad peer %d", op.where().c_str(), peer));
  }
  const size_t len = c.count * kit::dtype_size(c.dtype);
  const uint64_t k = sent_[static_cast<size_t>(peer)];
  put(op, kit::format("p%d>%d/%llu", rank_, peer, static_cast<unsigned long long>(k)), c.sendbuf,
      len);
  ++sent_[static_cast<size_t>(peer)];
}

void Comm::recv(Op &op, const mncl_coll_v1_t &c) {
  const int peer = c.root;
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("%s: bad peer %d", op.where().c_str(), peer));
  }
  const size_t len = c.count * kit::dtype_size(c.dtype);
  // Every recv takes its message number, whatever happens: messages between a pair match in
  // issue order (mncl.h), so a recv that failed (a mismatch, a timeout) still used up message
  // #k, and the next recv must read #k+1, not #k again (which would match it to the wrong send).
  const uint64_t k = received_[static_cast<size_t>(peer)]++;
  op.noun = kit::format("message #%llu", static_cast<unsigned long long>(k));
  const std::string key =
      kit::format("p%d>%d/%llu", peer, rank_, static_cast<unsigned long long>(k));
  Value value;
  const mncl_status_t st = store_.get(key, op.remaining_ms(), &value);
  if (st != MNCL_OK) throw_missing(op, st, {peer});
  store_.del(key);  // its only reader, even when the check below fails
  check_length(op, peer, value, len);
  if (len > 0) std::memcpy(c.recvbuf, payload(value), len);
}

}  // namespace mncl::naive

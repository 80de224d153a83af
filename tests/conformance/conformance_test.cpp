// The MNCL conformance suite: an SPMD GoogleTest binary. Every rank runs the same tests in the
// same order on one world communicator created from the environment, so the binary runs
// unchanged under mncl-run (any backend) or mpirun:
//
//   mncl-run -n 4 --backend naive -- conformance_test [--gtest_filter=...]
//
// Only the public C API is used. Data are small integers, so every backend must produce
// bit-exact results whatever its summation order, and buffers are compared with memcmp.
// Rank 0 prints the usual gtest output; other ranks print only their failures and a summary
// (MNCL_CONFORMANCE_ALL_OUTPUT=1 gives every rank the full output). MNCL_CONFORMANCE_P2P_BOUND
// (seconds) overrides how long a phase of the ConcurrentP2P tests may take (see p2p_bound_ms).
#include <gtest/gtest.h>
#include <mncl/mncl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mncl_test_data.h"

namespace {

// The element codec and the reduction data, shared with coalesced_test.
using mncl_testing::elem_size;
using mncl_testing::encode;
using mncl_testing::hash3;
using mncl_testing::is_signed;

mncl_comm_t g_comm = nullptr;
int g_rank = 0;
int g_size = 1;

constexpr mncl_dtype_t kDtypes[] = {MNCL_INT8,    MNCL_UINT8,  MNCL_INT32,   MNCL_UINT32,
                                    MNCL_INT64,   MNCL_UINT64, MNCL_FLOAT16, MNCL_BFLOAT16,
                                    MNCL_FLOAT32, MNCL_FLOAT64};
constexpr mncl_op_t kOps[] = {MNCL_SUM, MNCL_PROD, MNCL_MIN, MNCL_MAX, MNCL_AVG};
// Count 0, 1 and a prime (no power-of-two or block-size alignment for algorithms to rely on).
constexpr size_t kCounts[] = {0, 1, 1021};
// The multi-MiB case (6 MB of float32), run on a few dtype/op pairs per collective only: the
// naive backend moves everything through the bootstrap store.
constexpr size_t kLarge = 1500007;

// ---------------------------------------------------------------------------------------------
// Failure handling
// ---------------------------------------------------------------------------------------------

// A collective that failed on this rank may have succeeded on others; every later collective
// would then pair up wrongly and wait for the timeout. So an unexpected error ends this rank
// at once (the launcher then stops the others) instead of timing out test after test.
[[noreturn]] void die_desynchronized(const char *call, mncl_status_t st) {
  const char *test = "";
  if (auto *info = ::testing::UnitTest::GetInstance()->current_test_info()) test = info->name();
  std::fprintf(stderr,
               "rank %d: FATAL in %s: %s returned %s: %s\n"
               "rank %d: stopping: later collectives could no longer match across ranks\n",
               g_rank, test, call, mncl_status_string(st), mncl_last_error(), g_rank);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);  // no static destructors while backend threads may still run
}

#define MNCL_CALL(call)                                 \
  do {                                                  \
    mncl_status_t st_ = (call);                         \
    if (st_ != MNCL_OK) die_desynchronized(#call, st_); \
  } while (0)

// A call expected to fail locally with `status` and a message.
#define EXPECT_MNCL_ERROR(status, call)                                          \
  do {                                                                           \
    mncl_status_t st_ = (call);                                                  \
    EXPECT_EQ(st_, (status)) << #call << ": " << mncl_status_string(st_);        \
    EXPECT_STRNE(mncl_last_error(), "") << #call << " failed without a message"; \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Data types
// ---------------------------------------------------------------------------------------------

const char *dtype_str(mncl_dtype_t dt) {
  static const char *names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                "uint64", "float16", "bfloat16", "float32", "float64"};
  return names[dt];
}
const char *op_str(mncl_op_t op) {
  static const char *names[] = {"sum", "prod", "min", "max", "avg"};
  return names[op];
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    uint32_t x;
    std::memcpy(&x, &f, 4);
    x |= sign;
    std::memcpy(&f, &x, 4);
    return f;
  }
  uint32_t x = sign | (exp == 31 ? 0x7f800000u | (mant << 13) : ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &x, 4);
  return f;
}

float bf16_to_float(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// An element as text, for failure messages.
std::string element_str(mncl_dtype_t dt, const void *p) {
  std::ostringstream s;
  switch (dt) {
    case MNCL_INT8:
      s << static_cast<int>(*static_cast<const int8_t *>(p));
      break;
    case MNCL_UINT8:
      s << static_cast<int>(*static_cast<const uint8_t *>(p));
      break;
    case MNCL_INT32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      s << x;
      break;
    }
    case MNCL_UINT32: {
      uint32_t x;
      std::memcpy(&x, p, 4);
      s << x;
      break;
    }
    case MNCL_INT64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      s << x;
      break;
    }
    case MNCL_UINT64: {
      uint64_t x;
      std::memcpy(&x, p, 8);
      s << x;
      break;
    }
    case MNCL_FLOAT16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      s << half_to_float(x);
      break;
    }
    case MNCL_BFLOAT16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      s << bf16_to_float(x);
      break;
    }
    case MNCL_FLOAT32: {
      float x;
      std::memcpy(&x, p, 4);
      s << x;
      break;
    }
    case MNCL_FLOAT64: {
      double x;
      std::memcpy(&x, p, 8);
      s << x;
      break;
    }
  }
  return s.str();
}

// A typed host buffer. At least one element is allocated so that count 0 still passes real,
// distinct pointers (and in-place pointer equality stays meaningful).
class Buf {
 public:
  Buf(mncl_dtype_t dt, size_t count)
      : dt_(dt), count_(count), bytes_(std::max<size_t>(count, 1) * elem_size(dt), 0xA5) {}
  mncl_dtype_t dtype() const { return dt_; }
  size_t count() const { return count_; }
  void *data() { return bytes_.data(); }
  const void *data() const { return bytes_.data(); }
  void *at(size_t i) { return bytes_.data() + i * elem_size(dt_); }
  const void *at(size_t i) const { return bytes_.data() + i * elem_size(dt_); }
  void set(size_t i, int64_t v) { encode(dt_, v, at(i)); }
  // Element i of `src` copied into element j of this buffer.
  void copy_from(size_t j, const Buf &src, size_t i, size_t n) {
    if (n) std::memcpy(at(j), src.at(i), n * elem_size(dt_));
  }

 private:
  mncl_dtype_t dt_;
  size_t count_;
  std::vector<uint8_t> bytes_;
};

// Compares elements [0, n) of got with want (both of want's dtype); names up to 5 mismatches.
void expect_same(const Buf &got, size_t got_offset, const Buf &want, size_t want_offset, size_t n,
                 const std::string &what) {
  const size_t es = elem_size(want.dtype());
  if (n == 0 || std::memcmp(got.at(got_offset), want.at(want_offset), n * es) == 0) return;
  std::ostringstream msg;
  msg << "rank " << g_rank << "/" << g_size << ": " << what << ": wrong data;";
  size_t shown = 0, wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got.at(got_offset + i), want.at(want_offset + i), es) == 0) continue;
    ++wrong;
    if (shown++ < 5) {
      msg << " [" << i << "] got " << element_str(want.dtype(), got.at(got_offset + i)) << " want "
          << element_str(want.dtype(), want.at(want_offset + i)) << ";";
    }
  }
  msg << " " << wrong << " of " << n << " elements differ";
  ADD_FAILURE() << msg.str();
}
void expect_same(const Buf &got, const Buf &want, const std::string &what) {
  EXPECT_EQ(got.count(), want.count()) << what;
  expect_same(got, 0, want, 0, std::min(got.count(), want.count()), what);
}

// ---------------------------------------------------------------------------------------------
// Deterministic data, per (rank, index, seed)
// ---------------------------------------------------------------------------------------------

// Payload for data-movement collectives: distinct-looking values exact in every dtype
// (|v| <= 125 fits int8; every integer up to 256 is exact in bfloat16).
int64_t pattern(mncl_dtype_t dt, int rank, size_t i, int seed) {
  const int64_t h = static_cast<int64_t>(hash3(rank, i, seed) % 251);
  return is_signed(dt) ? h - 125 : h;
}

// The mncl_testing::reduce_input values of `rank` for elements [0, count) with seed.
Buf reduce_data(mncl_dtype_t dt, mncl_op_t op, int rank, size_t count, int seed) {
  Buf b(dt, count);
  for (size_t i = 0; i < count; ++i)
    b.set(i, mncl_testing::reduce_input(dt, op, rank, g_size, i, seed));
  return b;
}
// The reduction over all ranks of elements [first, first + count) of reduce_data.
Buf reduce_expected(mncl_dtype_t dt, mncl_op_t op, size_t first, size_t count, int seed) {
  Buf b(dt, count);
  for (size_t i = 0; i < count; ++i) {
    b.set(i, mncl_testing::reduce_output(dt, op, g_size, first + i, seed));
  }
  return b;
}
Buf pattern_data(mncl_dtype_t dt, int rank, size_t count, int seed) {
  Buf b(dt, count);
  for (size_t i = 0; i < count; ++i) b.set(i, pattern(dt, rank, i, seed));
  return b;
}

// Distinct roots: first, middle, last.
std::vector<int> roots() {
  std::set<int> s = {0, g_size / 2, g_size - 1};
  return {s.begin(), s.end()};
}

std::string describe(const char *coll, mncl_dtype_t dt, size_t count, const char *extra = "") {
  std::ostringstream s;
  s << coll << " " << dtype_str(dt) << " count " << count << extra;
  return s.str();
}
std::string where(int root, bool in_place) {
  return std::string(" root ") + std::to_string(root) + (in_place ? " in-place" : " out-of-place");
}

// ---------------------------------------------------------------------------------------------
// One check per collective form; the parameterised tests and the large cases share them.
// ---------------------------------------------------------------------------------------------

void check_allreduce(mncl_dtype_t dt, mncl_op_t op, size_t count, bool in_place, int seed) {
  const std::string what =
      describe("allreduce", dt, count, in_place ? " in-place" : "") + " " + op_str(op);
  const Buf send = reduce_data(dt, op, g_rank, count, seed);
  const Buf want = reduce_expected(dt, op, 0, count, seed);
  if (in_place) {
    Buf buf = send;
    MNCL_CALL(mncl_allreduce(g_comm, buf.data(), buf.data(), count, dt, op, nullptr));
    expect_same(buf, want, what);
  } else {
    Buf recv(dt, count);
    const Buf send_copy = send;
    MNCL_CALL(mncl_allreduce(g_comm, send.data(), recv.data(), count, dt, op, nullptr));
    expect_same(recv, want, what);
    expect_same(send, send_copy, what + " (sendbuf must stay unchanged)");
  }
}

// Non-roots pass a separate recvbuf that must stay untouched (out-of-place form) or NULL
// (in-place form): mncl.h says recvbuf is ignored there.
void check_reduce(mncl_dtype_t dt, mncl_op_t op, size_t count, int root, bool in_place, int seed) {
  const std::string what =
      describe("reduce", dt, count, where(root, in_place).c_str()) + " " + op_str(op);
  const Buf send = reduce_data(dt, op, g_rank, count, seed);
  const bool is_root = g_rank == root;
  if (is_root && in_place) {
    Buf buf = send;
    MNCL_CALL(mncl_reduce(g_comm, buf.data(), buf.data(), count, dt, op, root, nullptr));
    expect_same(buf, reduce_expected(dt, op, 0, count, seed), what);
    return;
  }
  Buf recv(dt, count);
  const Buf untouched = recv;
  void *recvbuf = (!is_root && in_place) ? nullptr : recv.data();
  MNCL_CALL(mncl_reduce(g_comm, send.data(), recvbuf, count, dt, op, root, nullptr));
  if (is_root) {
    expect_same(recv, reduce_expected(dt, op, 0, count, seed), what);
  } else {
    expect_same(recv, untouched, what + " (a non-root's recvbuf must stay untouched)");
  }
  expect_same(send, reduce_data(dt, op, g_rank, count, seed),
              what + " (sendbuf must stay unchanged)");
}

void check_bcast(mncl_dtype_t dt, size_t count, int root, int seed) {
  const std::string what = describe("bcast", dt, count, where(root, true).c_str());
  const Buf want = pattern_data(dt, root, count, seed);
  Buf buf = g_rank == root ? want : Buf(dt, count);
  MNCL_CALL(mncl_bcast(g_comm, buf.data(), count, dt, root, nullptr));
  expect_same(buf, want, what);
}

// Root's sendbuf holds pattern(root, j) for j in [0, size*count).
void check_scatter(mncl_dtype_t dt, size_t count, int root, bool in_place, int seed) {
  const std::string what = describe("scatter", dt, count, where(root, in_place).c_str());
  const size_t total = count * static_cast<size_t>(g_size);
  const Buf all = pattern_data(dt, root, total, seed);
  Buf want(dt, count);
  want.copy_from(0, all, static_cast<size_t>(g_rank) * count, count);
  if (g_rank == root) {
    Buf send = all;
    if (in_place) {
      MNCL_CALL(mncl_scatter(g_comm, send.data(), send.at(static_cast<size_t>(g_rank) * count),
                             count, dt, root, nullptr));
      expect_same(send, all, what + " (root's sendbuf, own block in place)");
    } else {
      Buf recv(dt, count);
      MNCL_CALL(mncl_scatter(g_comm, send.data(), recv.data(), count, dt, root, nullptr));
      expect_same(recv, want, what);
      expect_same(send, all, what + " (sendbuf must stay unchanged)");
    }
  } else {
    Buf recv(dt, count);
    MNCL_CALL(mncl_scatter(g_comm, nullptr, recv.data(), count, dt, root, nullptr));
    expect_same(recv, want, what);
  }
}

// Rank r sends pattern(r, i); root's block r must hold it.
void check_gather(mncl_dtype_t dt, size_t count, int root, bool in_place, int seed) {
  const std::string what = describe("gather", dt, count, where(root, in_place).c_str());
  const size_t total = count * static_cast<size_t>(g_size);
  const Buf mine = pattern_data(dt, g_rank, count, seed);
  if (g_rank == root) {
    Buf want(dt, total);
    for (int r = 0; r < g_size; ++r)
      want.copy_from(static_cast<size_t>(r) * count, pattern_data(dt, r, count, seed), 0, count);
    Buf recv(dt, total);
    if (in_place) {
      recv.copy_from(static_cast<size_t>(g_rank) * count, mine, 0, count);
      MNCL_CALL(mncl_gather(g_comm, recv.at(static_cast<size_t>(g_rank) * count), recv.data(),
                            count, dt, root, nullptr));
    } else {
      MNCL_CALL(mncl_gather(g_comm, mine.data(), recv.data(), count, dt, root, nullptr));
    }
    expect_same(recv, want, what);
  } else {
    Buf recv(dt, total);
    const Buf untouched = recv;
    MNCL_CALL(mncl_gather(g_comm, mine.data(), in_place ? nullptr : recv.data(), count, dt, root,
                          nullptr));
    expect_same(recv, untouched, what + " (a non-root's recvbuf must stay untouched)");
  }
  expect_same(mine, pattern_data(dt, g_rank, count, seed), what + " (sendbuf must stay unchanged)");
}

void check_allgather(mncl_dtype_t dt, size_t count, bool in_place, int seed) {
  const std::string what = describe("allgather", dt, count, in_place ? " in-place" : "");
  const size_t total = count * static_cast<size_t>(g_size);
  Buf want(dt, total);
  for (int r = 0; r < g_size; ++r)
    want.copy_from(static_cast<size_t>(r) * count, pattern_data(dt, r, count, seed), 0, count);
  const Buf mine = pattern_data(dt, g_rank, count, seed);
  Buf recv(dt, total);
  if (in_place) {
    recv.copy_from(static_cast<size_t>(g_rank) * count, mine, 0, count);
    MNCL_CALL(mncl_allgather(g_comm, recv.at(static_cast<size_t>(g_rank) * count), recv.data(),
                             count, dt, nullptr));
  } else {
    MNCL_CALL(mncl_allgather(g_comm, mine.data(), recv.data(), count, dt, nullptr));
  }
  expect_same(recv, want, what);
}

// Rank r's sendbuf holds reduce_input(r, j) for j in [0, size*count); rank r receives the
// reduction of block r.
void check_reduce_scatter(mncl_dtype_t dt, mncl_op_t op, size_t count, bool in_place, int seed) {
  const std::string what =
      describe("reduce_scatter", dt, count, in_place ? " in-place" : "") + " " + op_str(op);
  const size_t total = count * static_cast<size_t>(g_size);
  const Buf send = reduce_data(dt, op, g_rank, total, seed);
  const Buf want = reduce_expected(dt, op, static_cast<size_t>(g_rank) * count, count, seed);
  if (in_place) {
    Buf buf = send;
    MNCL_CALL(mncl_reduce_scatter(g_comm, buf.data(), buf.at(static_cast<size_t>(g_rank) * count),
                                  count, dt, op, nullptr));
    expect_same(buf, static_cast<size_t>(g_rank) * count, want, 0, count, what);
  } else {
    Buf recv(dt, count);
    MNCL_CALL(mncl_reduce_scatter(g_comm, send.data(), recv.data(), count, dt, op, nullptr));
    expect_same(recv, want, what);
    expect_same(send, reduce_data(dt, op, g_rank, total, seed),
                what + " (sendbuf must stay unchanged)");
  }
}

// Block j of rank i's sendbuf is pattern(i, j*count + k); it lands in block i of rank j.
void check_alltoall(mncl_dtype_t dt, size_t count, bool in_place, int seed) {
  const std::string what = describe("alltoall", dt, count, in_place ? " in-place" : "");
  const size_t total = count * static_cast<size_t>(g_size);
  const Buf send = pattern_data(dt, g_rank, total, seed);
  Buf want(dt, total);
  for (int i = 0; i < g_size; ++i) {
    const Buf theirs = pattern_data(dt, i, total, seed);
    want.copy_from(static_cast<size_t>(i) * count, theirs, static_cast<size_t>(g_rank) * count,
                   count);
  }
  if (in_place) {
    Buf buf = send;
    MNCL_CALL(mncl_alltoall(g_comm, buf.data(), buf.data(), count, dt, nullptr));
    expect_same(buf, want, what);
  } else {
    Buf recv(dt, count * static_cast<size_t>(g_size));
    MNCL_CALL(mncl_alltoall(g_comm, send.data(), recv.data(), count, dt, nullptr));
    expect_same(recv, want, what);
  }
}

// Ring: rank r sends pattern(r) to r+1 and receives pattern(r-1) from r-1. Even ranks send
// first and odd ranks receive first, so it also works where a blocking send waits for the
// receiver (and for odd sizes: the chain unwinds from the odd rank that receives first).
void check_ring(mncl_dtype_t dt, size_t count, int seed) {
  const std::string what = describe("send/recv ring", dt, count);
  const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  const Buf mine = pattern_data(dt, g_rank, count, seed);
  Buf got(dt, count);
  if (g_rank % 2 == 0) {
    MNCL_CALL(mncl_send(g_comm, mine.data(), count, dt, next, nullptr));
    MNCL_CALL(mncl_recv(g_comm, got.data(), count, dt, prev, nullptr));
  } else {
    MNCL_CALL(mncl_recv(g_comm, got.data(), count, dt, prev, nullptr));
    MNCL_CALL(mncl_send(g_comm, mine.data(), count, dt, next, nullptr));
  }
  expect_same(got, pattern_data(dt, prev, count, seed), what);
}

// Pairs (0,1), (2,3)...: several messages of different sizes each way must match in issue
// order. The lower rank sends all first; the higher one receives all first.
void check_pairwise(mncl_dtype_t dt, int seed) {
  const int partner = g_rank ^ 1;
  if (partner >= g_size) return;  // the odd one out of an odd size
  const size_t counts[] = {1, 1021, 0, 7};
  auto send_all = [&] {
    for (size_t m = 0; m < 4; ++m) {
      const Buf msg = pattern_data(dt, g_rank, counts[m], seed + static_cast<int>(m));
      MNCL_CALL(mncl_send(g_comm, msg.data(), counts[m], dt, partner, nullptr));
    }
  };
  auto recv_all = [&] {
    for (size_t m = 0; m < 4; ++m) {
      Buf got(dt, counts[m]);
      MNCL_CALL(mncl_recv(g_comm, got.data(), counts[m], dt, partner, nullptr));
      expect_same(got, pattern_data(dt, partner, counts[m], seed + static_cast<int>(m)),
                  describe("send/recv pairwise", dt, counts[m]) + " message " + std::to_string(m));
    }
  };
  if (g_rank < partner) {
    send_all();
    recv_all();
  } else {
    recv_all();
    send_all();
  }
}

// nbufs allreduces in one call; in_place_mask selects which buffers are in place.
void check_coalesced(mncl_dtype_t dt, mncl_op_t op, const std::vector<size_t> &counts,
                     unsigned in_place_mask, int seed) {
  std::vector<Buf> send, recv, want;
  std::vector<const void *> sendbufs;
  std::vector<void *> recvbufs;
  for (size_t b = 0; b < counts.size(); ++b) {
    send.push_back(reduce_data(dt, op, g_rank, counts[b], seed + static_cast<int>(b)));
    recv.emplace_back(dt, counts[b]);
    want.push_back(reduce_expected(dt, op, 0, counts[b], seed + static_cast<int>(b)));
  }
  for (size_t b = 0; b < counts.size(); ++b) {
    const bool in_place = (in_place_mask >> b) & 1u;
    if (in_place) recv[b] = send[b];
    sendbufs.push_back(in_place ? recv[b].data() : send[b].data());
    recvbufs.push_back(recv[b].data());
  }
  MNCL_CALL(mncl_allreduce_coalesced(g_comm, sendbufs.data(), recvbufs.data(), counts.data(),
                                     counts.size(), dt, op, nullptr));
  for (size_t b = 0; b < counts.size(); ++b) {
    expect_same(recv[b], want[b],
                describe("allreduce_coalesced", dt, counts[b]) + " " + op_str(op) + " buffer " +
                    std::to_string(b) + (((in_place_mask >> b) & 1u) ? " in-place" : ""));
  }
}

// Counts per rank (allgatherv) or per pair (alltoallv), and where the blocks go. Shapes mix
// zeros, small and (kLarge) multi-slot blocks; layouts are packed in rank order, or reversed
// with gaps whose elements (Buf's fill) must come back untouched.
enum class VShape { kUneven, kLarge };
enum class VLayout { kPacked, kReversedWithGaps };
size_t v_count(VShape shape, int from, int to, int seed) {
  const uint64_t h = hash3(from, static_cast<size_t>(to), seed);
  if (shape == VShape::kUneven) return h % 4 == 0 ? 0 : h % 13;  // some blocks empty
  return (from + to) % 3 == 0 ? 0 : 3000 + h % 9000;  // up to ~12 K elements (96 KiB in fp64)
}
// Displacements of blocks of `counts`; *extent receives the elements the buffer needs.
std::vector<size_t> v_displs(VLayout layout, const std::vector<size_t> &counts, size_t *extent) {
  std::vector<size_t> d(counts.size());
  size_t at = layout == VLayout::kPacked ? 0 : 5;
  for (size_t k = 0; k < counts.size(); ++k) {
    const size_t r = layout == VLayout::kPacked ? k : counts.size() - 1 - k;
    d[r] = at;
    at += counts[r] + (layout == VLayout::kPacked ? 0 : 3);
  }
  *extent = at;
  return d;
}
std::string v_describe(const char *coll, mncl_dtype_t dt, VShape shape, VLayout layout,
                       bool in_place) {
  std::ostringstream s;
  s << coll << " " << dtype_str(dt) << (shape == VShape::kUneven ? " uneven" : " large")
    << (layout == VLayout::kPacked ? " packed" : " reversed-with-gaps")
    << (in_place ? " in-place" : "");
  return s.str();
}

// Rank r contributes pattern(r, k) for k < v_count(shape, r, 0); every rank receives all.
void check_allgatherv(mncl_dtype_t dt, VShape shape, VLayout layout, bool in_place, int seed,
                      bool nonblocking = false) {
  const std::string what = v_describe("allgatherv", dt, shape, layout, in_place);
  std::vector<size_t> counts(static_cast<size_t>(g_size));
  for (int r = 0; r < g_size; ++r) counts[static_cast<size_t>(r)] = v_count(shape, r, 0, seed);
  size_t extent = 0;
  const std::vector<size_t> displs = v_displs(layout, counts, &extent);
  Buf recv(dt, extent);
  Buf want = recv;  // gaps keep Buf's fill
  for (int r = 0; r < g_size; ++r) {
    const size_t u = static_cast<size_t>(r);
    want.copy_from(displs[u], pattern_data(dt, r, counts[u], seed), 0, counts[u]);
  }
  const size_t me = static_cast<size_t>(g_rank);
  const Buf mine = pattern_data(dt, g_rank, counts[me], seed);
  const void *send = mine.data();
  if (in_place) {
    recv.copy_from(displs[me], mine, 0, counts[me]);
    send = recv.at(displs[me]);
  }
  if (nonblocking) {
    mncl_request_t req = nullptr;
    MNCL_CALL(mncl_iallgatherv(g_comm, send, counts[me], recv.data(), counts.data(), displs.data(),
                               dt, nullptr, &req));
    MNCL_CALL(mncl_wait(req, -1));
  } else {
    MNCL_CALL(mncl_allgatherv(g_comm, send, counts[me], recv.data(), counts.data(), displs.data(),
                              dt, nullptr));
  }
  expect_same(recv, want, what);
  if (!in_place) {
    expect_same(mine, pattern_data(dt, g_rank, counts[me], seed),
                what + " (sendbuf must stay unchanged)");
  }
}

// The block from rank i to rank j holds pattern(i, k) with seed + 31 * j.
void check_alltoallv(mncl_dtype_t dt, VShape shape, VLayout layout, int seed,
                     bool nonblocking = false) {
  const std::string what = v_describe("alltoallv", dt, shape, layout, false);
  const size_t n = static_cast<size_t>(g_size);
  std::vector<size_t> sendcounts(n), recvcounts(n);
  for (int p = 0; p < g_size; ++p) {
    sendcounts[static_cast<size_t>(p)] = v_count(shape, g_rank, p, seed);
    recvcounts[static_cast<size_t>(p)] = v_count(shape, p, g_rank, seed);
  }
  size_t send_extent = 0, recv_extent = 0;
  // The send side uses the other layout, so both layouts meet on both sides across the cases.
  const VLayout other = layout == VLayout::kPacked ? VLayout::kReversedWithGaps : VLayout::kPacked;
  const std::vector<size_t> sdispls = v_displs(other, sendcounts, &send_extent);
  const std::vector<size_t> rdispls = v_displs(layout, recvcounts, &recv_extent);
  Buf send(dt, send_extent);
  for (int p = 0; p < g_size; ++p) {
    const size_t u = static_cast<size_t>(p);
    send.copy_from(sdispls[u], pattern_data(dt, g_rank, sendcounts[u], seed + 31 * p), 0,
                   sendcounts[u]);
  }
  const Buf send_copy = send;
  Buf recv(dt, recv_extent);
  Buf want = recv;
  for (int p = 0; p < g_size; ++p) {
    const size_t u = static_cast<size_t>(p);
    want.copy_from(rdispls[u], pattern_data(dt, p, recvcounts[u], seed + 31 * g_rank), 0,
                   recvcounts[u]);
  }
  if (nonblocking) {
    mncl_request_t req = nullptr;
    MNCL_CALL(mncl_ialltoallv(g_comm, send.data(), sendcounts.data(), sdispls.data(), recv.data(),
                              recvcounts.data(), rdispls.data(), dt, nullptr, &req));
    MNCL_CALL(mncl_wait(req, -1));
  } else {
    MNCL_CALL(mncl_alltoallv(g_comm, send.data(), sendcounts.data(), sdispls.data(), recv.data(),
                             recvcounts.data(), rdispls.data(), dt, nullptr));
  }
  expect_same(recv, want, what);
  expect_same(send, send_copy, what + " (sendbuf must stay unchanged)");
}

// gatherv: rank r sends pattern(r, k) for k < v_count(shape, r, root); the root's blocks, laid
// out per `layout`, hold them and its gaps stay untouched. Non-roots pass NULL for what only
// the root reads.
void check_gatherv(mncl_dtype_t dt, VShape shape, VLayout layout, int root, bool in_place, int seed,
                   bool nonblocking = false) {
  const std::string what = v_describe("gatherv", dt, shape, layout, false) + where(root, in_place);
  const size_t n = static_cast<size_t>(g_size), me = static_cast<size_t>(g_rank);
  std::vector<size_t> counts(n);
  for (int r = 0; r < g_size; ++r) counts[static_cast<size_t>(r)] = v_count(shape, r, root, seed);
  const Buf mine = pattern_data(dt, g_rank, counts[me], seed);
  const bool is_root = g_rank == root;
  size_t extent = 0;
  const std::vector<size_t> displs = v_displs(layout, counts, &extent);
  Buf recv(dt, is_root ? extent : 0);
  Buf want = recv;  // gaps keep Buf's fill
  const void *send = mine.data();
  if (is_root) {
    for (int r = 0; r < g_size; ++r) {
      const size_t u = static_cast<size_t>(r);
      want.copy_from(displs[u], pattern_data(dt, r, counts[u], seed), 0, counts[u]);
    }
    if (in_place) {
      recv.copy_from(displs[me], mine, 0, counts[me]);
      send = recv.at(displs[me]);
    }
  }
  void *recvbuf = is_root ? recv.data() : nullptr;
  const size_t *rc = is_root ? counts.data() : nullptr, *rd = is_root ? displs.data() : nullptr;
  if (nonblocking) {
    mncl_request_t req = nullptr;
    MNCL_CALL(mncl_igatherv(g_comm, send, counts[me], recvbuf, rc, rd, dt, root, nullptr, &req));
    MNCL_CALL(mncl_wait(req, -1));
  } else {
    MNCL_CALL(mncl_gatherv(g_comm, send, counts[me], recvbuf, rc, rd, dt, root, nullptr));
  }
  if (is_root) expect_same(recv, want, what);
  expect_same(mine, pattern_data(dt, g_rank, counts[me], seed),
              what + " (sendbuf must stay unchanged)");
}

// scatterv: the root's block for rank r (v_count(shape, root, r) elements at displs[r]) holds
// pattern(r, k); rank r receives it. `overlapping`: every block is the same one (displs 0).
void check_scatterv(mncl_dtype_t dt, VShape shape, VLayout layout, int root, bool in_place,
                    int seed, bool nonblocking = false, bool overlapping = false) {
  const std::string what = v_describe("scatterv", dt, shape, layout, false) +
                           where(root, in_place) + (overlapping ? " overlapping blocks" : "");
  const size_t n = static_cast<size_t>(g_size), me = static_cast<size_t>(g_rank);
  std::vector<size_t> counts(n);
  for (int r = 0; r < g_size; ++r) {
    counts[static_cast<size_t>(r)] =
        overlapping ? v_count(shape, root, 0, seed) + 1 : v_count(shape, root, r, seed);
  }
  const bool is_root = g_rank == root;
  size_t extent = 0;
  std::vector<size_t> displs = v_displs(layout, counts, &extent);
  if (overlapping) {
    displs.assign(n, 0);
    extent = counts[0];
  }
  Buf send(dt, is_root ? extent : 0);
  if (is_root) {
    for (int r = 0; r < g_size; ++r) {
      const size_t u = static_cast<size_t>(r);
      const int owner = overlapping ? 0 : r;  // the one block everybody receives
      send.copy_from(displs[u], pattern_data(dt, owner, counts[u], seed), 0, counts[u]);
    }
  }
  const Buf send_copy = send;
  const Buf want = pattern_data(dt, overlapping ? 0 : g_rank, counts[me], seed);
  Buf recv(dt, counts[me] + 1);  // one guard element past the block, which must keep its fill
  const Buf fill = recv;
  void *recvbuf = is_root && in_place ? send.at(displs[me]) : recv.data();
  const void *sendbuf = is_root ? send.data() : nullptr;
  const size_t *sc = is_root ? counts.data() : nullptr, *sd = is_root ? displs.data() : nullptr;
  if (nonblocking) {
    mncl_request_t req = nullptr;
    MNCL_CALL(
        mncl_iscatterv(g_comm, sendbuf, sc, sd, recvbuf, counts[me], dt, root, nullptr, &req));
    MNCL_CALL(mncl_wait(req, -1));
  } else {
    MNCL_CALL(mncl_scatterv(g_comm, sendbuf, sc, sd, recvbuf, counts[me], dt, root, nullptr));
  }
  if (is_root && in_place) {
    expect_same(send, displs[me], want, 0, counts[me], what);
    expect_same(recv, fill, what + " (recv, unused in place, must stay untouched)");
  } else {
    expect_same(recv, 0, want, 0, counts[me], what);
    expect_same(recv, counts[me], fill, counts[me], 1, what + " (the element after the block)");
  }
  expect_same(send, send_copy, what + " (the root's sendbuf must stay unchanged)");
}

// ---------------------------------------------------------------------------------------------
// Environment and output
// ---------------------------------------------------------------------------------------------

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const mncl_status_t st = mncl_comm_create(nullptr, &g_comm);
    ASSERT_EQ(st, MNCL_OK) << "mncl_comm_create: " << mncl_status_string(st) << ": "
                           << mncl_last_error();
    ASSERT_EQ(mncl_comm_rank(g_comm, &g_rank), MNCL_OK);
    ASSERT_EQ(mncl_comm_size(g_comm, &g_size), MNCL_OK);
  }
  void TearDown() override {
    if (!g_comm) return;
    const mncl_status_t st = mncl_comm_destroy(g_comm);
    EXPECT_EQ(st, MNCL_OK) << "mncl_comm_destroy: " << mncl_last_error();
    g_comm = nullptr;
  }
};

// Output of ranks other than 0: failures (with the rank) and a one-line summary.
// The current test is remembered here: UnitTest::current_test_info() would deadlock inside
// OnTestPartResult, which gtest calls with its own mutex held.
class FailurePrinter : public ::testing::EmptyTestEventListener {
  const ::testing::TestInfo *test_ = nullptr;
  void OnTestStart(const ::testing::TestInfo &info) override { test_ = &info; }
  void OnTestEnd(const ::testing::TestInfo &) override { test_ = nullptr; }
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (!r.failed()) return;
    std::printf("[  FAILED  ] rank %d: %s%s%s\n%s:%d: %s\n", g_rank,
                test_ ? test_->test_suite_name() : "(global)", test_ ? "." : "",
                test_ ? test_->name() : "", r.file_name() ? r.file_name() : "?", r.line_number(),
                r.message());
    std::fflush(stdout);
  }
  void OnTestProgramEnd(const ::testing::UnitTest &u) override {
    std::printf("rank %d: %s: %d tests ran, %d passed, %d failed%s (%.1f s)\n", g_rank,
                u.Passed() ? "PASS" : "FAIL", u.test_to_run_count(), u.successful_test_count(),
                u.failed_test_count(),
                u.ad_hoc_test_result().Failed() ? ", global set-up or tear-down failed" : "",
                static_cast<double>(u.elapsed_time()) / 1000.0);
    std::fflush(stdout);
  }
};

// Every test runs on a live world communicator.
class Conformance : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(g_comm, nullptr) << "no world communicator"; }
};

using DtypeOp = std::tuple<mncl_dtype_t, mncl_op_t>;
class ReductionTest : public Conformance, public ::testing::WithParamInterface<DtypeOp> {
 protected:
  mncl_dtype_t dt() const { return std::get<0>(GetParam()); }
  mncl_op_t op() const { return std::get<1>(GetParam()); }
};
class DtypeTest : public Conformance, public ::testing::WithParamInterface<mncl_dtype_t> {
 protected:
  mncl_dtype_t dt() const { return GetParam(); }
};

std::string dtype_op_name(const ::testing::TestParamInfo<DtypeOp> &p) {
  return std::string(dtype_str(std::get<0>(p.param))) + "_" + op_str(std::get<1>(p.param));
}
std::string dtype_name(const ::testing::TestParamInfo<mncl_dtype_t> &p) {
  return dtype_str(p.param);
}

// ---------------------------------------------------------------------------------------------
// Library and communicator queries
// ---------------------------------------------------------------------------------------------

TEST(Library, VersionAndNames) {
  const int v = mncl_get_version();
  EXPECT_GE(v, MNCL_VERSION);
  EXPECT_EQ(v / 10000, MNCL_VERSION_MAJOR) << "a library of another major version";
  for (mncl_dtype_t dt : kDtypes) {
    EXPECT_EQ(mncl_dtype_size(dt), elem_size(dt)) << dtype_str(dt);
    EXPECT_STRNE(mncl_dtype_name(dt), "unknown");
    EXPECT_STRNE(mncl_dtype_name(dt), "");
  }
  EXPECT_STREQ(mncl_dtype_name(MNCL_FLOAT32), "float32");
  EXPECT_STREQ(mncl_op_name(MNCL_SUM), "sum");
  EXPECT_EQ(mncl_dtype_size(static_cast<mncl_dtype_t>(MNCL_NUM_DTYPES)), 0u);
  EXPECT_STREQ(mncl_dtype_name(static_cast<mncl_dtype_t>(MNCL_NUM_DTYPES)), "unknown");
  EXPECT_STREQ(mncl_op_name(static_cast<mncl_op_t>(MNCL_NUM_OPS)), "unknown");
  std::set<std::string> names;
  for (mncl_op_t op : kOps) names.insert(mncl_op_name(op));
  EXPECT_EQ(names.size(), static_cast<size_t>(MNCL_NUM_OPS)) << "op names must be distinct";
  for (int s = MNCL_OK; s <= MNCL_IN_PROGRESS; ++s) {
    const char *str = mncl_status_string(static_cast<mncl_status_t>(s));
    ASSERT_NE(str, nullptr);
    EXPECT_STRNE(str, "") << "status " << s;
  }
  EXPECT_NE(mncl_status_string(static_cast<mncl_status_t>(9999)), nullptr);
}

TEST_F(Conformance, CommQueries) {
  int rank = -1, size = -1;
  ASSERT_EQ(mncl_comm_rank(g_comm, &rank), MNCL_OK);
  ASSERT_EQ(mncl_comm_size(g_comm, &size), MNCL_OK);
  EXPECT_GE(size, 1);
  EXPECT_GE(rank, 0);
  EXPECT_LT(rank, size);
  if (const char *r = std::getenv("MNCL_RANK")) {
    EXPECT_EQ(rank, std::atoi(r));
  }
  if (const char *s = std::getenv("MNCL_SIZE")) {
    EXPECT_EQ(size, std::atoi(s));
  }
  const char *backend = nullptr;
  ASSERT_EQ(mncl_comm_backend(g_comm, &backend), MNCL_OK);
  ASSERT_NE(backend, nullptr);
  EXPECT_STRNE(backend, "");
  // A plain backend name must be the one chosen (not for "auto", lists or paths).
  const char *want = std::getenv("MNCL_BACKEND");
  if (want && *want && std::strcmp(want, "auto") != 0 && !std::strpbrk(want, ",/")) {
    EXPECT_STREQ(backend, want);
  }
}

// ---------------------------------------------------------------------------------------------
// Collectives: every dtype (x every op for reductions) x counts x roots x in-place forms
// ---------------------------------------------------------------------------------------------

using Allreduce = ReductionTest;
TEST_P(Allreduce, CountsAndForms) {
  for (size_t count : kCounts)
    for (bool in_place : {false, true}) check_allreduce(dt(), op(), count, in_place, 1);
}

using Reduce = ReductionTest;
TEST_P(Reduce, CountsRootsAndForms) {
  check_reduce(dt(), op(), 0, 0, false, 2);
  for (size_t count : {size_t{1}, size_t{1021}})
    for (int root : roots())
      for (bool in_place : {false, true}) check_reduce(dt(), op(), count, root, in_place, 2);
}

using ReduceScatter = ReductionTest;
TEST_P(ReduceScatter, CountsAndForms) {
  for (size_t count : kCounts)
    for (bool in_place : {false, true}) check_reduce_scatter(dt(), op(), count, in_place, 3);
}

using AllreduceCoalesced = ReductionTest;
TEST_P(AllreduceCoalesced, BuffersAndForms) {
  const std::vector<size_t> counts = {1, 0, 1021, 7};
  check_coalesced(dt(), op(), counts, 0u, 4);    // all out of place
  check_coalesced(dt(), op(), counts, 0xfu, 5);  // all in place
  check_coalesced(dt(), op(), counts, 0x5u, 6);  // mixed
  check_coalesced(dt(), op(), {}, 0u, 7);        // nothing to do
}

INSTANTIATE_TEST_SUITE_P(All, Allreduce,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::ValuesIn(kOps)),
                         dtype_op_name);
INSTANTIATE_TEST_SUITE_P(All, Reduce,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::ValuesIn(kOps)),
                         dtype_op_name);
INSTANTIATE_TEST_SUITE_P(All, ReduceScatter,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::ValuesIn(kOps)),
                         dtype_op_name);
INSTANTIATE_TEST_SUITE_P(All, AllreduceCoalesced,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::ValuesIn(kOps)),
                         dtype_op_name);

using Bcast = DtypeTest;
TEST_P(Bcast, CountsAndRoots) {
  for (size_t count : kCounts)
    for (int root : roots()) check_bcast(dt(), count, root, 10);
}

using Scatter = DtypeTest;
TEST_P(Scatter, CountsRootsAndForms) {
  for (size_t count : kCounts)
    for (int root : roots())
      for (bool in_place : {false, true}) check_scatter(dt(), count, root, in_place, 11);
}

using Gather = DtypeTest;
TEST_P(Gather, CountsRootsAndForms) {
  for (size_t count : kCounts)
    for (int root : roots())
      for (bool in_place : {false, true}) check_gather(dt(), count, root, in_place, 12);
}

using Allgather = DtypeTest;
TEST_P(Allgather, CountsAndForms) {
  for (size_t count : kCounts)
    for (bool in_place : {false, true}) check_allgather(dt(), count, in_place, 13);
}

using Alltoall = DtypeTest;
TEST_P(Alltoall, CountsAndForms) {
  for (size_t count : kCounts)
    for (bool in_place : {false, true}) check_alltoall(dt(), count, in_place, 14);
}

using SendRecv = DtypeTest;
TEST_P(SendRecv, RingAndPairwise) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  for (size_t count : kCounts) check_ring(dt(), count, 15);
  // At odd sizes one rank would sit the pairwise exchange out; that case has its own test at
  // the very end (PointToPointLast), so a failure there cannot derail the tests after it.
  if (g_size % 2 == 0) check_pairwise(dt(), 16);
}

using Allgatherv = DtypeTest;
TEST_P(Allgatherv, CountsLayoutsAndForms) {
  for (VShape shape : {VShape::kUneven, VShape::kLarge})
    for (VLayout layout : {VLayout::kPacked, VLayout::kReversedWithGaps})
      for (bool in_place : {false, true}) check_allgatherv(dt(), shape, layout, in_place, 17);
}

using Alltoallv = DtypeTest;
TEST_P(Alltoallv, CountsAndLayouts) {
  for (VShape shape : {VShape::kUneven, VShape::kLarge})
    for (VLayout layout : {VLayout::kPacked, VLayout::kReversedWithGaps})
      check_alltoallv(dt(), shape, layout, 18);
}

// Every shape, layout, root and form of the rooted v-collectives.
template <class Check>
void each_rooted_v_case(Check check) {
  for (VShape shape : {VShape::kUneven, VShape::kLarge})
    for (VLayout layout : {VLayout::kPacked, VLayout::kReversedWithGaps})
      for (int root : roots())
        for (bool in_place : {false, true}) check(shape, layout, root, in_place);
}

using Gatherv = DtypeTest;
TEST_P(Gatherv, CountsLayoutsRootsAndForms) {
  each_rooted_v_case([&](VShape shape, VLayout layout, int root, bool in_place) {
    check_gatherv(dt(), shape, layout, root, in_place, 19);
  });
}

using Scatterv = DtypeTest;
TEST_P(Scatterv, CountsLayoutsRootsAndForms) {
  each_rooted_v_case([&](VShape shape, VLayout layout, int root, bool in_place) {
    check_scatterv(dt(), shape, layout, root, in_place, 20);
  });
  for (int root : roots())
    check_scatterv(dt(), VShape::kUneven, VLayout::kPacked, root, false, 21, false, true);
}

INSTANTIATE_TEST_SUITE_P(All, Bcast, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Scatter, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Gather, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Allgather, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Alltoall, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, SendRecv, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Allgatherv, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Alltoallv, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Gatherv, ::testing::ValuesIn(kDtypes), dtype_name);
INSTANTIATE_TEST_SUITE_P(All, Scatterv, ::testing::ValuesIn(kDtypes), dtype_name);

TEST_F(Conformance, BarrierRepeated) {
  for (int i = 0; i < 5; ++i) MNCL_CALL(mncl_barrier(g_comm, nullptr));
}

// A barrier must not return before the last rank entered it. Rank 0 arrives 400 ms late; the
// others must wait for it. The 100 ms bound leaves 300 ms for scheduling noise between the two
// barriers, so this is no tight timing.
TEST_F(Conformance, BarrierWaitsForLateRank) {
  if (g_size == 1) GTEST_SKIP() << "needs two ranks";
  MNCL_CALL(mncl_barrier(g_comm, nullptr));
  if (g_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto t0 = std::chrono::steady_clock::now();
  MNCL_CALL(mncl_barrier(g_comm, nullptr));
  const auto waited = std::chrono::steady_clock::now() - t0;
  if (g_rank != 0) {
    EXPECT_GE(waited, std::chrono::milliseconds(100));
  }
}

// ---------------------------------------------------------------------------------------------
// The ChainerMN acceptance case: x = arange(n) + rank; allreduce-sum gives
// arange(n) * size + size * (size - 1) / 2.
// ---------------------------------------------------------------------------------------------

template <typename T>
void chainermn_case(mncl_dtype_t dt, size_t n) {
  std::vector<T> x(n), y(n, T(-1));
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(i) + static_cast<T>(g_rank);
  MNCL_CALL(mncl_allreduce(g_comm, x.data(), y.data(), n, dt, MNCL_SUM, nullptr));
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const T want =
        static_cast<T>(i) * static_cast<T>(g_size) + static_cast<T>(g_size * (g_size - 1) / 2);
    if (y[i] != want && wrong++ < 5)
      ADD_FAILURE() << "rank " << g_rank << " " << dtype_str(dt) << " n=" << n << " [" << i
                    << "] got " << y[i] << " want " << want;
  }
  EXPECT_EQ(wrong, 0u) << dtype_str(dt) << " n=" << n;
  // In place, as ChainerMN does for gradients.
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(i) + static_cast<T>(g_rank);
  MNCL_CALL(mncl_allreduce(g_comm, x.data(), x.data(), n, dt, MNCL_SUM, nullptr));
  EXPECT_TRUE(x == y) << dtype_str(dt) << " n=" << n << " in-place differs from out-of-place";
}

class ChainerMN : public Conformance {};
TEST_F(ChainerMN, AllreduceSumArange) {
  for (size_t n : {size_t{1}, size_t{10}, size_t{1021}, size_t{65536}}) {
    chainermn_case<float>(MNCL_FLOAT32, n);  // exact: every value is an integer below 2^24
    chainermn_case<int64_t>(MNCL_INT64, n);
  }
}

// ---------------------------------------------------------------------------------------------
// Non-blocking collectives
// ---------------------------------------------------------------------------------------------

// Completes a request with mncl_wait or by polling mncl_test; either must free it.
void complete(mncl_request_t req, bool by_test, const char *what) {
  if (!by_test) {
    MNCL_CALL(mncl_wait(req, -1));
    return;
  }
  int done = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!done) {
    const mncl_status_t st = mncl_test(req, &done);
    if (st != MNCL_OK) die_desynchronized(what, st);
    if (!done) {
      if (std::chrono::steady_clock::now() > give_up) die_desynchronized(what, MNCL_ERR_TIMEOUT);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

// Each non-blocking form, per dtype, completed alternately by wait and by test. The op varies
// with the dtype so all ops are exercised across the suite.
using NonBlocking = DtypeTest;
TEST_P(NonBlocking, EachCollective) {
  const mncl_dtype_t d = dt();
  const mncl_op_t op = kOps[static_cast<int>(d) % MNCL_NUM_OPS];
  const bool by_test = static_cast<int>(d) % 2 == 1;
  const size_t n = 1021;
  const int root = g_size - 1;
  const size_t total = n * static_cast<size_t>(g_size);
  mncl_request_t req = nullptr;

  {  // iallreduce
    const Buf send = reduce_data(d, op, g_rank, n, 20);
    Buf recv(d, n);
    MNCL_CALL(mncl_iallreduce(g_comm, send.data(), recv.data(), n, d, op, nullptr, &req));
    complete(req, by_test, "mncl_iallreduce");
    expect_same(recv, reduce_expected(d, op, 0, n, 20), std::string("iallreduce ") + op_str(op));
  }
  {  // ireduce
    Buf buf = reduce_data(d, op, g_rank, n, 21);
    MNCL_CALL(mncl_ireduce(g_comm, buf.data(), g_rank == root ? buf.data() : nullptr, n, d, op,
                           root, nullptr, &req));
    complete(req, by_test, "mncl_ireduce");
    if (g_rank == root)
      expect_same(buf, reduce_expected(d, op, 0, n, 21),
                  std::string("ireduce in-place ") + op_str(op));
  }
  {  // ibcast
    const Buf want = pattern_data(d, root, n, 22);
    Buf buf = g_rank == root ? want : Buf(d, n);
    MNCL_CALL(mncl_ibcast(g_comm, buf.data(), n, d, root, nullptr, &req));
    complete(req, by_test, "mncl_ibcast");
    expect_same(buf, want, "ibcast");
  }
  {  // iscatter
    const Buf all = pattern_data(d, 0, total, 23);
    Buf recv(d, n);
    MNCL_CALL(mncl_iscatter(g_comm, g_rank == 0 ? all.data() : nullptr, recv.data(), n, d, 0,
                            nullptr, &req));
    complete(req, by_test, "mncl_iscatter");
    expect_same(recv, 0, all, static_cast<size_t>(g_rank) * n, n, "iscatter");
  }
  {  // igather
    const Buf mine = pattern_data(d, g_rank, n, 24);
    Buf recv(d, total);
    MNCL_CALL(mncl_igather(g_comm, mine.data(), recv.data(), n, d, root, nullptr, &req));
    complete(req, by_test, "mncl_igather");
    if (g_rank == root) {
      for (int r = 0; r < g_size; ++r)
        expect_same(recv, static_cast<size_t>(r) * n, pattern_data(d, r, n, 24), 0, n,
                    "igather block " + std::to_string(r));
    }
  }
  {  // iallgather
    const Buf mine = pattern_data(d, g_rank, n, 25);
    Buf recv(d, total);
    MNCL_CALL(mncl_iallgather(g_comm, mine.data(), recv.data(), n, d, nullptr, &req));
    complete(req, by_test, "mncl_iallgather");
    for (int r = 0; r < g_size; ++r)
      expect_same(recv, static_cast<size_t>(r) * n, pattern_data(d, r, n, 25), 0, n,
                  "iallgather block " + std::to_string(r));
  }
  {  // ireduce_scatter
    const Buf send = reduce_data(d, op, g_rank, total, 26);
    Buf recv(d, n);
    MNCL_CALL(mncl_ireduce_scatter(g_comm, send.data(), recv.data(), n, d, op, nullptr, &req));
    complete(req, by_test, "mncl_ireduce_scatter");
    expect_same(recv, reduce_expected(d, op, static_cast<size_t>(g_rank) * n, n, 26),
                std::string("ireduce_scatter ") + op_str(op));
  }
  {  // ialltoall (in place)
    Buf buf = pattern_data(d, g_rank, total, 27);
    MNCL_CALL(mncl_ialltoall(g_comm, buf.data(), buf.data(), n, d, nullptr, &req));
    complete(req, by_test, "mncl_ialltoall");
    for (int i = 0; i < g_size; ++i)
      expect_same(buf, static_cast<size_t>(i) * n, pattern_data(d, i, total, 27),
                  static_cast<size_t>(g_rank) * n, n, "ialltoall block " + std::to_string(i));
  }
  // iallgatherv / ialltoallv / igatherv / iscatterv (completed by wait: their checks own the
  // request)
  check_allgatherv(d, VShape::kUneven, VLayout::kReversedWithGaps, false, 31, true);
  check_alltoallv(d, VShape::kUneven, VLayout::kReversedWithGaps, 32, true);
  check_gatherv(d, VShape::kUneven, VLayout::kReversedWithGaps, g_size - 1, false, 33, true);
  check_scatterv(d, VShape::kUneven, VLayout::kReversedWithGaps, g_size / 2, true, 34, true);
  {  // ibarrier
    MNCL_CALL(mncl_ibarrier(g_comm, nullptr, &req));
    complete(req, by_test, "mncl_ibarrier");
  }
  {  // iallreduce_coalesced
    const size_t counts[] = {n, 3};
    const Buf s0 = reduce_data(d, op, g_rank, counts[0], 28),
              s1 = reduce_data(d, op, g_rank, counts[1], 29);
    Buf r0(d, counts[0]), r1(d, counts[1]);
    const void *sendbufs[] = {s0.data(), s1.data()};
    void *recvbufs[] = {r0.data(), r1.data()};
    MNCL_CALL(
        mncl_iallreduce_coalesced(g_comm, sendbufs, recvbufs, counts, 2, d, op, nullptr, &req));
    complete(req, by_test, "mncl_iallreduce_coalesced");
    expect_same(r0, reduce_expected(d, op, 0, counts[0], 28), "iallreduce_coalesced buffer 0");
    expect_same(r1, reduce_expected(d, op, 0, counts[1], 29), "iallreduce_coalesced buffer 1");
  }
  if (g_size > 1) {  // isend / irecv around the ring, even ranks sending first
    const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    const Buf mine = pattern_data(d, g_rank, n, 30);
    Buf got(d, n);
    mncl_request_t sreq = nullptr, rreq = nullptr;
    if (g_rank % 2 == 0) {
      MNCL_CALL(mncl_isend(g_comm, mine.data(), n, d, next, nullptr, &sreq));
      MNCL_CALL(mncl_irecv(g_comm, got.data(), n, d, prev, nullptr, &rreq));
    } else {
      MNCL_CALL(mncl_irecv(g_comm, got.data(), n, d, prev, nullptr, &rreq));
      MNCL_CALL(mncl_isend(g_comm, mine.data(), n, d, next, nullptr, &sreq));
    }
    complete(rreq, by_test, "mncl_irecv");
    complete(sreq, by_test, "mncl_isend");
    expect_same(got, pattern_data(d, prev, n, 30), "isend/irecv ring");
  }
}
INSTANTIATE_TEST_SUITE_P(All, NonBlocking, ::testing::ValuesIn(kDtypes), dtype_name);

// Many operations outstanding at once, a blocking collective issued behind them (which must
// run after them), then completion in reverse issue order, partly by mncl_test.
TEST_F(Conformance, NonBlockingManyOutstandingThenBlocking) {
  const size_t n = 1021;
  const size_t total = n * static_cast<size_t>(g_size);
  const int last = g_size - 1, mid = g_size / 2;
  std::vector<mncl_request_t> reqs;
  auto issue = [&](mncl_status_t st, const char *what) {
    if (st != MNCL_OK) die_desynchronized(what, st);
  };
  mncl_request_t r = nullptr;

  const Buf ar_send = reduce_data(MNCL_FLOAT32, MNCL_SUM, g_rank, n, 40);
  Buf ar_recv(MNCL_FLOAT32, n);
  issue(mncl_iallreduce(g_comm, ar_send.data(), ar_recv.data(), n, MNCL_FLOAT32, MNCL_SUM, nullptr,
                        &r),
        "iallreduce");
  reqs.push_back(r);

  const Buf bc_want = pattern_data(MNCL_INT64, last, n, 41);
  Buf bc = g_rank == last ? bc_want : Buf(MNCL_INT64, n);
  issue(mncl_ibcast(g_comm, bc.data(), n, MNCL_INT64, last, nullptr, &r), "ibcast");
  reqs.push_back(r);

  const Buf ag_mine = pattern_data(MNCL_UINT8, g_rank, n, 42);
  Buf ag(MNCL_UINT8, total);
  issue(mncl_iallgather(g_comm, ag_mine.data(), ag.data(), n, MNCL_UINT8, nullptr, &r),
        "iallgather");
  reqs.push_back(r);

  Buf rs = reduce_data(MNCL_BFLOAT16, MNCL_MAX, g_rank, total, 43);  // in place
  issue(mncl_ireduce_scatter(g_comm, rs.data(), rs.at(static_cast<size_t>(g_rank) * n), n,
                             MNCL_BFLOAT16, MNCL_MAX, nullptr, &r),
        "ireduce_scatter");
  reqs.push_back(r);

  const Buf a2a_send = pattern_data(MNCL_INT32, g_rank, total, 44);
  Buf a2a(MNCL_INT32, total);
  issue(mncl_ialltoall(g_comm, a2a_send.data(), a2a.data(), n, MNCL_INT32, nullptr, &r),
        "ialltoall");
  reqs.push_back(r);

  issue(mncl_ibarrier(g_comm, nullptr, &r), "ibarrier");
  reqs.push_back(r);

  const Buf red_send = reduce_data(MNCL_INT8, MNCL_PROD, g_rank, n, 45);
  Buf red(MNCL_INT8, n);
  issue(
      mncl_ireduce(g_comm, red_send.data(), red.data(), n, MNCL_INT8, MNCL_PROD, mid, nullptr, &r),
      "ireduce");
  reqs.push_back(r);

  const Buf gat_mine = pattern_data(MNCL_FLOAT16, g_rank, n, 46);
  Buf gat(MNCL_FLOAT16, total);
  issue(mncl_igather(g_comm, gat_mine.data(), gat.data(), n, MNCL_FLOAT16, 0, nullptr, &r),
        "igather");
  reqs.push_back(r);

  const Buf sc_all = pattern_data(MNCL_UINT64, mid, total, 47);
  Buf sc(MNCL_UINT64, n);
  issue(mncl_iscatter(g_comm, sc_all.data(), sc.data(), n, MNCL_UINT64, mid, nullptr, &r),
        "iscatter");
  reqs.push_back(r);

  const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  const Buf p2p_mine = pattern_data(MNCL_FLOAT64, g_rank, n, 48);
  Buf p2p(MNCL_FLOAT64, n);
  if (g_size > 1) {
    mncl_request_t s = nullptr, q = nullptr;
    if (g_rank % 2 == 0) {
      issue(mncl_isend(g_comm, p2p_mine.data(), n, MNCL_FLOAT64, next, nullptr, &s), "isend");
      issue(mncl_irecv(g_comm, p2p.data(), n, MNCL_FLOAT64, prev, nullptr, &q), "irecv");
    } else {
      issue(mncl_irecv(g_comm, p2p.data(), n, MNCL_FLOAT64, prev, nullptr, &q), "irecv");
      issue(mncl_isend(g_comm, p2p_mine.data(), n, MNCL_FLOAT64, next, nullptr, &s), "isend");
    }
    reqs.push_back(s);
    reqs.push_back(q);
  }

  // The blocking call is ordered after all of the above.
  Buf blocking = reduce_data(MNCL_INT32, MNCL_MIN, g_rank, n, 49);
  MNCL_CALL(
      mncl_allreduce(g_comm, blocking.data(), blocking.data(), n, MNCL_INT32, MNCL_MIN, nullptr));
  expect_same(blocking, reduce_expected(MNCL_INT32, MNCL_MIN, 0, n, 49),
              "blocking allreduce behind non-blocking ones");

  // A zero timeout either finds the operation done (and frees it) or leaves it valid.
  mncl_request_t first = reqs.back();
  reqs.pop_back();
  const mncl_status_t st = mncl_wait(first, 0);
  if (st == MNCL_ERR_TIMEOUT) {
    MNCL_CALL(mncl_wait(first, -1));
  } else {
    EXPECT_EQ(st, MNCL_OK) << mncl_last_error();
  }
  for (size_t i = reqs.size(); i-- > 0;) complete(reqs[i], i % 2 == 0, "outstanding request");

  expect_same(ar_recv, reduce_expected(MNCL_FLOAT32, MNCL_SUM, 0, n, 40), "iallreduce");
  expect_same(bc, bc_want, "ibcast");
  for (int q = 0; q < g_size; ++q) {
    expect_same(ag, static_cast<size_t>(q) * n, pattern_data(MNCL_UINT8, q, n, 42), 0, n,
                "iallgather");
    expect_same(a2a, static_cast<size_t>(q) * n, pattern_data(MNCL_INT32, q, total, 44),
                static_cast<size_t>(g_rank) * n, n, "ialltoall");
    if (g_rank == 0)
      expect_same(gat, static_cast<size_t>(q) * n, pattern_data(MNCL_FLOAT16, q, n, 46), 0, n,
                  "igather");
  }
  expect_same(rs, static_cast<size_t>(g_rank) * n,
              reduce_expected(MNCL_BFLOAT16, MNCL_MAX, static_cast<size_t>(g_rank) * n, n, 43), 0,
              n, "ireduce_scatter in-place");
  if (g_rank == mid) expect_same(red, reduce_expected(MNCL_INT8, MNCL_PROD, 0, n, 45), "ireduce");
  expect_same(sc, 0, sc_all, static_cast<size_t>(g_rank) * n, n, "iscatter");
  if (g_size > 1) expect_same(p2p, pattern_data(MNCL_FLOAT64, prev, n, 48), "isend/irecv");
}

// ---------------------------------------------------------------------------------------------
// Point to point beside collectives: MPI's progress rules
//
// A posted receive must not keep the rank's later sends, its receives from other peers or its
// collectives from running: "irecv(peer); isend(peer); wait both" on both ranks, or
// "irecv(left); allreduce; isend(right); wait", complete on every backend (where execute()
// blocks, the core runs point to point on per-(peer, direction) lanes beside the collectives:
// MNCL_CAP_CONCURRENT_P2P in mncl_plugin_v2.h). Messages between a pair still match in issue
// order, whatever their sizes.
//
// Each test runs on its own duplicate of the world, and each phase of a test is bounded by
// p2p_bound_ms(): a deadlock fails the test within that bound, as MNCL_ERR_TIMEOUT from a
// bounded mncl_wait (or a mncl_test loop that gives up), or as a blocking call or an unbounded
// wait that the test's watchdog ended by aborting the duplicate. The world communicator stays
// usable for the tests after it.
// ---------------------------------------------------------------------------------------------

// 8 bytes; and 4 MiB (+ 3 elements) of 4-byte elements: more than any socket buffer, shared
// memory slot or eager limit, so such a send cannot complete before its receive runs.
constexpr size_t kP2PSmall = 8;                          // uint8 elements
constexpr size_t kP2PLarge = (size_t{4} << 20) / 4 + 3;  // float32 / int32 elements

// How long one phase of a ConcurrentP2P test may take before it counts as a deadlock:
// MNCL_CONFORMANCE_P2P_BOUND (seconds) if set, else half the communicator's timeout
// (MNCL_TIMEOUT, 300 s by default), at most 30 s. Half, so that every rank has given up on a
// deadlocked phase well before the world collective that ends the test could time out.
int64_t p2p_bound_ms() {
  if (const char *s = std::getenv("MNCL_CONFORMANCE_P2P_BOUND")) {
    if (std::atof(s) > 0) return static_cast<int64_t>(std::atof(s) * 1000);
  }
  double timeout_s = 300;
  if (const char *t = std::getenv("MNCL_TIMEOUT")) {
    if (std::atof(t) > 0) timeout_s = std::atof(t);
  }
  return std::max<int64_t>(1000, static_cast<int64_t>(std::min(30.0, timeout_s / 2) * 1000));
}

// The payload of message m from src to dst in the test with seed `base` (m < 1000): every
// message of a test differs, so one delivered out of order or to the wrong rank shows.
Buf message(mncl_dtype_t dt, size_t count, int src, int dst, int base, int m) {
  return pattern_data(dt, src, count, base * 100000 + dst * 1000 + m);
}

// Round `round` of a round-robin tournament: a rank's partner, or a number >= size when it sits
// the round out (odd sizes). Over rounds() rounds every pair meets exactly once.
struct Tournament {
  int size;
  int slots() const { return size + size % 2; }
  int rounds() const { return slots() - 1; }
  int partner(int rank, int round) const {
    const int m = slots() - 1;
    if (rank == m) return round;
    if (rank == round) return m;
    return ((2 * round - rank) % m + m) % m;
  }
};

// Message sizes of the ring tests, per round: 0 included, and every seventh round large.
size_t ring_count(int round) {
  return round % 7 == 3 ? kP2PLarge : static_cast<size_t>(round * 7919 % 4099);
}

class ConcurrentP2P : public Conformance {
 protected:
  using Clock = std::chrono::steady_clock;

  void SetUp() override {
    Conformance::SetUp();
    if (HasFatalFailure()) return;
    if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
    const char *backend = nullptr;
    MNCL_CALL(mncl_comm_backend(g_comm, &backend));
    if (backend != nullptr && std::strcmp(backend, "nccl") == 0) {
      // mncl.h's exception: a stream-ordered backend runs one stream's operations in order, as
      // NCCL does, so a receive posted before the send its peer waits for blocks by design.
      GTEST_SKIP() << "nccl orders point to point on the caller's stream (mncl.h)";
    }
    bound_ms_ = p2p_bound_ms();
    left_ = (g_rank + g_size - 1) % g_size;
    right_ = (g_rank + 1) % g_size;
    MNCL_CALL(mncl_comm_split(g_comm, 0, 0, &comm_));
    ASSERT_NE(comm_, nullptr);
    phase("set-up");
    watchdog_ = std::thread([this] { watch(); });
  }

  // Every rank learns (over the world) whether any rank's duplicate broke; if one did, all
  // abort theirs, so that none waits in mncl_comm_destroy for a rank that gave up. Requests
  // still pending are then completed (after an abort they must end at once) and the duplicate
  // destroyed.
  void TearDown() override {
    if (!comm_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    bool pending = false;
    for (const Req &r : reqs_) pending = pending || !r.done;
    int32_t mine = broken_ || expired_ || pending ? 1 : 0, any = 0;
    MNCL_CALL(mncl_allreduce(g_comm, &mine, &any, 1, MNCL_INT32, MNCL_MAX, nullptr));
    if (any) {
      EXPECT_EQ(mncl_comm_abort(comm_), MNCL_OK) << mncl_last_error();
    }
    for (Req &r : reqs_) {
      if (r.done) continue;
      // MNCL_ERR_INVALID_ARGUMENT is fine: the bounded wait that returned MNCL_ERR_TIMEOUT
      // had the operation's own timeout, and freed the request.
      const mncl_status_t st = mncl_wait(r.req, bound_ms_);
      if (st == MNCL_ERR_TIMEOUT) {
        die_desynchronized(("mncl_wait after mncl_comm_abort, on " + r.what).c_str(), st);
      }
      r.done = true;
    }
    const mncl_status_t st = mncl_comm_destroy(comm_);
    comm_ = nullptr;
    if (any) {
      // A backend may still hold on to buffers of operations that an abort cut short (MPI
      // cannot cancel them): they are never freed.
      static auto *graveyard = new std::vector<std::deque<Buf>>;
      graveyard->push_back(std::move(bufs_));
      EXPECT_TRUE(st == MNCL_OK || st == MNCL_ERR_ABORTED)
          << "mncl_comm_destroy of the aborted duplicate: " << mncl_status_string(st) << ": "
          << mncl_last_error();
    } else {
      EXPECT_EQ(st, MNCL_OK) << "mncl_comm_destroy: " << mncl_last_error();
    }
  }

  // Starts a phase, whose operations must all complete within the bound from now. Buffers
  // kept and requests made by earlier (completed) phases are released.
  void phase(const std::string &name) {
    if (std::all_of(reqs_.begin(), reqs_.end(), [](const Req &r) { return r.done; })) {
      reqs_.clear();
      bufs_.clear();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      phase_ = name;
      deadline_ = Clock::now() + std::chrono::milliseconds(bound_ms_);
    }
    cv_.notify_all();
  }

  // Buffers given to the duplicate live until the next phase, or until TearDown: a test that
  // stops after a failure leaves requests behind, which end only after an abort.
  Buf &keep(Buf b) {
    bufs_.push_back(std::move(b));
    return bufs_.back();
  }

  // The status of a call on the duplicate: true if MNCL_OK, else a failure naming the phase
  // and, past its deadline (or at it: `at_bound`), the deadlock. Tests stop at the first one.
  bool ok(mncl_status_t st, const std::string &what, bool at_bound = false) {
    if (st == MNCL_OK) return true;
    broken_ = true;
    std::string current, note;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current = phase_;
      if (at_bound || expired_ || Clock::now() >= deadline_) {
        note = std::string(" -- ") + deadlock_note() +
               (expired_ ? "; the test aborted the duplicate to end it" : "");
      }
    }
    ADD_FAILURE() << "rank " << g_rank << "/" << g_size << ": " << current << ": " << what
                  << " returned " << mncl_status_string(st) << ": " << mncl_last_error() << note;
    return false;
  }

  // Posting; the request's index for wait() and test_all(), or -1 after a failure.
  int isend(const Buf &b, int peer) {
    mncl_request_t r = nullptr;
    const mncl_status_t st = mncl_isend(comm_, b.data(), b.count(), b.dtype(), peer, nullptr, &r);
    return track(st, r, "mncl_isend to " + std::to_string(peer));
  }
  int irecv(Buf &b, int peer) {
    mncl_request_t r = nullptr;
    const mncl_status_t st = mncl_irecv(comm_, b.data(), b.count(), b.dtype(), peer, nullptr, &r);
    return track(st, r, "mncl_irecv from " + std::to_string(peer));
  }
  int iallreduce(const Buf &send, Buf &recv, mncl_op_t op) {
    mncl_request_t r = nullptr;
    const mncl_status_t st = mncl_iallreduce(comm_, send.data(), recv.data(), send.count(),
                                             send.dtype(), op, nullptr, &r);
    return track(st, r, "mncl_iallreduce");
  }

  // mncl_wait bounded by the phase's deadline; or unbounded (-1), which the watchdog ends at
  // the deadline by aborting the duplicate.
  bool wait(int id, bool unbounded = false) {
    Req &r = reqs_[static_cast<size_t>(id)];
    const mncl_status_t st = mncl_wait(r.req, unbounded ? -1 : remaining_ms());
    // A timeout may leave the request pending (TearDown completes it); anything else freed it.
    if (st != MNCL_ERR_TIMEOUT) r.done = true;
    return ok(st, std::string("mncl_wait(") + (unbounded ? "-1" : "bounded") + ") on " + r.what,
              !unbounded && st == MNCL_ERR_TIMEOUT);
  }

  // Polls every request with mncl_test until all are done, or the phase's deadline passed.
  bool test_all(const std::vector<int> &ids) {
    for (;;) {
      std::vector<std::string> left;
      for (int id : ids) {
        Req &r = reqs_[static_cast<size_t>(id)];
        if (r.done) continue;
        int done = 0;
        const mncl_status_t st = mncl_test(r.req, &done);
        if (done) r.done = true;
        if (!ok(st, "mncl_test on " + r.what)) return false;
        if (!done) left.push_back(r.what);
      }
      if (left.empty()) return true;
      if (remaining_ms() == 0) {
        std::string names;
        for (const auto &w : left) names += (names.empty() ? "" : ", ") + w;
        broken_ = true;
        std::lock_guard<std::mutex> lock(mutex_);
        ADD_FAILURE() << "rank " << g_rank << "/" << g_size << ": " << phase_ << ": " << left.size()
                      << " operation(s) not done, polled with mncl_test (as "
                      << mncl_status_string(MNCL_ERR_TIMEOUT) << ") -- " << deadlock_note() << ": "
                      << names;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Every rank posts a receive from each peer, then a send to each peer (both in rank order),
  // then completes them all: with mncl_wait in reverse order of posting, or by mncl_test.
  void exchange(mncl_dtype_t dt, size_t count, bool by_test, int base) {
    const std::string what = describe("exchange with every peer", dt, count,
                                      by_test ? ", polled by mncl_test" : ", waited in reverse");
    phase(what);
    std::vector<int> ids;
    std::vector<Buf *> got(static_cast<size_t>(g_size), nullptr);
    for (int peer = 0; peer < g_size; ++peer) {
      if (peer == g_rank) continue;
      got[static_cast<size_t>(peer)] = &keep(Buf(dt, count));
      ids.push_back(irecv(*got[static_cast<size_t>(peer)], peer));
      if (ids.back() < 0) return;
    }
    for (int peer = 0; peer < g_size; ++peer) {
      if (peer == g_rank) continue;
      ids.push_back(isend(keep(message(dt, count, g_rank, peer, base, 0)), peer));
      if (ids.back() < 0) return;
    }
    if (by_test) {
      if (!test_all(ids)) return;
    } else {
      for (size_t i = ids.size(); i-- > 0;)
        if (!wait(ids[i])) return;
    }
    for (int peer = 0; peer < g_size; ++peer) {
      if (peer == g_rank) continue;
      expect_same(*got[static_cast<size_t>(peer)], message(dt, count, peer, g_rank, base, 0),
                  what + ": the message from rank " + std::to_string(peer));
    }
  }

  // irecv from the left; [an iallreduce;] a blocking allreduce, which needs every rank while
  // their sends are still to come; isend to the right; then the receive, the send [and the
  // iallreduce] completed. A medium and a large message.
  void irecv_across_allreduce(bool with_iallreduce, int base) {
    int m = 0;
    for (size_t count : {size_t{1021}, kP2PLarge}) {
      const std::string what =
          describe(with_iallreduce ? "irecv(left), iallreduce, blocking allreduce, isend(right)"
                                   : "irecv(left), blocking allreduce, isend(right)",
                   MNCL_FLOAT32, count);
      phase(what);
      Buf &got = keep(Buf(MNCL_FLOAT32, count));
      const int r = irecv(got, left_);
      if (r < 0) return;
      Buf *out = nullptr;
      int c = -1;
      if (with_iallreduce) {
        const Buf &in = keep(reduce_data(MNCL_INT32, MNCL_MAX, g_rank, 4099, base + 10 + m));
        out = &keep(Buf(MNCL_INT32, 4099));
        c = iallreduce(in, *out, MNCL_MAX);
        if (c < 0) return;
      }
      if (!checked_allreduce(
              base + m, with_iallreduce ? "the irecv and the iallreduce" : "the irecv", what)) {
        return;
      }
      const int s = isend(keep(message(MNCL_FLOAT32, count, g_rank, right_, base, m)), right_);
      // Waits in both orders across the two variants: send first, or receive first.
      if (s < 0) return;
      if (with_iallreduce ? !(wait(r) && wait(s) && wait(c)) : !(wait(s) && wait(r))) return;
      expect_same(got, message(MNCL_FLOAT32, count, left_, g_rank, base, m), what);
      if (with_iallreduce) {
        expect_same(*out, reduce_expected(MNCL_INT32, MNCL_MAX, 0, 4099, base + 10 + m),
                    what + ": the iallreduce");
      }
      ++m;
    }
  }

  // A blocking int64 sum allreduce of 1021 elements while `posted` is in flight, checked.
  bool checked_allreduce(int seed, const char *posted, const std::string &what) {
    Buf &sum = keep(reduce_data(MNCL_INT64, MNCL_SUM, g_rank, 1021, seed));
    if (!ok(mncl_allreduce(comm_, sum.data(), sum.data(), sum.count(), MNCL_INT64, MNCL_SUM,
                           nullptr),
            std::string("mncl_allreduce with ") + posted + " posted")) {
      return false;
    }
    expect_same(sum, reduce_expected(MNCL_INT64, MNCL_SUM, 0, 1021, seed),
                what + ": the blocking allreduce");
    return true;
  }

  // Every pair of ranks meets once (an idle rank per round at odd sizes): one direction posted
  // non-blocking, the other as a blocking call on top of it, then a wait; large messages.
  void blocking_beside_posted(bool blocking_send, int base) {
    const Tournament tour{g_size};
    for (int round = 0; round < tour.rounds(); ++round) {
      const int partner = tour.partner(g_rank, round);
      if (partner >= g_size) continue;
      const std::string what =
          describe(blocking_send ? "irecv, blocking send, wait" : "isend, blocking recv, wait",
                   MNCL_INT32, kP2PLarge) +
          " with rank " + std::to_string(partner);
      phase(what);
      Buf &got = keep(Buf(MNCL_INT32, kP2PLarge));
      const Buf &msg = keep(message(MNCL_INT32, kP2PLarge, g_rank, partner, base, round));
      const int posted = blocking_send ? irecv(got, partner) : isend(msg, partner);
      if (posted < 0) return;
      const bool blocked_ok =
          blocking_send
              ? ok(mncl_send(comm_, msg.data(), msg.count(), msg.dtype(), partner, nullptr),
                   "mncl_send with an irecv from the same peer posted")
              : ok(mncl_recv(comm_, got.data(), got.count(), got.dtype(), partner, nullptr),
                   "mncl_recv with an isend to the same peer posted");
      if (!blocked_ok || !wait(posted)) return;
      expect_same(got, message(MNCL_INT32, kP2PLarge, partner, g_rank, base, round), what);
    }
  }

  mncl_comm_t comm_ = nullptr;  // this test's duplicate of the world
  int left_ = 0, right_ = 0;    // ring neighbours

 private:
  struct Req {
    mncl_request_t req;
    std::string what;
    bool done;
  };

  int track(mncl_status_t st, mncl_request_t r, std::string what) {
    if (!ok(st, what)) return -1;
    reqs_.push_back(Req{r, std::move(what), false});
    return static_cast<int>(reqs_.size() - 1);
  }

  int64_t remaining_ms() {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    return std::max<int64_t>(0, static_cast<int64_t>(left));
  }

  std::string deadlock_note() const {
    std::ostringstream s;
    s << "the phase did not complete within the test's bound of "
      << static_cast<double>(bound_ms_) / 1000.0 << " s: a deadlock";
    return s.str();
  }

  // At the phase's deadline: aborts the duplicate, which ends every call blocked on it.
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (Clock::now() >= deadline_) {
        expired_ = true;
        lock.unlock();
        mncl_comm_abort(comm_);
        return;
      }
      cv_.wait_until(lock, deadline_);
    }
  }

  int64_t bound_ms_ = 0;
  std::deque<Buf> bufs_;
  std::vector<Req> reqs_;
  bool broken_ = false;  // a call on the duplicate failed (main thread only)
  std::thread watchdog_;
  std::mutex mutex_;  // guards what follows
  std::condition_variable cv_;
  std::string phase_;
  Clock::time_point deadline_;
  bool stop_ = false;
  bool expired_ = false;
};

// 1. Receives from every peer posted before the sends to them; small and large messages,
// waited in reverse or polled.
TEST_F(ConcurrentP2P, ExchangeSmallWaitReverse) {
  exchange(MNCL_UINT8, kP2PSmall, false, 100);
}
TEST_F(ConcurrentP2P, ExchangeSmallTestPolling) {
  exchange(MNCL_UINT8, kP2PSmall, true, 101);
}
TEST_F(ConcurrentP2P, ExchangeLargeWaitReverse) {
  exchange(MNCL_FLOAT32, kP2PLarge, false, 102);
}
TEST_F(ConcurrentP2P, ExchangeLargeTestPolling) {
  exchange(MNCL_FLOAT32, kP2PLarge, true, 103);
}

// 2. Twenty rounds; in each, irecv from the left, isend to the right, then both waited with
// mncl_wait(-1) (the receive first); then the other way round (the send waited first). Sizes
// and data change every round.
TEST_F(ConcurrentP2P, RingShiftBothWays) {
  constexpr int kRounds = 20, kBase = 104;
  for (int round = 0; round < kRounds; ++round) {
    const size_t count = ring_count(round);
    for (int dir = 0; dir < 2; ++dir) {
      const int from = dir == 0 ? left_ : right_, to = dir == 0 ? right_ : left_;
      const int m = 2 * round + dir;
      const std::string what = describe("ring shift", MNCL_INT32, count) +
                               (dir == 0 ? " rightward" : " leftward") + ", round " +
                               std::to_string(round);
      phase(what);
      Buf &got = keep(Buf(MNCL_INT32, count));
      const int r = irecv(got, from);
      if (r < 0) return;
      const int s = isend(keep(message(MNCL_INT32, count, g_rank, to, kBase, m)), to);
      if (s < 0) return;
      if (!wait(dir == 0 ? r : s, true) || !wait(dir == 0 ? s : r, true)) return;
      expect_same(got, message(MNCL_INT32, count, from, g_rank, kBase, m), what);
    }
  }
}

// The same traffic with all forty operations each way posted before any is waited for (per
// round: irecv from the left, isend to the right, irecv from the right, isend to the left),
// then waited in issue order: receive k from a peer must get that peer's message k.
TEST_F(ConcurrentP2P, RingShiftAllPostedFirst) {
  constexpr int kRounds = 20, kBase = 105;
  phase("ring shift, 20 rounds each way posted at once");
  std::vector<int> ids;
  struct Expected {
    Buf *got;
    int from, m;
  };
  std::vector<Expected> expected;
  for (int round = 0; round < kRounds; ++round) {
    const size_t count = ring_count(round);
    for (int dir = 0; dir < 2; ++dir) {
      const int from = dir == 0 ? left_ : right_, to = dir == 0 ? right_ : left_;
      const int m = 2 * round + dir;
      expected.push_back(Expected{&keep(Buf(MNCL_INT32, count)), from, m});
      ids.push_back(irecv(*expected.back().got, from));
      if (ids.back() < 0) return;
      ids.push_back(isend(keep(message(MNCL_INT32, count, g_rank, to, kBase, m)), to));
      if (ids.back() < 0) return;
    }
  }
  for (int id : ids)
    if (!wait(id)) return;
  for (const Expected &e : expected) {
    expect_same(*e.got, message(MNCL_INT32, e.got->count(), e.from, g_rank, kBase, e.m),
                describe("ring shift posted at once", MNCL_INT32, e.got->count()) + ", message " +
                    std::to_string(e.m) + " from " + std::to_string(e.from));
  }
}

// 3. irecv from the left; a blocking allreduce, which needs every rank while their sends are
// still to come; isend to the right; wait for both. A medium and a large message.
TEST_F(ConcurrentP2P, IrecvAcrossBlockingAllreduce) {
  irecv_across_allreduce(/*with_iallreduce=*/false, 106);
}

// The same with a non-blocking collective in flight as well: irecv from the left, iallreduce,
// blocking allreduce, isend to the right; then the receive, the send and last the iallreduce
// completed. Neither point-to-point operation may wait for the collectives around it, nor the
// collectives for them.
TEST_F(ConcurrentP2P, IrecvAcrossNonBlockingAllreduce) {
  irecv_across_allreduce(/*with_iallreduce=*/true, 107);
}

// 4. Sixteen receives from the left posted before the sixteen sends to the right, of
// different sizes (a large one among small and empty ones); the receives waited in reverse,
// the sends polled. Receive i must hold message i: messages of a pair never overtake.
// A receive posted before mncl_comm_split completes after it (a split is collective, like an
// allreduce, and must not wait for point-to-point traffic that only comes after it).
TEST_F(ConcurrentP2P, IrecvAcrossSplit) {
  constexpr int kBase = 111;
  const std::string what = describe("irecv(left), mncl_comm_split, isend(right)", MNCL_INT32, 777);
  phase(what);
  Buf &got = keep(Buf(MNCL_INT32, 777));
  const int r = irecv(got, left_);
  if (r < 0) return;
  mncl_comm_t sub = nullptr;
  if (!ok(mncl_comm_split(comm_, g_rank % 2, g_rank, &sub),
          "mncl_comm_split with the irecv posted")) {
    return;
  }
  int sub_size = 0;
  EXPECT_EQ(mncl_comm_size(sub, &sub_size), MNCL_OK) << mncl_last_error();
  EXPECT_EQ(sub_size, (g_size + 1 - g_rank % 2) / 2) << "members of color " << g_rank % 2;
  EXPECT_EQ(mncl_comm_destroy(sub), MNCL_OK) << mncl_last_error();
  const int s = isend(keep(message(MNCL_INT32, 777, g_rank, right_, kBase, 0)), right_);
  if (s < 0 || !wait(s) || !wait(r)) return;
  expect_same(got, message(MNCL_INT32, 777, left_, g_rank, kBase, 0), what);
}

TEST_F(ConcurrentP2P, ManyOutstandingNonOvertaking) {
  constexpr int kBase = 108;
  constexpr size_t kSizes[] = {1, 0,   1021, 7,  kP2PLarge, 2, 65536, 1,
                               3, 333, 0,    17, 4099,      8, 1,     100003};
  constexpr int kMessages = static_cast<int>(sizeof kSizes / sizeof kSizes[0]);
  phase("16 receives from the left posted before 16 sends to the right");
  std::vector<int> recvs, sends;
  std::vector<Buf *> got;
  for (int m = 0; m < kMessages; ++m) {
    got.push_back(&keep(Buf(MNCL_INT32, kSizes[m])));
    recvs.push_back(irecv(*got.back(), left_));
    if (recvs.back() < 0) return;
  }
  for (int m = 0; m < kMessages; ++m) {
    sends.push_back(isend(keep(message(MNCL_INT32, kSizes[m], g_rank, right_, kBase, m)), right_));
    if (sends.back() < 0) return;
  }
  for (int m = kMessages; m-- > 0;)
    if (!wait(recvs[static_cast<size_t>(m)])) return;
  if (!test_all(sends)) return;
  for (int m = 0; m < kMessages; ++m) {
    expect_same(*got[static_cast<size_t>(m)],
                message(MNCL_INT32, kSizes[m], left_, g_rank, kBase, m),
                describe("16 outstanding receives", MNCL_INT32, kSizes[m]) + ": receive " +
                    std::to_string(m));
  }
}

// 5. The classic exchange with a blocking send: with each partner of a round-robin tournament
// in turn (every pair once; at odd sizes one rank sits each round out), irecv from the partner,
// then a blocking mncl_send of 4 MiB to it, then wait for the receive.
TEST_F(ConcurrentP2P, BlockingSendWhileIrecvPosted) {
  blocking_beside_posted(/*blocking_send=*/true, 109);
}

// Its mirror: isend to the partner, a blocking mncl_recv from it, then wait for the send.
TEST_F(ConcurrentP2P, BlockingRecvWhileIsendPosted) {
  blocking_beside_posted(/*blocking_send=*/false, 110);
}

// ---------------------------------------------------------------------------------------------
// Batched point to point: mncl_sendrecv_batch, mncl_sendrecv and their non-blocking forms
//
// All ops of a batch progress together, so exchanges that deadlock as a sequence of blocking
// calls (a ring shift with every rank sending first, all receives listed before all sends) must
// complete on every backend, nccl included (there as one NCCL group: no skip). Messages between
// a pair still match in issue order per direction, a batch's ops in array order after what was
// issued before it; every message of a test carries its own payload, so one delivered out of
// order, to the wrong op or from an earlier call shows as wrong data.
// ---------------------------------------------------------------------------------------------

// One rank's batch: its ops, the buffers they use (at stable addresses until the batch is
// destroyed), what every receive must hold afterwards and copies of what was sent (a send
// buffer must come back unchanged).
class Batch {
 public:
  explicit Batch(std::string what) : what_(std::move(what)) {}
  Batch(const Batch &) = delete;
  Batch &operator=(const Batch &) = delete;

  // Sends `payload` to peer; returns the buffer (to send it again, or a part of it).
  const Buf &send(Buf payload, int peer) {
    Buf &b = keep(std::move(payload));
    sent_.push_back(Sent{&b, b});
    ops_.push_back(mncl_p2p_op(MNCL_P2P_SEND, b.data(), b.count(), b.dtype(), peer));
    return b;
  }
  // Sends elements [first, first + count) of a buffer this batch sends already (send buffers
  // may overlap: one tensor may go to several peers).
  void send_part(const Buf &b, size_t first, size_t count, int peer) {
    ops_.push_back(mncl_p2p_op(MNCL_P2P_SEND, b.at(first), count, b.dtype(), peer));
  }
  // Receives want.count() elements of want.dtype() from peer, which must equal want.
  void recv(Buf want, int peer, const std::string &name) {
    Buf &got = keep(Buf(want.dtype(), want.count()));
    ops_.push_back(mncl_p2p_op(MNCL_P2P_RECV, got.data(), got.count(), got.dtype(), peer));
    expected_.push_back(Expected{&got, std::move(want), name});
  }
  // An empty message with a NULL buffer (valid: it still matches one op of the peer).
  void send_empty(mncl_dtype_t dt, int peer) {
    ops_.push_back(mncl_p2p_op(MNCL_P2P_SEND, nullptr, 0, dt, peer));
  }
  void recv_empty(mncl_dtype_t dt, int peer) {
    ops_.push_back(mncl_p2p_op(MNCL_P2P_RECV, nullptr, 0, dt, peer));
  }

  // Blocking: runs the batch and checks it.
  void run() {
    MNCL_CALL(mncl_sendrecv_batch(g_comm, ops_.data(), ops_.size(), nullptr));
    check();
  }
  // Non-blocking: the request (complete it, then check()).
  mncl_request_t start() {
    mncl_request_t req = nullptr;
    MNCL_CALL(mncl_isendrecv_batch(g_comm, ops_.data(), ops_.size(), nullptr, &req));
    EXPECT_NE(req, nullptr) << what_;
    return req;
  }
  void check() const {
    for (const Expected &e : expected_) expect_same(*e.got, e.want, what_ + ": " + e.name);
    for (const Sent &s : sent_) expect_same(*s.buf, s.copy, what_ + " (sent buffers unchanged)");
  }

 private:
  struct Sent {
    const Buf *buf;
    Buf copy;
  };
  struct Expected {
    const Buf *got;
    Buf want;
    std::string name;
  };
  Buf &keep(Buf b) {
    bufs_.push_back(std::move(b));
    return bufs_.back();
  }

  std::string what_;
  std::deque<Buf> bufs_;
  std::vector<mncl_p2p_op_t> ops_;
  std::vector<Sent> sent_;
  std::vector<Expected> expected_;
};

int next_rank() {
  return (g_rank + 1) % g_size;
}
int prev_rank() {
  return (g_rank + g_size - 1) % g_size;
}
std::string from_str(int peer) {
  return "the message from rank " + std::to_string(peer);
}

// The ring shift both ways in one batch: message 0 goes to the next rank, message 1 to the
// previous one. `order` lists the batch's ops: 0 sends first, 1 receives first (deadlocks as
// separate blocking calls on every rank), 2 interleaved. Sends to the next rank come before
// those to the previous one and receives from the previous before those from the next: at 2
// ranks both are the same peer, and the messages must then match in that order.
void check_ring_batch(mncl_dtype_t dt, size_t count, int order, bool nonblocking, bool by_test,
                      int base) {
  const int next = next_rank(), prev = prev_rank();
  static const char *orders[] = {" sends first", " receives first", " interleaved"};
  Batch b(describe("batch ring shift both ways", dt, count, orders[order]) +
          (nonblocking ? (by_test ? ", isendrecv_batch polled" : ", isendrecv_batch waited") : ""));
  auto sends = [&](int which) {
    if (which == 0) b.send(message(dt, count, g_rank, next, base, 0), next);
    if (which == 1) b.send(message(dt, count, g_rank, prev, base, 1), prev);
  };
  auto recvs = [&](int which) {
    if (which == 0) b.recv(message(dt, count, prev, g_rank, base, 0), prev, from_str(prev));
    if (which == 1) b.recv(message(dt, count, next, g_rank, base, 1), next, from_str(next));
  };
  // 'S': a send, 'R': a receive; the first of each goes to or comes from the next rank.
  static const char *sequences[] = {"SSRR", "RRSS", "RSRS"};
  int s = 0, r = 0;
  for (const char *op = sequences[order]; *op; ++op) {
    if (*op == 'S') {
      sends(s++);
    } else {
      recvs(r++);
    }
  }
  if (nonblocking) {
    complete(b.start(), by_test, "mncl_isendrecv_batch");
    b.check();
  } else {
    b.run();
  }
}

// mncl_sendrecv around the ring: rank r sends ring_sendrecv_count(r) elements to the next rank
// and receives its previous rank's (send and receive counts differ).
size_t ring_sendrecv_count(int rank, size_t count) {
  return count == 0 ? 0 : count + static_cast<size_t>(rank % 3);
}
void check_sendrecv_ring(mncl_dtype_t dt, size_t count, int base) {
  const int next = next_rank(), prev = prev_rank();
  const size_t scount = ring_sendrecv_count(g_rank, count),
               rcount = ring_sendrecv_count(prev, count);
  const std::string what = describe("sendrecv ring shift", dt, scount);
  const Buf mine = message(dt, scount, g_rank, next, base, 0);
  const Buf copy = mine;
  Buf got(dt, rcount);
  MNCL_CALL(
      mncl_sendrecv(g_comm, mine.data(), scount, next, got.data(), rcount, prev, dt, nullptr));
  expect_same(got, message(dt, rcount, prev, g_rank, base, 0), what);
  expect_same(mine, copy, what + " (sendbuf must stay unchanged)");
}

// mncl_sendrecv (or mncl_isendrecv, waited or polled) with each partner of a round-robin
// tournament in turn: dest == source.
void check_sendrecv_pairwise(mncl_dtype_t dt, size_t count, bool nonblocking, bool by_test,
                             int base) {
  const Tournament tour{g_size};
  for (int round = 0; round < tour.rounds(); ++round) {
    const int partner = tour.partner(g_rank, round);
    if (partner >= g_size) continue;
    const std::string what = describe(nonblocking ? "isendrecv pairwise" : "sendrecv pairwise", dt,
                                      count, by_test ? ", polled" : "") +
                             " with rank " + std::to_string(partner);
    const Buf mine = message(dt, count, g_rank, partner, base, round);
    Buf got(dt, count);
    if (nonblocking) {
      mncl_request_t req = nullptr;
      MNCL_CALL(mncl_isendrecv(g_comm, mine.data(), count, partner, got.data(), count, partner, dt,
                               nullptr, &req));
      complete(req, by_test, "mncl_isendrecv");
    } else {
      MNCL_CALL(mncl_sendrecv(g_comm, mine.data(), count, partner, got.data(), count, partner, dt,
                              nullptr));
    }
    expect_same(got, message(dt, count, partner, g_rank, base, round), what);
  }
}

using SendRecvBatch = DtypeTest;

// Every count, in every op order, blocking; and non-blocking, waited and polled.
TEST_P(SendRecvBatch, RingShiftBothWaysInOneBatch) {
  if (g_size == 1)
    GTEST_SKIP()
        << "point to point needs two ranks (at 1: SendRecvBatchEmpty, ErrorsBatchArguments)";
  int base = 200;
  for (size_t count : kCounts)
    for (int order = 0; order < 3; ++order)
      check_ring_batch(dt(), count, order, false, false, ++base);
  // About 1 MiB each way.
  check_ring_batch(dt(), (size_t{1} << 20) / elem_size(dt()) + 1, 1, false, false, ++base);
  check_ring_batch(dt(), 1021, 1, true, false, ++base);
  check_ring_batch(dt(), 1021, 2, true, true, ++base);
  check_ring_batch(dt(), 0, 1, true, true, ++base);
}

// One buffer sent to both neighbours, and a part of it to the previous one again: send buffers
// may overlap.
TEST_P(SendRecvBatch, OverlappingSendBuffers) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  const int next = next_rank(), prev = prev_rank();
  const size_t n = 1021, part = 300, first = 17;
  const int seed = 215;
  Batch b(describe("batch sending one buffer to both neighbours", dt(), n));
  b.recv(pattern_data(dt(), prev, n, seed), prev, from_str(prev) + " (whole buffer)");
  const Buf &mine = b.send(pattern_data(dt(), g_rank, n, seed), next);
  b.send_part(mine, 0, n, prev);
  b.send_part(mine, first, part, prev);
  b.recv(pattern_data(dt(), next, n, seed), next, from_str(next) + " (whole buffer)");
  Buf want(dt(), part);
  want.copy_from(0, pattern_data(dt(), next, n, seed), first, part);
  b.recv(std::move(want), next, from_str(next) + " (a part of its buffer)");
  b.run();
}

// mncl_sendrecv: ring shift (dest = next, source = prev, counts differ per rank) for every
// count; pairwise (dest == source) blocking, and non-blocking waited and polled.
TEST_P(SendRecvBatch, SendrecvRingAndPairwise) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  int base = 220;
  for (size_t count : kCounts) check_sendrecv_ring(dt(), count, ++base);
  check_sendrecv_pairwise(dt(), 1021, false, false, ++base);
  check_sendrecv_pairwise(dt(), 1021, true, false, ++base);
  check_sendrecv_pairwise(dt(), 7, true, true, ++base);
  check_sendrecv_pairwise(dt(), 0, true, true, ++base);
  // Non-blocking around the ring.
  const int next = next_rank(), prev = prev_rank();
  const Buf mine = message(dt(), 4099, g_rank, next, ++base, 0);
  Buf got(dt(), 4099);
  mncl_request_t req = nullptr;
  MNCL_CALL(
      mncl_isendrecv(g_comm, mine.data(), 4099, next, got.data(), 4099, prev, dt(), nullptr, &req));
  complete(req, true, "mncl_isendrecv");
  expect_same(got, message(dt(), 4099, prev, g_rank, base, 0), "isendrecv ring shift, polled");
}

// Six messages each way to the same neighbours in one batch, of several dtypes and sizes (an
// empty one with a NULL buffer, one of 64 Ki elements): each must land in the receive of its place
// in the array. Even ranks list receives first, odd ranks alternate.
TEST_P(SendRecvBatch, SeveralMessagesPerPeerMixedDtypes) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  const int next = next_rank(), prev = prev_rank();
  constexpr size_t kSizes[] = {1, 1021, 0, 7, 65536 + 3, 2};
  constexpr int kMessages = static_cast<int>(sizeof kSizes / sizeof kSizes[0]);
  const int first = static_cast<int>(dt());
  auto dtype_of = [&](int m) { return kDtypes[(first + 3 * m) % MNCL_NUM_DTYPES]; };
  const int base = 230;
  Batch b(std::string("batch of 6 messages each way, mixed dtypes from ") + dtype_str(dt()));
  auto send = [&](int m) {
    if (kSizes[m] == 0) {
      b.send_empty(dtype_of(m), next);
    } else {
      b.send(message(dtype_of(m), kSizes[m], g_rank, next, base, m), next);
    }
  };
  auto recv = [&](int m) {
    if (kSizes[m] == 0) {
      b.recv_empty(dtype_of(m), prev);
    } else {
      b.recv(message(dtype_of(m), kSizes[m], prev, g_rank, base, m), prev,
             "message " + std::to_string(m) + " (" + dtype_str(dtype_of(m)) + ", count " +
                 std::to_string(kSizes[m]) + ")");
    }
  };
  if (g_rank % 2 == 0) {
    for (int m = 0; m < kMessages; ++m) recv(m);
    for (int m = 0; m < kMessages; ++m) send(m);
  } else {
    for (int m = 0; m < kMessages; ++m) {
      send(m);
      recv(m);
    }
  }
  b.run();
}

// All-to-all as one batch: every rank receives from every other rank (all receives listed
// first) and then sends to each, with a count per pair (some empty).
TEST_P(SendRecvBatch, AllToAllInOneBatch) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  const int base = 240;
  auto count = [](int from, int to) -> size_t {
    const uint64_t h = hash3(from, static_cast<size_t>(to), 240);
    return (from + 2 * to) % 5 == 1 ? 0 : 100 + h % 3000;
  };
  Batch b(std::string("batch all-to-all ") + dtype_str(dt()) + " (a count per pair)");
  for (int p = 0; p < g_size; ++p) {
    if (p != g_rank) b.recv(message(dt(), count(p, g_rank), p, g_rank, base, 0), p, from_str(p));
  }
  for (int p = g_size; p-- > 0;) {  // sends in reverse rank order
    if (p != g_rank) b.send(message(dt(), count(g_rank, p), g_rank, p, base, 0), p);
  }
  b.run();
  // Non-blocking, receives and sends interleaved.
  Batch nb(std::string("isendrecv_batch all-to-all ") + dtype_str(dt()) + " (a count per pair)");
  for (int p = 0; p < g_size; ++p) {
    if (p == g_rank) continue;
    nb.send(message(dt(), count(g_rank, p), g_rank, p, base, 1), p);
    nb.recv(message(dt(), count(p, g_rank), p, g_rank, base, 1), p, from_str(p));
  }
  complete(nb.start(), false, "mncl_isendrecv_batch");
  nb.check();
}

// Batches between plain point-to-point calls with the same peer: per round of a tournament, an
// isend and an irecv posted (and left outstanding), a batch of two messages each way, a
// blocking send and receive, then the requests completed. Each direction's messages 0..3 must
// arrive in that order. The lower rank of a pair sends first wherever blocking or stream order
// (nccl) would otherwise stop it.
TEST_P(SendRecvBatch, InterleavedWithPlainSendRecv) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  const mncl_dtype_t d = dt();
  const size_t n = 1021;
  const int base = 250;
  const Tournament tour{g_size};
  for (int round = 0; round < tour.rounds(); ++round) {
    const int p = tour.partner(g_rank, round);
    if (p >= g_size) continue;
    const bool lower = g_rank < p;
    const std::string what = describe("batch between plain sends and receives", d, n) +
                             " with rank " + std::to_string(p);
    auto out = [&](int m) { return message(d, n, g_rank, p, base + round, m); };
    auto in = [&](int m) { return message(d, n, p, g_rank, base + round, m); };
    const Buf out0 = out(0), out3 = out(3);
    Buf in0(d, n), in3(d, n);
    mncl_request_t sreq = nullptr, rreq = nullptr;
    if (lower) {
      MNCL_CALL(mncl_isend(g_comm, out0.data(), n, d, p, nullptr, &sreq));
      MNCL_CALL(mncl_irecv(g_comm, in0.data(), n, d, p, nullptr, &rreq));
    } else {
      MNCL_CALL(mncl_irecv(g_comm, in0.data(), n, d, p, nullptr, &rreq));
      MNCL_CALL(mncl_isend(g_comm, out0.data(), n, d, p, nullptr, &sreq));
    }
    Batch b(what + ": the batch");
    if (lower) {
      b.send(out(1), p);
      b.recv(in(1), p, "message 1");
      b.send(out(2), p);
      b.recv(in(2), p, "message 2");
    } else {
      b.recv(in(1), p, "message 1");
      b.recv(in(2), p, "message 2");
      b.send(out(1), p);
      b.send(out(2), p);
    }
    b.run();
    if (lower) {
      MNCL_CALL(mncl_send(g_comm, out3.data(), n, d, p, nullptr));
      MNCL_CALL(mncl_recv(g_comm, in3.data(), n, d, p, nullptr));
    } else {
      MNCL_CALL(mncl_recv(g_comm, in3.data(), n, d, p, nullptr));
      MNCL_CALL(mncl_send(g_comm, out3.data(), n, d, p, nullptr));
    }
    complete(rreq, true, "mncl_irecv");
    complete(sreq, false, "mncl_isend");
    expect_same(in0, in(0), what + ": message 0 (irecv before the batch)");
    expect_same(in3, in(3), what + ": message 3 (blocking recv after the batch)");
  }
}

INSTANTIATE_TEST_SUITE_P(All, SendRecvBatch, ::testing::ValuesIn(kDtypes), dtype_name);

// nops == 0 is a valid batch that does nothing, at every size (the only legal batch at 1 rank):
// blocking, and non-blocking completed by mncl_wait and by mncl_test; ops may be NULL then.
TEST_F(Conformance, SendRecvBatchEmpty) {
  const mncl_p2p_op_t unused = mncl_p2p_op(MNCL_P2P_SEND, nullptr, 0, MNCL_INT32, g_size + 5);
  for (const mncl_p2p_op_t *ops : {static_cast<const mncl_p2p_op_t *>(nullptr), &unused}) {
    EXPECT_EQ(mncl_sendrecv_batch(g_comm, ops, 0, nullptr), MNCL_OK) << mncl_last_error();
    for (bool by_test : {false, true}) {
      mncl_request_t req = nullptr;
      MNCL_CALL(mncl_isendrecv_batch(g_comm, ops, 0, nullptr, &req));
      ASSERT_NE(req, nullptr) << "an empty batch still gives a request to complete";
      complete(req, by_test, "mncl_isendrecv_batch of nothing");
    }
  }
  check_allreduce(MNCL_INT32, MNCL_SUM, 33, false, 260);
}

// Non-blocking batches outstanding around a blocking collective (which needs every rank while
// the batches may still run), completed in reverse order, one by mncl_test.
TEST_F(Conformance, SendRecvBatchOutstandingAcrossCollective) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  const int next = next_rank(), prev = prev_rank();
  const int base = 261;
  Batch first(
      describe("isendrecv_batch ring, outstanding across an allreduce", MNCL_FLOAT32, kP2PLarge));
  first.recv(message(MNCL_FLOAT32, kP2PLarge, prev, g_rank, base, 0), prev, from_str(prev));
  first.send(message(MNCL_FLOAT32, kP2PLarge, g_rank, next, base, 0), next);
  Batch second(describe("isendrecv_batch ring, the other way", MNCL_INT64, 1021));
  second.recv(message(MNCL_INT64, 1021, next, g_rank, base, 1), next, from_str(next));
  second.send(message(MNCL_INT64, 1021, g_rank, prev, base, 1), prev);
  const mncl_request_t r1 = first.start();
  const mncl_request_t r2 = second.start();
  check_allreduce(MNCL_INT64, MNCL_SUM, 1021, true, base + 2);
  complete(r2, true, "mncl_isendrecv_batch (second)");
  complete(r1, false, "mncl_isendrecv_batch (first)");
  first.check();
  second.check();
}

// A caller compiled against a newer header with a longer op (new fields zero): the array's
// stride is its struct_size, and the batch runs as usual.
TEST_F(Conformance, SendRecvBatchLongerOpStruct) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  struct NewerOp {
    mncl_p2p_op_t op;
    uint64_t added[3];  // zero
  };
  const int next = next_rank(), prev = prev_rank();
  const int base = 262;
  const Buf to_next = message(MNCL_UINT32, 999, g_rank, next, base, 0),
            to_prev = message(MNCL_UINT32, 999, g_rank, prev, base, 1);
  Buf from_prev(MNCL_UINT32, 999), from_next(MNCL_UINT32, 999);
  std::vector<NewerOp> ops(4);
  std::memset(static_cast<void *>(ops.data()), 0, ops.size() * sizeof(NewerOp));
  ops[0].op = mncl_p2p_op(MNCL_P2P_RECV, from_prev.data(), 999, MNCL_UINT32, prev);
  ops[1].op = mncl_p2p_op(MNCL_P2P_SEND, to_next.data(), 999, MNCL_UINT32, next);
  ops[2].op = mncl_p2p_op(MNCL_P2P_SEND, to_prev.data(), 999, MNCL_UINT32, prev);
  ops[3].op = mncl_p2p_op(MNCL_P2P_RECV, from_next.data(), 999, MNCL_UINT32, next);
  for (NewerOp &o : ops) o.op.struct_size = sizeof(NewerOp);
  MNCL_CALL(mncl_sendrecv_batch(g_comm, &ops[0].op, ops.size(), nullptr));
  expect_same(from_prev, message(MNCL_UINT32, 999, prev, g_rank, base, 0),
              "batch of longer op structs: " + from_str(prev));
  expect_same(from_next, message(MNCL_UINT32, 999, next, g_rank, base, 1),
              "batch of longer op structs: " + from_str(next));
}

// ---------------------------------------------------------------------------------------------
// Batch argument errors: refused before anything starts, with the op's index and the reason
// in mncl_last_error(). The bad op sits among valid ones that would send to and receive from
// the neighbours; had any of them started, the checked ring batch at the end would receive its
// stale message (same count, other payload) or fail.
// ---------------------------------------------------------------------------------------------

[[noreturn]] void die_accepted(const std::string &what) {
  ADD_FAILURE() << what << " was accepted";
  std::fprintf(stderr, "rank %d: FATAL: %s was accepted: its ops may run unmatched\n", g_rank,
               what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

// Whether an error message names op `index`: "op 2", or among others ("ops 1 and 2").
bool names_op(const std::string &msg, int index) {
  const std::regex re("\\bops? ([0-9]+(, | and ))*" + std::to_string(index) + "\\b");
  return std::regex_search(msg, re);
}
// Whether msg contains `word`; "op N" words must name op N (names_op).
bool mentions(const std::string &msg, const std::string &word) {
  if (word.rfind("op ", 0) == 0) return names_op(msg, std::stoi(word.substr(3)));
  return msg.find(word) != std::string::npos;
}

// The blocking and non-blocking forms both refuse ops[0..nops) with `want`, naming `words`.
void expect_batch_refused(const mncl_p2p_op_t *ops, size_t nops, mncl_status_t want,
                          const std::vector<std::string> &words, const std::string &what) {
  for (bool nonblocking : {false, true}) {
    const std::string call =
        std::string(nonblocking ? "mncl_isendrecv_batch" : "mncl_sendrecv_batch") + " with " + what;
    mncl_request_t req = nullptr;
    const mncl_status_t st = nonblocking ? mncl_isendrecv_batch(g_comm, ops, nops, nullptr, &req)
                                         : mncl_sendrecv_batch(g_comm, ops, nops, nullptr);
    if (st == MNCL_OK) die_accepted(call);
    EXPECT_EQ(st, want) << call << ": " << mncl_status_string(st) << ": " << mncl_last_error();
    const std::string msg = mncl_last_error();
    EXPECT_NE(msg, "") << call << " failed without a message";
    for (const std::string &w : words)
      EXPECT_TRUE(mentions(msg, w)) << call << ": the message lacks \"" << w << "\": " << msg;
  }
}
void expect_batch_refused(const std::vector<mncl_p2p_op_t> &ops, mncl_status_t want,
                          const std::vector<std::string> &words, const std::string &what) {
  expect_batch_refused(ops.data(), ops.size(), want, words, what);
}

void expect_sendrecv_refused(const void *sendbuf, size_t sendcount, int dest, void *recvbuf,
                             size_t recvcount, int source, mncl_dtype_t dt,
                             const std::vector<std::string> &words, const std::string &what) {
  for (bool nonblocking : {false, true}) {
    const std::string call =
        std::string(nonblocking ? "mncl_isendrecv" : "mncl_sendrecv") + " with " + what;
    mncl_request_t req = nullptr;
    const mncl_status_t st = nonblocking ? mncl_isendrecv(g_comm, sendbuf, sendcount, dest, recvbuf,
                                                          recvcount, source, dt, nullptr, &req)
                                         : mncl_sendrecv(g_comm, sendbuf, sendcount, dest, recvbuf,
                                                         recvcount, source, dt, nullptr);
    if (st == MNCL_OK) die_accepted(call);
    EXPECT_EQ(st, MNCL_ERR_INVALID_ARGUMENT)
        << call << ": " << mncl_status_string(st) << ": " << mncl_last_error();
    const std::string msg = mncl_last_error();
    EXPECT_NE(msg, "") << call << " failed without a message";
    for (const std::string &w : words)
      EXPECT_TRUE(mentions(msg, w)) << call << ": the message lacks \"" << w << "\": " << msg;
  }
}

TEST_F(Conformance, ErrorsBatchArguments) {
  const int self = g_rank;
  Buf a(MNCL_INT32, 64), b(MNCL_INT32, 64);
  const auto bad_dtype = static_cast<mncl_dtype_t>(MNCL_NUM_DTYPES + 3);
  mncl_request_t req = nullptr;

  // What even 1 rank can check: itself and out-of-range peers, alone in a batch.
  for (mncl_p2p_kind_t kind : {MNCL_P2P_SEND, MNCL_P2P_RECV}) {
    const char *k = kind == MNCL_P2P_SEND ? "a send" : "a receive";
    expect_batch_refused({mncl_p2p_op(kind, a.data(), 4, MNCL_INT32, self)},
                         MNCL_ERR_INVALID_ARGUMENT, {"op 0", "peer"},
                         std::string(k) + " to/from this rank itself");
    for (int peer : {g_size, -1, g_size + 7}) {
      expect_batch_refused({mncl_p2p_op(kind, a.data(), 4, MNCL_INT32, peer)},
                           MNCL_ERR_INVALID_ARGUMENT, {"op 0", "peer"},
                           std::string(k) + " with peer " + std::to_string(peer));
    }
  }
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_sendrecv_batch(g_comm, nullptr, 2, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_isendrecv_batch(g_comm, nullptr, 2, nullptr, &req));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_sendrecv_batch(nullptr, nullptr, 0, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_isendrecv_batch(g_comm, nullptr, 0, nullptr, nullptr));
  EXPECT_NE(std::strstr(mncl_last_error(), "request"), nullptr) << mncl_last_error();
  expect_sendrecv_refused(a.data(), 4, self, b.data(), 4, self, MNCL_INT32, {},
                          "dest and source this rank itself");
  expect_sendrecv_refused(a.data(), 4, g_size, b.data(), 4, -1, MNCL_INT32, {},
                          "dest and source out of range");
  EXPECT_MNCL_ERROR(
      MNCL_ERR_INVALID_ARGUMENT,
      mncl_isendrecv(g_comm, a.data(), 0, self, b.data(), 0, self, MNCL_INT32, nullptr, nullptr));
  if (g_size == 1) {
    check_allreduce(MNCL_INT32, MNCL_SUM, 9, true, 270);  // still usable
    return;
  }

  const int next = next_rank(), prev = prev_rank();
  const int base = 271;
  const size_t n = 64;
  // Valid ops around the bad one (index 2): a send to the next rank, a receive from the
  // previous one, and after it a receive from the next and a send to the previous.
  const Buf stale_next = message(MNCL_INT32, n, g_rank, next, base, 9),
            stale_prev = message(MNCL_INT32, n, g_rank, prev, base, 9);
  Buf r0(MNCL_INT32, n), r1(MNCL_INT32, n), spare(MNCL_INT32, n);
  auto with = [&](mncl_p2p_op_t bad) {
    return std::vector<mncl_p2p_op_t>{
        mncl_p2p_op(MNCL_P2P_SEND, stale_next.data(), n, MNCL_INT32, next),
        mncl_p2p_op(MNCL_P2P_RECV, r0.data(), n, MNCL_INT32, prev), bad,
        mncl_p2p_op(MNCL_P2P_RECV, r1.data(), n, MNCL_INT32, next),
        mncl_p2p_op(MNCL_P2P_SEND, stale_prev.data(), n, MNCL_INT32, prev)};
  };
  const mncl_p2p_op_t good = mncl_p2p_op(MNCL_P2P_RECV, spare.data(), 4, MNCL_INT32, next);
  // The valid batch itself is fine (checked at the end, where it runs for real).
  auto bad = [&](auto change) {
    mncl_p2p_op_t op = good;
    change(op);
    return with(op);
  };
  const std::vector<std::string> op2 = {"op 2"};
  auto words = [&](const char *reason) { return std::vector<std::string>{"op 2", reason}; };
  for (int peer : {g_size, -1, self}) {
    expect_batch_refused(bad([&](mncl_p2p_op_t &o) { o.peer = peer; }), MNCL_ERR_INVALID_ARGUMENT,
                         words("peer"), "op 2's peer " + std::to_string(peer));
  }
  for (int32_t kind : {2, -1, 77}) {
    expect_batch_refused(bad([&](mncl_p2p_op_t &o) { o.kind = kind; }), MNCL_ERR_INVALID_ARGUMENT,
                         words("kind"), "op 2's kind " + std::to_string(kind));
  }
  for (int32_t dtype : {static_cast<int32_t>(bad_dtype), -1}) {
    expect_batch_refused(bad([&](mncl_p2p_op_t &o) { o.dtype = dtype; }), MNCL_ERR_INVALID_ARGUMENT,
                         words("dtype"), "op 2's dtype " + std::to_string(dtype));
  }
  for (int32_t kind : {MNCL_P2P_SEND, MNCL_P2P_RECV}) {
    expect_batch_refused(bad([&](mncl_p2p_op_t &o) {
                           o.kind = kind;
                           o.buf = nullptr;
                         }),
                         MNCL_ERR_INVALID_ARGUMENT, words("NULL"),
                         std::string("op 2 ") + (kind == MNCL_P2P_SEND ? "a send" : "a receive") +
                             " of 4 elements from NULL");
  }
  expect_batch_refused(bad([&](mncl_p2p_op_t &o) { o.reserved0 = 1; }), MNCL_ERR_INVALID_ARGUMENT,
                       words("reserved0"), "op 2's reserved0 = 1");
  // Receive buffers overlapping each other, or a send buffer (before or after them).
  expect_batch_refused(bad([&](mncl_p2p_op_t &o) { o.buf = r0.at(n - 2); }),
                       MNCL_ERR_INVALID_ARGUMENT, words("overlap"),
                       "op 2 receiving into the end of op 1's receive buffer");
  expect_batch_refused(bad([&](mncl_p2p_op_t &o) { o.buf = const_cast<void *>(stale_next.at(5)); }),
                       MNCL_ERR_INVALID_ARGUMENT, words("overlap"),
                       "op 2 receiving into op 0's send buffer");
  {
    std::vector<mncl_p2p_op_t> ops = with(good);
    ops[4].buf = spare.data();  // op 4 sends what op 2 receives into
    ops[4].count = 4;
    expect_batch_refused(ops, MNCL_ERR_INVALID_ARGUMENT, {"overlap"},
                         "op 4 sending from op 2's receive buffer");
    ops = with(good);
    ops[1].buf = r1.data();  // ops 1 and 3: one receive buffer
    expect_batch_refused(ops, MNCL_ERR_INVALID_ARGUMENT, {"op 3", "overlap"},
                         "ops 1 and 3 receiving into one buffer");
  }
  // struct_size: smaller than the header's op; different from op 0's; longer with a non-zero
  // field this library does not know (MNCL_ERR_NOT_SUPPORTED).
  for (size_t size : {size_t{0}, size_t{8}, sizeof(mncl_p2p_op_t) - 4}) {
    std::vector<mncl_p2p_op_t> ops = with(good);
    for (auto &o : ops) o.struct_size = size;
    expect_batch_refused(ops, MNCL_ERR_INVALID_ARGUMENT, {"struct_size"},
                         "struct_size " + std::to_string(size));
  }
  {
    std::vector<mncl_p2p_op_t> ops = with(good);
    ops[2].struct_size = sizeof(mncl_p2p_op_t) + 8;
    expect_batch_refused(ops, MNCL_ERR_INVALID_ARGUMENT, {"op 2", "struct_size"},
                         "op 2's struct_size unlike op 0's");
  }
  {
    struct NewerOp {
      mncl_p2p_op_t op;
      uint64_t added;
    };
    const std::vector<mncl_p2p_op_t> plain = with(good);
    std::vector<NewerOp> ops(plain.size());
    std::memset(static_cast<void *>(ops.data()), 0, ops.size() * sizeof(NewerOp));
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].op = plain[i];
      ops[i].op.struct_size = sizeof(NewerOp);
    }
    ops[2].added = 1;
    expect_batch_refused(&ops[0].op, ops.size(), MNCL_ERR_NOT_SUPPORTED, {"op 2"},
                         "op 2 setting a field newer than this library");
  }
  // The non-blocking form needs somewhere to put the request.
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_isendrecv_batch(g_comm, with(good).data(), 5, nullptr, nullptr));
  EXPECT_NE(std::strstr(mncl_last_error(), "request"), nullptr) << mncl_last_error();
  // mncl_sendrecv: what its batch of two would be refused for.
  expect_sendrecv_refused(a.data(), 4, next, b.data(), 4, self, MNCL_INT32, {},
                          "source this rank itself");
  expect_sendrecv_refused(a.data(), 4, self, b.data(), 4, prev, MNCL_INT32, {},
                          "dest this rank itself");
  expect_sendrecv_refused(nullptr, 4, next, b.data(), 4, prev, MNCL_INT32, {"NULL"},
                          "a NULL sendbuf");
  expect_sendrecv_refused(a.data(), 4, next, nullptr, 4, prev, MNCL_INT32, {"NULL"},
                          "a NULL recvbuf");
  expect_sendrecv_refused(a.data(), 8, next, a.at(4), 8, prev, MNCL_INT32, {"overlap"},
                          "recvbuf overlapping sendbuf");
  expect_sendrecv_refused(a.data(), 4, next, b.data(), 4, prev, bad_dtype, {"dtype"},
                          "a bad dtype");
  EXPECT_MNCL_ERROR(
      MNCL_ERR_INVALID_ARGUMENT,
      mncl_isendrecv(g_comm, a.data(), 4, next, b.data(), 4, prev, MNCL_INT32, nullptr, nullptr));

  // Nothing above started: the valid batch, run now, gets this batch's messages, and a
  // collective still matches on every rank.
  Batch ring("the ring batch after the refused ones");
  ring.send(message(MNCL_INT32, n, g_rank, next, base, 0), next);
  ring.recv(message(MNCL_INT32, n, prev, g_rank, base, 0), prev, from_str(prev));
  ring.recv(message(MNCL_INT32, n, next, g_rank, base, 1), next, from_str(next));
  ring.send(message(MNCL_INT32, n, g_rank, prev, base, 1), prev);
  ring.run();
  check_allreduce(MNCL_INT32, MNCL_SUM, 9, true, 272);
}

// Every refusal of gatherv/scatterv, blocking and not, with its status and the words its message
// must contain. Each rank names itself the root, so what only a root checks is refused on every
// rank before anything is sent (no rank waits for another).
void expect_rooted_v_refused(bool gather, const void *sendbuf, const size_t *counts,
                             const size_t *displs, void *recvbuf, size_t count, mncl_dtype_t dt,
                             int root, mncl_status_t want, const std::vector<std::string> &words,
                             const std::string &what) {
  for (bool nonblocking : {false, true}) {
    const std::string name =
        std::string(nonblocking ? "mncl_i" : "mncl_") + (gather ? "gatherv" : "scatterv");
    const std::string call = name + " with " + what;
    mncl_request_t req = nullptr;
    mncl_request_t *r = nonblocking ? &req : nullptr;
    mncl_status_t st;
    if (gather) {
      st =
          nonblocking
              ? mncl_igatherv(g_comm, sendbuf, count, recvbuf, counts, displs, dt, root, nullptr, r)
              : mncl_gatherv(g_comm, sendbuf, count, recvbuf, counts, displs, dt, root, nullptr);
    } else {
      st = nonblocking
               ? mncl_iscatterv(g_comm, sendbuf, counts, displs, recvbuf, count, dt, root, nullptr,
                                r)
               : mncl_scatterv(g_comm, sendbuf, counts, displs, recvbuf, count, dt, root, nullptr);
    }
    if (st == MNCL_OK) die_accepted(call);
    EXPECT_EQ(st, want) << call << ": " << mncl_status_string(st) << ": " << mncl_last_error();
    EXPECT_EQ(req, nullptr) << call << " left a request behind";
    const std::string msg = mncl_last_error();
    EXPECT_TRUE(mentions(msg, name + ":"))
        << call << ": the message does not name " << name << ": " << msg;
    for (const std::string &w : words)
      EXPECT_TRUE(mentions(msg, w)) << call << ": the message lacks \"" << w << "\": " << msg;
  }
}

TEST_F(Conformance, ErrorsRootedVArguments) {
  const size_t n = static_cast<size_t>(g_size), me = static_cast<size_t>(g_rank);
  const int self = g_rank;  // every rank its own root: see expect_rooted_v_refused
  std::vector<size_t> counts(n, 4), displs(n);
  for (size_t i = 0; i < n; ++i) displs[i] = 4 * i;
  Buf blocks(MNCL_INT32, 4 * n + 8), own(MNCL_INT32, 4);
  const auto bad_dtype = static_cast<mncl_dtype_t>(MNCL_NUM_DTYPES + 3);
  const auto inv = MNCL_ERR_INVALID_ARGUMENT;
  for (bool gather : {true, false}) {
    // gatherv sends `own` and receives into `blocks`; scatterv the other way round.
    const void *send = gather ? own.data() : blocks.data();
    void *recv = gather ? blocks.data() : own.data();
    const char *counts_name = gather ? "recvcounts" : "sendcounts";
    auto refused = [&](const void *sb, const size_t *c, const size_t *d, void *rb, size_t k,
                       mncl_dtype_t dt, int root, mncl_status_t st,
                       const std::vector<std::string> &words, const std::string &what) {
      expect_rooted_v_refused(gather, sb, c, d, rb, k, dt, root, st, words, what);
    };
    for (int root : {g_size, -1}) {
      refused(send, counts.data(), displs.data(), recv, 4, MNCL_INT32, root, inv,
              {"root " + std::to_string(root), "out of range"}, "root out of range");
    }
    refused(send, counts.data(), displs.data(), recv, 4, bad_dtype, self, inv, {"dtype"},
            "a bad dtype");
    refused(send, nullptr, displs.data(), recv, 4, MNCL_INT32, self, inv,
            {counts_name, "NULL on the root"}, "no counts on the root");
    refused(send, counts.data(), nullptr, recv, 4, MNCL_INT32, self, inv,
            {"displs", "NULL on the root"}, "no displs on the root");
    refused(gather ? nullptr : send, counts.data(), displs.data(), gather ? recv : nullptr, 4,
            MNCL_INT32, self, inv, {gather ? "sendbuf is NULL" : "recvbuf is NULL"},
            "no buffer for the own block");
    refused(gather ? send : nullptr, counts.data(), displs.data(), gather ? nullptr : recv, 4,
            MNCL_INT32, self, inv,
            {gather ? "recvbuf is NULL on the root" : "sendbuf is NULL on the root"},
            "no buffer for the blocks on the root");
    refused(send, counts.data(), displs.data(), recv, 3, MNCL_INT32, self, inv,
            {"differs from", std::string(counts_name) + "[" + std::to_string(self) + "] = 4",
             "the root's own block"},
            "an own count that differs from the root's entry");
    // Overlap that is not the in-place form: the own block one element past its place.
    Buf inside(MNCL_INT32, 4 * n + 8);
    void *shifted = inside.at(displs[me] + 1);
    refused(gather ? shifted : inside.data(), counts.data(), displs.data(),
            gather ? inside.data() : shifted, 4, MNCL_INT32, self, inv,
            {"overlap", "in-place form"}, "an own block overlapping the blocks");
    if (g_size > 1) {
      std::vector<size_t> d = displs;
      d[1] = d[0] + 2;  // ranks 0 and 1 overlap by two elements
      if (gather) {
        refused(send, counts.data(), d.data(), recv, 4, MNCL_INT32, self, inv,
                {"blocks of ranks 0 and 1 overlap"}, "overlapping receive blocks");
      }
    }
    std::vector<size_t> huge = counts;
    huge[me] = SIZE_MAX / 2;
    refused(send, huge.data(), displs.data(), recv, SIZE_MAX / 2, MNCL_INT32, self, inv,
            {"overflows"}, "a count that overflows");
    // A request must have somewhere to go.
    const mncl_status_t st = gather
                                 ? mncl_igatherv(g_comm, send, 4, recv, counts.data(),
                                                 displs.data(), MNCL_INT32, self, nullptr, nullptr)
                                 : mncl_iscatterv(g_comm, send, counts.data(), displs.data(), recv,
                                                  4, MNCL_INT32, self, nullptr, nullptr);
    EXPECT_EQ(st, inv);
    EXPECT_TRUE(mentions(mncl_last_error(), "request")) << mncl_last_error();
  }
  EXPECT_MNCL_ERROR(inv, mncl_gatherv(nullptr, own.data(), 4, blocks.data(), counts.data(),
                                      displs.data(), MNCL_INT32, 0, nullptr));
  EXPECT_MNCL_ERROR(inv, mncl_scatterv(nullptr, blocks.data(), counts.data(), displs.data(),
                                       own.data(), 4, MNCL_INT32, 0, nullptr));
  // Nothing started anywhere: both run cleanly afterwards.
  check_gatherv(MNCL_INT32, VShape::kUneven, VLayout::kReversedWithGaps, 0, false, 280);
  check_scatterv(MNCL_INT32, VShape::kUneven, VLayout::kPacked, g_size - 1, true, 281);
}

// ---------------------------------------------------------------------------------------------
// Split
// ---------------------------------------------------------------------------------------------

// Even and odd ranks form two communicators; key = size - rank reverses the order.
TEST_F(Conformance, SplitEvenOddReversed) {
  const int color = g_rank % 2;
  std::vector<int> members;  // old ranks of my color, in new-rank order
  for (int r = g_size - 1; r >= 0; --r)
    if (r % 2 == color) members.push_back(r);
  const int want_rank =
      static_cast<int>(std::find(members.begin(), members.end(), g_rank) - members.begin());

  mncl_comm_t sub = nullptr;
  MNCL_CALL(mncl_comm_split(g_comm, color, g_size - g_rank, &sub));
  ASSERT_NE(sub, nullptr);
  int rank = -1, size = -1;
  EXPECT_EQ(mncl_comm_rank(sub, &rank), MNCL_OK);
  EXPECT_EQ(mncl_comm_size(sub, &size), MNCL_OK);
  EXPECT_EQ(size, static_cast<int>(members.size()));
  EXPECT_EQ(rank, want_rank);
  const char *backend = nullptr, *parent_backend = nullptr;
  EXPECT_EQ(mncl_comm_backend(sub, &backend), MNCL_OK);
  EXPECT_EQ(mncl_comm_backend(g_comm, &parent_backend), MNCL_OK);
  if (backend && parent_backend) {
    EXPECT_STREQ(backend, parent_backend);
  }

  // Collectives on the sub-communicator: the sum of the old ranks, and a bcast from new rank 0
  // (the highest old rank of the color).
  int64_t value = g_rank, sum = -1;
  MNCL_CALL(mncl_allreduce(sub, &value, &sum, 1, MNCL_INT64, MNCL_SUM, nullptr));
  int64_t want_sum = 0;
  for (int r : members) want_sum += r;
  EXPECT_EQ(sum, want_sum);
  int32_t from_root = g_rank;
  MNCL_CALL(mncl_bcast(sub, &from_root, 1, MNCL_INT32, 0, nullptr));
  EXPECT_EQ(from_root, members.front());
  check_allgather(MNCL_FLOAT32, 0, false, 50);  // the parent still works in between
  int32_t gathered[64] = {0};
  if (members.size() <= 64) {
    int32_t mine = g_rank;
    MNCL_CALL(mncl_allgather(sub, &mine, gathered, 1, MNCL_INT32, nullptr));
    for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(gathered[i], members[i]) << "slot " << i;
  }
  MNCL_CALL(mncl_comm_destroy(sub));
  MNCL_CALL(mncl_barrier(g_comm, nullptr));
}

// Rank 0 opts out with MNCL_SPLIT_NONE (gets NULL); the others form a communicator.
TEST_F(Conformance, SplitNoneAndSameColor) {
  mncl_comm_t sub = reinterpret_cast<mncl_comm_t>(&g_rank);  // must be overwritten
  MNCL_CALL(mncl_comm_split(g_comm, g_rank == 0 ? MNCL_SPLIT_NONE : 3, 0, &sub));
  if (g_rank == 0) {
    EXPECT_EQ(sub, nullptr) << "MNCL_SPLIT_NONE must give NULL";
  } else {
    ASSERT_NE(sub, nullptr);
    int rank = -1, size = -1;
    EXPECT_EQ(mncl_comm_rank(sub, &rank), MNCL_OK);
    EXPECT_EQ(mncl_comm_size(sub, &size), MNCL_OK);
    EXPECT_EQ(rank, g_rank - 1);
    EXPECT_EQ(size, g_size - 1);
    float v = 1.0f, total = 0;
    MNCL_CALL(mncl_allreduce(sub, &v, &total, 1, MNCL_FLOAT32, MNCL_SUM, nullptr));
    EXPECT_EQ(total, static_cast<float>(g_size - 1));
    MNCL_CALL(mncl_comm_destroy(sub));
  }
  // Same color and key everywhere: a duplicate of the world, in the same order.
  mncl_comm_t dup = nullptr;
  MNCL_CALL(mncl_comm_split(g_comm, 0, 0, &dup));
  ASSERT_NE(dup, nullptr);
  int rank = -1, size = -1;
  EXPECT_EQ(mncl_comm_rank(dup, &rank), MNCL_OK);
  EXPECT_EQ(mncl_comm_size(dup, &size), MNCL_OK);
  EXPECT_EQ(rank, g_rank);
  EXPECT_EQ(size, g_size);
  // Interleave operations on the duplicate and the world: they must not mix.
  int32_t a = g_rank + 1, b = 0;
  MNCL_CALL(mncl_allreduce(dup, &a, &b, 1, MNCL_INT32, MNCL_MAX, nullptr));
  EXPECT_EQ(b, g_size);
  check_allreduce(MNCL_INT32, MNCL_SUM, 1021, false, 51);
  MNCL_CALL(mncl_allreduce(dup, &a, &b, 1, MNCL_INT32, MNCL_MIN, nullptr));
  EXPECT_EQ(b, 1);
  MNCL_CALL(mncl_comm_destroy(dup));
}

// Abort is local and sticky: every later operation on the communicator fails with
// MNCL_ERR_ABORTED, a second abort is harmless, and the parent communicator is unaffected.
TEST_F(Conformance, AbortSubCommunicator) {
  mncl_comm_t dup = nullptr;
  MNCL_CALL(mncl_comm_split(g_comm, 0, 0, &dup));
  ASSERT_NE(dup, nullptr);
  int32_t v = 1, out = 0;
  MNCL_CALL(mncl_allreduce(dup, &v, &out, 1, MNCL_INT32, MNCL_SUM, nullptr));
  EXPECT_EQ(out, g_size);
  // An abort is abrupt: it may cut a peer still finishing the allreduce above (Gloo's
  // halving-doubling returns before its last send is flushed). Abort only once all are done.
  MNCL_CALL(mncl_barrier(g_comm, nullptr));
  EXPECT_EQ(mncl_comm_abort(dup), MNCL_OK) << mncl_last_error();
  EXPECT_EQ(mncl_comm_abort(dup), MNCL_OK) << mncl_last_error();
  EXPECT_MNCL_ERROR(MNCL_ERR_ABORTED,
                    mncl_allreduce(dup, &v, &out, 1, MNCL_INT32, MNCL_SUM, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_ABORTED, mncl_barrier(dup, nullptr));
  // A non-blocking call fails either at once or when completed.
  mncl_request_t req = nullptr;
  mncl_status_t st = mncl_iallreduce(dup, &v, &out, 1, MNCL_INT32, MNCL_SUM, nullptr, &req);
  if (st == MNCL_OK) st = mncl_wait(req, -1);
  EXPECT_EQ(st, MNCL_ERR_ABORTED) << mncl_last_error();
  int rank = -1;
  EXPECT_EQ(mncl_comm_rank(dup, &rank), MNCL_OK) << "the handle stays valid after an abort";
  EXPECT_EQ(rank, g_rank);
  const auto t0 = std::chrono::steady_clock::now();
  st = mncl_comm_destroy(dup);
  EXPECT_TRUE(st == MNCL_OK || st == MNCL_ERR_ABORTED)
      << "mncl_comm_destroy of an aborted communicator: " << mncl_status_string(st) << ": "
      << mncl_last_error();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5))
      << "destroying an aborted communicator should not wait for its peers";
  check_allreduce(MNCL_FLOAT64, MNCL_MAX, 33, true, 62);  // the world is unaffected
}

// ---------------------------------------------------------------------------------------------
// Error paths: local argument errors fail on every rank with the documented status and a
// message, and leave the communicator usable.
// ---------------------------------------------------------------------------------------------

TEST_F(Conformance, ErrorsRootOutOfRange) {
  Buf a(MNCL_FLOAT32, 4), b(MNCL_FLOAT32, 4 * static_cast<size_t>(g_size));
  for (int root : {g_size, -1, g_size + 7}) {
    EXPECT_MNCL_ERROR(
        MNCL_ERR_INVALID_ARGUMENT,
        mncl_reduce(g_comm, a.data(), b.data(), 4, MNCL_FLOAT32, MNCL_SUM, root, nullptr));
    EXPECT_NE(std::strstr(mncl_last_error(), "root"), nullptr) << mncl_last_error();
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_bcast(g_comm, a.data(), 4, MNCL_FLOAT32, root, nullptr));
    EXPECT_NE(std::strstr(mncl_last_error(), "root"), nullptr) << mncl_last_error();
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_scatter(g_comm, b.data(), a.data(), 4, MNCL_FLOAT32, root, nullptr));
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_gather(g_comm, a.data(), b.data(), 4, MNCL_FLOAT32, root, nullptr));
    mncl_request_t req = nullptr;
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_ibcast(g_comm, a.data(), 4, MNCL_FLOAT32, root, nullptr, &req));
  }
  check_allreduce(MNCL_FLOAT32, MNCL_SUM, 7, false, 60);  // still usable
}

TEST_F(Conformance, ErrorsBadArguments) {
  Buf a(MNCL_INT32, 8), b(MNCL_INT32, 8 * static_cast<size_t>(g_size));
  const auto bad_dtype = static_cast<mncl_dtype_t>(MNCL_NUM_DTYPES + 3);
  const auto bad_op = static_cast<mncl_op_t>(77);
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_allreduce(nullptr, a.data(), b.data(), 8, MNCL_INT32, MNCL_SUM, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_allreduce(g_comm, a.data(), b.data(), 8, bad_dtype, MNCL_SUM, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_allreduce(g_comm, a.data(), b.data(), 8, MNCL_INT32, bad_op, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_allreduce(g_comm, nullptr, b.data(), 8, MNCL_INT32, MNCL_SUM, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_allreduce(g_comm, a.data(), nullptr, 8, MNCL_INT32, MNCL_SUM, nullptr));
  // Overlap that is not the in-place form.
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_allreduce(g_comm, a.data(), a.at(1), 4, MNCL_INT32, MNCL_SUM, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_bcast(g_comm, nullptr, 8, MNCL_INT32, 0, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_barrier(nullptr, nullptr));
  // Point to point: to oneself or out of range.
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_send(g_comm, a.data(), 8, MNCL_INT32, g_rank, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_recv(g_comm, a.data(), 8, MNCL_INT32, g_size, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_send(g_comm, a.data(), 8, MNCL_INT32, -1, nullptr));
  // Non-blocking forms need somewhere to put the request; requests must be real.
  EXPECT_MNCL_ERROR(
      MNCL_ERR_INVALID_ARGUMENT,
      mncl_iallreduce(g_comm, a.data(), b.data(), 8, MNCL_INT32, MNCL_SUM, nullptr, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_ibarrier(g_comm, nullptr, nullptr));
  int done = 0;
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_test(nullptr, &done));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_wait(nullptr, -1));
  // Coalesced: a NULL buffer with a non-zero count.
  const void *sendbufs[] = {a.data(), nullptr};
  void *recvbufs[] = {b.data(), b.at(4)};
  const size_t counts[] = {4, 4};
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                    mncl_allreduce_coalesced(g_comm, sendbufs, recvbufs, counts, 2, MNCL_INT32,
                                             MNCL_SUM, nullptr));
  // allgatherv / alltoallv: what one rank can check (every rank makes the same bad call).
  {
    const size_t n = static_cast<size_t>(g_size), me = static_cast<size_t>(g_rank);
    std::vector<size_t> counts(n, 2), displs(n), zeros(n, 0);
    for (size_t r = 0; r < n; ++r) displs[r] = 2 * r;
    Buf recv(MNCL_INT32, 2 * n + 2), send(MNCL_INT32, 2 * n);
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_allgatherv(g_comm, a.data(), 2, recv.data(), nullptr, displs.data(),
                                      MNCL_INT32, nullptr));
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_allgatherv(g_comm, a.data(), 3, recv.data(), counts.data(),
                                      displs.data(), MNCL_INT32, nullptr));  // != recvcounts[me]
    if (n > 1) {
      std::vector<size_t> overlapping = displs;
      overlapping[n - 1] = overlapping[n - 2] + 1;  // two blocks share an element
      EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                        mncl_allgatherv(g_comm, a.data(), 2, recv.data(), counts.data(),
                                        overlapping.data(), MNCL_INT32, nullptr));
    }
    std::vector<size_t> huge = counts;
    huge[me] = SIZE_MAX / 2;
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_allgatherv(g_comm, a.data(), huge[me], recv.data(), huge.data(),
                                      displs.data(), MNCL_INT32, nullptr));
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_alltoallv(g_comm, send.data(), counts.data(), displs.data(), send.data(),
                                     counts.data(), displs.data(), MNCL_INT32,
                                     nullptr));  // no in-place form
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_alltoallv(g_comm, send.data(), counts.data(), nullptr, recv.data(),
                                     counts.data(), displs.data(), MNCL_INT32, nullptr));
    std::vector<size_t> self = counts;
    self[me] = 1;  // this rank's block to itself: 2 sent, 1 expected
    EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT,
                      mncl_alltoallv(g_comm, send.data(), counts.data(), displs.data(), recv.data(),
                                     self.data(), displs.data(), MNCL_INT32, nullptr));
    EXPECT_MNCL_ERROR(
        MNCL_ERR_INVALID_ARGUMENT,
        mncl_ialltoallv(g_comm, send.data(), counts.data(), displs.data(), recv.data(),
                        counts.data(), displs.data(), MNCL_INT32, nullptr, nullptr));
    // All counts 0 with NULL buffers is a valid no-op.
    EXPECT_EQ(mncl_alltoallv(g_comm, nullptr, zeros.data(), zeros.data(), nullptr, zeros.data(),
                             zeros.data(), MNCL_INT32, nullptr),
              MNCL_OK)
        << mncl_last_error();
  }
  // Queries.
  int v = 0;
  const char *name = nullptr;
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_rank(g_comm, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_rank(nullptr, &v));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_size(nullptr, &v));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_backend(g_comm, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_backend(nullptr, &name));
  mncl_comm_t sub = nullptr;
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_split(nullptr, 0, 0, &sub));
  // Count 0 with NULL buffers is a valid no-op.
  EXPECT_EQ(mncl_allreduce(g_comm, nullptr, nullptr, 0, MNCL_INT32, MNCL_SUM, nullptr), MNCL_OK)
      << mncl_last_error();
  check_allreduce(MNCL_INT32, MNCL_SUM, 9, true, 61);  // still usable
}

// A malformed config is refused before any rendezvous, on every rank.
TEST_F(Conformance, ErrorsBadConfig) {
  mncl_comm_t c = nullptr;
  mncl_config_t cfg = MNCL_CONFIG_INIT;
  cfg.magic = 0x12345678u;
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_create(&cfg, &c));
  EXPECT_EQ(c, nullptr);
  mncl_config_t cfg2 = MNCL_CONFIG_INIT;
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_create(&cfg2, nullptr));
  EXPECT_MNCL_ERROR(MNCL_ERR_INVALID_ARGUMENT, mncl_comm_destroy(nullptr));
  MNCL_CALL(mncl_barrier(g_comm, nullptr));
}

// Integer SUM wraps modulo 2^bits (a documented guarantee): 100 per rank in int8 / uint8.
// At every count and through every reduction kind: Open MPI 4.1's op/avx component adds 8-bit
// integers with saturation past 16 elements (127, not 44, for 3 x 100), which flat must not use.
TEST_F(Conformance, IntegerSumWraps) {
  const auto wrapped8 = [](int each) {
    return static_cast<int8_t>(static_cast<uint8_t>(each * g_size));
  };
  const auto wrappedu8 = [](int each) { return static_cast<uint8_t>(each * g_size); };
  for (size_t count : {size_t{1}, size_t{16}, size_t{17}, size_t{1021}, size_t{2000}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<int8_t> s8(count), r8(count);
    for (size_t i = 0; i < count; ++i) s8[i] = i % 2 ? -100 : 100;
    std::vector<uint8_t> su8(count, 200), ru8(count);
    MNCL_CALL(mncl_allreduce(g_comm, s8.data(), r8.data(), count, MNCL_INT8, MNCL_SUM, nullptr));
    MNCL_CALL(mncl_allreduce(g_comm, su8.data(), ru8.data(), count, MNCL_UINT8, MNCL_SUM, nullptr));
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(r8[i], wrapped8(i % 2 ? -100 : 100)) << "allreduce int8 element " << i;
      ASSERT_EQ(ru8[i], wrappedu8(200)) << "allreduce uint8 element " << i;
    }
    // AVG divides the wrapped sum.
    MNCL_CALL(mncl_allreduce(g_comm, su8.data(), ru8.data(), count, MNCL_UINT8, MNCL_AVG, nullptr));
    EXPECT_EQ(ru8[count - 1], wrappedu8(200) / g_size) << "allreduce uint8 AVG";
    const int root = g_size - 1;
    std::fill(r8.begin(), r8.end(), 0);
    MNCL_CALL(mncl_reduce(g_comm, s8.data(), r8.data(), count, MNCL_INT8, MNCL_SUM, root, nullptr));
    if (g_rank == root) {
      EXPECT_EQ(r8[count - 1], wrapped8(count % 2 ? 100 : -100)) << "reduce";
    }
    std::vector<uint8_t> block_send(count * static_cast<size_t>(g_size), 200);
    MNCL_CALL(mncl_reduce_scatter(g_comm, block_send.data(), ru8.data(), count, MNCL_UINT8,
                                  MNCL_SUM, nullptr));
    EXPECT_EQ(ru8[count - 1], wrappedu8(200)) << "reduce_scatter";
    const void *sendbufs[2] = {s8.data(), s8.data()};
    std::vector<int8_t> other(count);
    void *recvbufs[2] = {r8.data(), other.data()};
    const size_t counts[2] = {count, count};
    MNCL_CALL(mncl_allreduce_coalesced(g_comm, sendbufs, recvbufs, counts, 2, MNCL_INT8, MNCL_SUM,
                                       nullptr));
    EXPECT_EQ(r8[0], wrapped8(100)) << "allreduce_coalesced";
    EXPECT_EQ(other[count - 1], wrapped8(count % 2 ? 100 : -100)) << "allreduce_coalesced";
  }
}

// Float MIN/MAX propagate a NaN from any rank at every count (mncl.h). Open MPI's op/avx MIN/MAX
// drop it, which flat must not use.
TEST_F(Conformance, FloatMinMaxPropagateNaN) {
  const char *backend = nullptr;
  MNCL_CALL(mncl_comm_backend(g_comm, &backend));
  if (std::string(backend) == "nccl") {
    GTEST_SKIP() << "on nccl, NCCL's own MIN/MAX rules for NaN apply (mncl.h)";
  }
  for (size_t count : {size_t{1}, size_t{257}, size_t{2000}}) {
    for (mncl_op_t op : {MNCL_MIN, MNCL_MAX}) {
      SCOPED_TRACE("count " + std::to_string(count) + " " + op_str(op));
      // Rank r puts a NaN at nan_at(r) only (which operand a kernel returns for NaN decides
      // whether it survives, so every rank's turn counts); the other elements are finite.
      const auto nan_at = [count](int r) {
        return count * static_cast<size_t>(r + 1) / static_cast<size_t>(g_size + 1);
      };
      std::vector<float> f(count), rf(count);
      std::vector<double> d(count), rd(count);
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(d[i] = g_rank + 0.5 * (i % 7));
      f[nan_at(g_rank)] = std::numeric_limits<float>::quiet_NaN();
      d[nan_at(g_rank)] = std::numeric_limits<double>::quiet_NaN();
      MNCL_CALL(mncl_allreduce(g_comm, f.data(), rf.data(), count, MNCL_FLOAT32, op, nullptr));
      MNCL_CALL(mncl_allreduce(g_comm, d.data(), rd.data(), count, MNCL_FLOAT64, op, nullptr));
      std::vector<bool> has_nan(count, false);
      for (int r = 0; r < g_size; ++r) has_nan[nan_at(r)] = true;
      for (size_t i = 0; i < count; ++i) {
        if (has_nan[i]) {
          ASSERT_TRUE(std::isnan(rf[i])) << "float32 element " << i << " got " << rf[i];
          ASSERT_TRUE(std::isnan(rd[i])) << "float64 element " << i << " got " << rd[i];
        } else {
          const double want = (op == MNCL_MIN ? 0 : g_size - 1) + 0.5 * (i % 7);
          ASSERT_EQ(rd[i], want) << "float64 element " << i;
          ASSERT_EQ(rf[i], static_cast<float>(want)) << "float32 element " << i;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Multi-MiB counts, on a few dtype/op pairs per collective (filter out with -Large.*).
// ---------------------------------------------------------------------------------------------

size_t large_block() {
  return kLarge / static_cast<size_t>(g_size);
}  // per-rank block

class Large : public Conformance {};

TEST_F(Large, Allreduce) {
  check_allreduce(MNCL_FLOAT32, MNCL_SUM, kLarge, false, 70);
  check_allreduce(MNCL_BFLOAT16, MNCL_AVG, kLarge, true, 71);
}
TEST_F(Large, Reduce) {
  check_reduce(MNCL_INT32, MNCL_MAX, kLarge, g_size - 1, false, 72);
}
TEST_F(Large, Bcast) {
  check_bcast(MNCL_FLOAT32, kLarge, g_size / 2, 73);
}
TEST_F(Large, ScatterGather) {
  check_scatter(MNCL_FLOAT32, large_block(), 0, false, 74);
  check_gather(MNCL_INT64, large_block() / 2, g_size - 1, true, 75);
}
TEST_F(Large, Allgather) {
  check_allgather(MNCL_FLOAT32, large_block(), true, 76);
}
TEST_F(Large, ReduceScatter) {
  check_reduce_scatter(MNCL_FLOAT16, MNCL_SUM, large_block(), false, 77);
}
TEST_F(Large, Alltoall) {
  check_alltoall(MNCL_UINT32, large_block(), false, 78);
}
TEST_F(Large, SendRecv) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  check_ring(MNCL_FLOAT32, kLarge, 79);
}
TEST_F(Large, SendRecvBatch) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  const int next = next_rank(), prev = prev_rank();
  const size_t n64 = kLarge / 3;
  Batch b("large batch ring shift both ways (float32 to the next rank, int64 to the previous)");
  b.recv(message(MNCL_FLOAT32, kLarge, prev, g_rank, 82, 0), prev, from_str(prev));
  b.recv(message(MNCL_INT64, n64, next, g_rank, 82, 1), next, from_str(next));
  b.send(message(MNCL_FLOAT32, kLarge, g_rank, next, 82, 0), next);
  b.send(message(MNCL_INT64, n64, g_rank, prev, 82, 1), prev);
  b.run();
}
TEST_F(Large, AllreduceCoalesced) {
  check_coalesced(MNCL_FLOAT32, MNCL_SUM, {kLarge / 2, 1, kLarge / 2}, 0x1u, 80);
}
TEST_F(Large, IAllreduce) {
  const Buf send = reduce_data(MNCL_INT64, MNCL_PROD, g_rank, kLarge / 2, 81);
  Buf recv(MNCL_INT64, kLarge / 2);
  mncl_request_t req = nullptr;
  MNCL_CALL(mncl_iallreduce(g_comm, send.data(), recv.data(), kLarge / 2, MNCL_INT64, MNCL_PROD,
                            nullptr, &req));
  complete(req, true, "mncl_iallreduce");
  expect_same(recv, reduce_expected(MNCL_INT64, MNCL_PROD, 0, kLarge / 2, 81),
              "iallreduce int64 prod");
}

// ---------------------------------------------------------------------------------------------
// Point to point with idle ranks. Runs last (parameterised suites register after plain tests,
// in file order): point-to-point traffic differs between ranks, and a library that numbered it
// together with the collectives would leave the ranks disagreeing about every later collective.
// ---------------------------------------------------------------------------------------------

class PointToPointLast : public Conformance, public ::testing::WithParamInterface<int> {};
TEST_P(PointToPointLast, IdleRanksThenCollectives) {
  if (g_size == 1) GTEST_SKIP() << "point to point needs two ranks";
  // Only ranks 0 and 1 talk (and at odd sizes the pairs of check_pairwise leave one rank out).
  if (g_rank < 2) check_pairwise(MNCL_INT32, 90);
  check_pairwise(MNCL_FLOAT32, 91);
  // Every rank then runs the same collectives: they must still match up.
  check_allreduce(MNCL_INT64, MNCL_SUM, 1021, false, 92);
  check_bcast(MNCL_UINT8, 17, g_size - 1, 93);
  MNCL_CALL(mncl_barrier(g_comm, nullptr));
}
// The same with batches: ranks 0 and 1 exchange one while the others make an empty one (or
// none at all); then the pairs of a tournament round exchange by mncl_isendrecv, one rank
// sitting out at odd sizes. The collectives after them must still match.
TEST_P(PointToPointLast, BatchIdleRanksThenCollectives) {
  const int base = 97;
  if (g_size >= 2 && g_rank < 2) {
    const int peer = 1 - g_rank;
    Batch b("batch between ranks 0 and 1 only");
    b.recv(message(MNCL_INT32, 1021, peer, g_rank, base, 0), peer, from_str(peer));
    b.send(message(MNCL_INT32, 1021, g_rank, peer, base, 0), peer);
    b.send(message(MNCL_UINT8, 5, g_rank, peer, base, 1), peer);
    b.recv(message(MNCL_UINT8, 5, peer, g_rank, base, 1), peer, from_str(peer) + " (second)");
    b.run();
  } else if (g_rank >= 2 && g_rank % 2 == 0) {
    MNCL_CALL(mncl_sendrecv_batch(g_comm, nullptr, 0, nullptr));
  }
  const int partner = Tournament{g_size}.partner(g_rank, 0);
  if (partner < g_size) {
    const Buf mine = message(MNCL_FLOAT64, 333, g_rank, partner, base, 2);
    Buf got(MNCL_FLOAT64, 333);
    mncl_request_t req = nullptr;
    MNCL_CALL(mncl_isendrecv(g_comm, mine.data(), 333, partner, got.data(), 333, partner,
                             MNCL_FLOAT64, nullptr, &req));
    complete(req, false, "mncl_isendrecv");
    expect_same(got, message(MNCL_FLOAT64, 333, partner, g_rank, base, 2),
                "isendrecv with round 0's partner");
  }
  check_allreduce(MNCL_INT64, MNCL_SUM, 1021, false, base + 1);
  check_bcast(MNCL_UINT8, 17, g_size - 1, base + 2);
  MNCL_CALL(mncl_barrier(g_comm, nullptr));
}
INSTANTIATE_TEST_SUITE_P(Last, PointToPointLast, ::testing::Values(0));

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new WorldEnvironment);  // gtest owns it
  // The communicator (and so the rank) exists only once the tests start; which rank prints the
  // full output is decided from the launcher's variables, in the order mncl.h reads them.
  const char *rank_env = nullptr;
  for (const char *var : {"MNCL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (!rank_env) rank_env = std::getenv(var);
  const char *all = std::getenv("MNCL_CONFORMANCE_ALL_OUTPUT");
  if (rank_env) g_rank = std::atoi(rank_env);  // for messages, should the communicator fail
  if (g_rank != 0 && !(all && std::strcmp(all, "1") == 0)) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter);
  }
  return RUN_ALL_TESTS();
}

// flat's own ring (bounded mode: a blocking allreduce, reduce or allgather of at least
// MNCL_FLAT_RING_MIN_BYTES per rank, by default 128 KiB (on 2 ranks less: Comm::ring_min_bytes),
// a reduce-scatter of a quarter of that, when every rank's call would ring).
//
//   ring_test                      every rank offers the ring (MNCL_FLAT_RING_MIN_BYTES=64K,
//                                  set here): the ring runs, exact results (2 to 4 ranks: the
//                                  cases are sized for 64 KiB per rank at 4)
//   ring_test --threshold-differs  rank 1 sets MNCL_FLAT_RING_MIN_BYTES=0 (no ring): every
//                                  rank falls back to MPI's collectives, exact results
//   ring_test --auto-threshold     MNCL_FLAT_RING_MIN_BYTES unset: each kind rings from its
//                                  default (2 ranks: 2 KiB per rank, a reduce 32 KiB, an
//                                  allgather 4 KiB blocks, a reduce-scatter 2 KiB blocks; more
//                                  ranks: 128 KiB, a reduce-scatter 32 KiB blocks), not one
//                                  element below; exact results
//
// Cases, first (on the communicator's first rings, whose scratch is allocated for them):
// reduce-scatters (int32 SUM out of place, its input untouched, and in place; float32 AVG) and
// allgathers (out of place, in place) of 64 KiB blocks, and a reduce-scatter of 16 KiB blocks
// (it rings from a quarter of the threshold). Then int32 SUM over a count whose chunks differ
// in size, out of place and in place; int8 SUM that wraps; float32 AVG, MAX with a NaN, int32
// PROD and MIN; a coalesced allreduce of three buffers; reduces to the first rank (no receive
// buffer elsewhere, its input untouched), in place to the last (the other ranks' buffers
// untouched) and AVG to the second. Calls that must not ring: an allreduce past the threshold
// in total but not per rank, an allgather of 32 KiB blocks, a reduce-scatter of 16 KiB less 4
// bytes. Then an allreduce, a reduce, a reduce-scatter and an allgather that rank 0 posts
// (mncl_i* + mncl_wait) while the others block in them, where the ring must give way to MPI's
// collective on every rank (ranks in two algorithms would never meet). Whether the ring ran is
// read from this rank's own trace log (MNCL_DEBUG=trace, stderr sent to an unlinked file):
// "flat's ring over" per ring, "declined flat's ring" per call this rank offered and another
// declined.
#include <mncl/mncl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mismatch_harness.h"

namespace {

using flat_test::fail;

int g_rank = 0, g_size = 1;

// 64 KiB per rank at 4 ranks (the threshold set in main), with a remainder so that the chunks
// differ.
constexpr size_t kCount = 4 * 16384 + 7;

int32_t value(int rank, size_t i) {
  return static_cast<int32_t>((i * 7 + static_cast<size_t>(rank) * 13) % 1000) - 300;
}

template <typename T>
void expect_equal(const char *what, const std::vector<T> &got, const std::vector<T> &want) {
  for (size_t i = 0; i < want.size(); ++i) {
    const bool both_nan =
        std::isnan(static_cast<double>(got[i])) && std::isnan(static_cast<double>(want[i]));
    if (got[i] != want[i] && !both_nan) {
      std::ostringstream m;
      m << what << ": element " << i << " is " << +got[i] << ", want " << +want[i];
      fail(g_rank, m.str());
      return;
    }
  }
}

void check_status(const char *what, mncl_status_t st) {
  if (st != MNCL_OK) {
    fail(g_rank, std::string(what) + ": " + mncl_status_string(st) + ": " + mncl_last_error());
  }
}

// The int32 cases; returns how many calls were made.
int int32_cases(mncl_comm_t comm) {
  std::vector<int32_t> send(kCount), recv(kCount, -1), sum(kCount), prod(kCount), min(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    send[i] = value(g_rank, i);
    sum[i] = 0;
    prod[i] = 1;
    min[i] = value(0, i);
    for (int r = 0; r < g_size; ++r) {
      sum[i] += value(r, i);
      prod[i] = static_cast<int32_t>(static_cast<uint32_t>(prod[i]) *
                                     static_cast<uint32_t>(value(r, i) % 7));
      min[i] = std::min(min[i], value(r, i));
    }
  }
  check_status("int32 sum", mncl_allreduce(comm, send.data(), recv.data(), kCount, MNCL_INT32,
                                           MNCL_SUM, nullptr));
  expect_equal("int32 sum, out of place", recv, sum);
  std::vector<int32_t> in_place = send;
  check_status("int32 sum in place", mncl_allreduce(comm, in_place.data(), in_place.data(), kCount,
                                                    MNCL_INT32, MNCL_SUM, nullptr));
  expect_equal("int32 sum, in place", in_place, sum);
  for (size_t i = 0; i < kCount; ++i) send[i] = value(g_rank, i) % 7;
  check_status("int32 prod", mncl_allreduce(comm, send.data(), recv.data(), kCount, MNCL_INT32,
                                            MNCL_PROD, nullptr));
  expect_equal("int32 prod", recv, prod);
  for (size_t i = 0; i < kCount; ++i) send[i] = value(g_rank, i);
  check_status("int32 min", mncl_allreduce(comm, send.data(), recv.data(), kCount, MNCL_INT32,
                                           MNCL_MIN, nullptr));
  expect_equal("int32 min", recv, min);
  return 4;
}

// int8 SUM that wraps, float32 AVG and MAX with a NaN on the last rank; returns the calls made.
int other_dtype_cases(mncl_comm_t comm) {
  const size_t n8 = 4 * kCount;  // as many bytes as the int32 cases
  std::vector<int8_t> send8(n8), recv8(n8, 0), want8(n8);
  for (size_t i = 0; i < n8; ++i) {
    const auto v8 = [i](int r) { return static_cast<uint8_t>(90 + (i * 7 + r * 5) % 37); };
    send8[i] = static_cast<int8_t>(v8(g_rank));
    uint8_t sum8 = 0;  // 90..126 on each rank: the sum wraps from 3 ranks on
    for (int r = 0; r < g_size; ++r) sum8 = static_cast<uint8_t>(sum8 + v8(r));
    want8[i] = static_cast<int8_t>(sum8);
  }
  check_status("int8 sum",
               mncl_allreduce(comm, send8.data(), recv8.data(), n8, MNCL_INT8, MNCL_SUM, nullptr));
  expect_equal("int8 sum (wraps)", recv8, want8);

  std::vector<float> sendf(kCount), recvf(kCount), avg(kCount), max(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    sendf[i] = static_cast<float>(value(g_rank, i) * g_size);  // sums divide exactly
    float total = 0;
    max[i] = -1e30f;
    for (int r = 0; r < g_size; ++r) {
      total += static_cast<float>(value(r, i) * g_size);
      max[i] = std::max(max[i], static_cast<float>(value(r, i) * g_size));
    }
    avg[i] = total / static_cast<float>(g_size);
  }
  check_status("float32 avg", mncl_allreduce(comm, sendf.data(), recvf.data(), kCount, MNCL_FLOAT32,
                                             MNCL_AVG, nullptr));
  expect_equal("float32 avg", recvf, avg);
  const size_t nan_at = kCount - 1;  // in the last chunk
  if (g_rank == g_size - 1) sendf[nan_at] = std::nanf("");
  max[nan_at] = std::nanf("");
  check_status("float32 max", mncl_allreduce(comm, sendf.data(), recvf.data(), kCount, MNCL_FLOAT32,
                                             MNCL_MAX, nullptr));
  expect_equal("float32 max (a NaN on the last rank)", recvf, max);
  return 3;
}

// Three buffers packed into one ring; returns the calls made.
int coalesced_case(mncl_comm_t comm) {
  const size_t counts[3] = {1000, kCount, 3};
  std::vector<std::vector<int32_t>> send(3), recv(3), want(3);
  const void *sendbufs[3];
  void *recvbufs[3];
  for (size_t b = 0; b < 3; ++b) {
    send[b].resize(counts[b]);
    recv[b].assign(counts[b], -1);
    want[b].assign(counts[b], 0);
    for (size_t i = 0; i < counts[b]; ++i) {
      send[b][i] = value(g_rank, i + b);
      for (int r = 0; r < g_size; ++r) want[b][i] += value(r, i + b);
    }
    sendbufs[b] = send[b].data();
    recvbufs[b] = recv[b].data();
  }
  check_status("coalesced", mncl_allreduce_coalesced(comm, sendbufs, recvbufs, counts, 3,
                                                     MNCL_INT32, MNCL_SUM, nullptr));
  for (size_t b = 0; b < 3; ++b) expect_equal("coalesced buffer", recv[b], want[b]);
  return 1;
}

// Reduces: to rank 0 out of place, the other ranks passing no receive buffer; to the last rank
// in place. Returns the calls made.
int reduce_cases(mncl_comm_t comm) {
  std::vector<int32_t> send(kCount), sum(kCount, 0), max(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    send[i] = value(g_rank, i);
    max[i] = value(0, i);
    for (int r = 0; r < g_size; ++r) {
      sum[i] += value(r, i);
      max[i] = std::max(max[i], value(r, i));
    }
  }
  std::vector<int32_t> recv(kCount, -1);
  const std::vector<int32_t> input = send;
  check_status("reduce to rank 0",
               mncl_reduce(comm, send.data(), g_rank == 0 ? recv.data() : nullptr, kCount,
                           MNCL_INT32, MNCL_SUM, 0, nullptr));
  if (g_rank == 0) expect_equal("reduce sum to rank 0", recv, sum);
  expect_equal("reduce to rank 0: the input", send, input);
  const int last = g_size - 1;
  std::vector<int32_t> in_place = send;
  check_status("reduce in place to the last rank",
               mncl_reduce(comm, in_place.data(), in_place.data(), kCount, MNCL_INT32, MNCL_MAX,
                           last, nullptr));
  expect_equal("reduce max in place to the last rank", in_place, g_rank == last ? max : send);

  // AVG to rank 1 % size, whose division happens at the root only; the others pass a buffer of
  // their own, which stays untouched.
  const int root = 1 % g_size;
  std::vector<float> sendf(kCount), recvf(kCount, -1.0f), avg(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    sendf[i] = static_cast<float>(value(g_rank, i) * g_size);
    float total = 0;
    for (int r = 0; r < g_size; ++r) total += static_cast<float>(value(r, i) * g_size);
    avg[i] = total / static_cast<float>(g_size);
  }
  check_status("reduce avg", mncl_reduce(comm, sendf.data(), recvf.data(), kCount, MNCL_FLOAT32,
                                         MNCL_AVG, root, nullptr));
  expect_equal("reduce avg", recvf, g_rank == root ? avg : std::vector<float>(kCount, -1.0f));
  return 3;
}

// Reduce-scatters and allgathers over blocks of kBlock int32 (64 KiB and 12 bytes per rank: a
// ring at any size), out of place (the input untouched) and in place (MNCL's forms: the result
// at this rank's block of the input, the input at this rank's block of the result); then a
// reduce-scatter of 16 KiB blocks, which rings from a quarter of the threshold (one of 16 KiB
// less 4 bytes does not: below_threshold_per_rank). Run first, on the communicator's first
// rings: the scratch they need is then allocated for them, not left by a larger ring before.
// Returns the calls made.
constexpr size_t kBlock = 16384 + 3;

int block_cases(mncl_comm_t comm) {
  const size_t total = kBlock * static_cast<size_t>(g_size);
  const size_t mine = kBlock * static_cast<size_t>(g_rank);
  std::vector<int32_t> input(total), sums(kBlock, 0), gathered(total);
  for (size_t i = 0; i < total; ++i) {
    input[i] = value(g_rank, i);
    gathered[i] = value(static_cast<int>(i / kBlock), i % kBlock);
  }
  for (size_t i = 0; i < kBlock; ++i) {
    for (int r = 0; r < g_size; ++r) sums[i] += value(r, mine + i);
  }
  std::vector<int32_t> recv(kBlock, -1);
  const std::vector<int32_t> kept = input;
  check_status("reduce_scatter", mncl_reduce_scatter(comm, input.data(), recv.data(), kBlock,
                                                     MNCL_INT32, MNCL_SUM, nullptr));
  expect_equal("reduce_scatter sum, out of place", recv, sums);
  expect_equal("reduce_scatter, out of place: the input", input, kept);
  std::vector<int32_t> in_place = input;
  check_status("reduce_scatter in place",
               mncl_reduce_scatter(comm, in_place.data(), in_place.data() + mine, kBlock,
                                   MNCL_INT32, MNCL_SUM, nullptr));
  std::vector<int32_t> want_in_place = input;  // the other blocks untouched
  std::copy(sums.begin(), sums.end(), want_in_place.begin() + static_cast<ptrdiff_t>(mine));
  expect_equal("reduce_scatter sum, in place", in_place, want_in_place);

  std::vector<float> inputf(total), avg(kBlock), recvf(kBlock, -1.0f);
  for (size_t i = 0; i < total; ++i) inputf[i] = static_cast<float>(value(g_rank, i) * g_size);
  for (size_t i = 0; i < kBlock; ++i) {
    float sum = 0;
    for (int r = 0; r < g_size; ++r) sum += static_cast<float>(value(r, mine + i) * g_size);
    avg[i] = sum / static_cast<float>(g_size);
  }
  check_status("reduce_scatter avg", mncl_reduce_scatter(comm, inputf.data(), recvf.data(), kBlock,
                                                         MNCL_FLOAT32, MNCL_AVG, nullptr));
  expect_equal("reduce_scatter float32 avg", recvf, avg);

  std::vector<int32_t> all(total, -1);
  const std::vector<int32_t> block(input.begin(), input.begin() + static_cast<ptrdiff_t>(kBlock));
  check_status("allgather",
               mncl_allgather(comm, block.data(), all.data(), kBlock, MNCL_INT32, nullptr));
  expect_equal("allgather, out of place", all, gathered);
  std::fill(all.begin(), all.end(), -1);
  std::copy(block.begin(), block.end(), all.begin() + static_cast<ptrdiff_t>(mine));
  check_status("allgather in place",
               mncl_allgather(comm, all.data() + mine, all.data(), kBlock, MNCL_INT32, nullptr));
  expect_equal("allgather, in place", all, gathered);

  // 16 KiB blocks: below the threshold, but a reduce-scatter rings from a quarter of it.
  const size_t small = 4096;
  std::vector<int32_t> small_sums(small, 0), small_recv(small, -1);
  for (size_t i = 0; i < small; ++i) {
    for (int r = 0; r < g_size; ++r) small_sums[i] += value(r, small * g_rank + i);
  }
  check_status("reduce_scatter of 16 KiB blocks",
               mncl_reduce_scatter(comm, input.data(), small_recv.data(), small, MNCL_INT32,
                                   MNCL_SUM, nullptr));
  expect_equal("reduce_scatter of 16 KiB blocks", small_recv, small_sums);
  return 6;
}

// 64 KiB in all, past the threshold (64 KiB) in total but not per rank: no ring, and no rank
// offers it (nothing declined either); nor an allgather of 32 KiB blocks, nor a reduce-scatter
// of 16 KiB less 4 bytes. Makes no call the ring counts.
void below_threshold_per_rank(mncl_comm_t comm) {
  const size_t n = 16384;
  std::vector<int32_t> send(n), recv(n, -1), sum(n, 0);
  for (size_t i = 0; i < n; ++i) {
    send[i] = value(g_rank, i);
    for (int r = 0; r < g_size; ++r) sum[i] += value(r, i);
  }
  check_status("allreduce below the threshold per rank",
               mncl_allreduce(comm, send.data(), recv.data(), n, MNCL_INT32, MNCL_SUM, nullptr));
  expect_equal("allreduce below the threshold per rank", recv, sum);

  const size_t block = 8192;
  std::vector<int32_t> all(block * static_cast<size_t>(g_size), -1), want(all.size());
  for (size_t i = 0; i < all.size(); ++i) want[i] = value(static_cast<int>(i / block), i % block);
  check_status(
      "allgather of 32 KiB blocks",
      mncl_allgather(comm, want.data() + block * g_rank, all.data(), block, MNCL_INT32, nullptr));
  expect_equal("allgather of 32 KiB blocks", all, want);

  const size_t under = 4095;  // int32: 4 bytes short of a quarter of the threshold
  std::vector<int32_t> input(under * static_cast<size_t>(g_size)), got(under, -1), sums(under, 0);
  for (size_t i = 0; i < input.size(); ++i) input[i] = value(g_rank, i);
  for (size_t i = 0; i < under; ++i) {
    for (int r = 0; r < g_size; ++r) sums[i] += value(r, under * g_rank + i);
  }
  check_status(
      "reduce_scatter of 16 KiB less 4 bytes",
      mncl_reduce_scatter(comm, input.data(), got.data(), under, MNCL_INT32, MNCL_SUM, nullptr));
  expect_equal("reduce_scatter of 16 KiB less 4 bytes", got, sums);
}

// Rank 0 posts the call (`post`, then mncl_wait) while every other rank blocks in it.
template <typename Post, typename Block>
void beside_a_posted_one(const std::string &what, Post post, Block block) {
  if (g_rank != 0) {
    check_status(("blocking " + what + " beside a posted one").c_str(), block());
    return;
  }
  mncl_request_t request = nullptr;
  mncl_status_t st = post(&request);
  if (st == MNCL_OK) st = mncl_wait(request, 120000);
  check_status(("posted " + what).c_str(), st);
}

// beside_a_posted_one for an int32 SUM of count elements through a pair of the same shape
// (allreduce, reduce-scatter: comm, send, recv, count, dtype, op, stream).
using PostedSum = mncl_status_t (*)(mncl_comm_t, const void *, void *, size_t, mncl_dtype_t,
                                    mncl_op_t, void *, mncl_request_t *);
using BlockingSum = mncl_status_t (*)(mncl_comm_t, const void *, void *, size_t, mncl_dtype_t,
                                      mncl_op_t, void *);
void sum_beside_a_posted_one(const std::string &what, PostedSum post, BlockingSum block,
                             mncl_comm_t comm, const int32_t *send, int32_t *recv, size_t count) {
  beside_a_posted_one(
      what,
      [&](mncl_request_t *q) {
        return post(comm, send, recv, count, MNCL_INT32, MNCL_SUM, nullptr, q);
      },
      [&] { return block(comm, send, recv, count, MNCL_INT32, MNCL_SUM, nullptr); });
}

// Rank 0 posts an allreduce, a reduce, a reduce-scatter and an allgather, the others block in
// them: MPI's collectives on every rank.
void posted_beside_blocking(mncl_comm_t comm) {
  std::vector<int32_t> send(kCount), recv(kCount, -1), sum(kCount, 0);
  for (size_t i = 0; i < kCount; ++i) {
    send[i] = value(g_rank, i);
    for (int r = 0; r < g_size; ++r) sum[i] += value(r, i);
  }
  sum_beside_a_posted_one("allreduce", mncl_iallreduce, mncl_allreduce, comm, send.data(),
                          recv.data(), kCount);
  expect_equal("posted beside blocking", recv, sum);

  const int root = g_size - 1;
  std::fill(recv.begin(), recv.end(), -1);
  beside_a_posted_one(
      "reduce",
      [&](mncl_request_t *q) {
        return mncl_ireduce(comm, send.data(), recv.data(), kCount, MNCL_INT32, MNCL_SUM, root,
                            nullptr, q);
      },
      [&] {
        return mncl_reduce(comm, send.data(), recv.data(), kCount, MNCL_INT32, MNCL_SUM, root,
                           nullptr);
      });
  if (g_rank == root) expect_equal("posted reduce beside blocking", recv, sum);

  // A reduce-scatter and an allgather of kBlock per rank.
  const size_t total = kBlock * static_cast<size_t>(g_size);
  std::vector<int32_t> input(total), block_sums(kBlock, 0), got(kBlock, -1), all(total, -1),
      gathered(total);
  for (size_t i = 0; i < total; ++i) {
    input[i] = value(g_rank, i);
    gathered[i] = value(static_cast<int>(i / kBlock), i % kBlock);
  }
  for (size_t i = 0; i < kBlock; ++i) {
    for (int r = 0; r < g_size; ++r) block_sums[i] += value(r, kBlock * g_rank + i);
  }
  sum_beside_a_posted_one("reduce_scatter", mncl_ireduce_scatter, mncl_reduce_scatter, comm,
                          input.data(), got.data(), kBlock);
  beside_a_posted_one(
      "allgather",
      [&](mncl_request_t *q) {
        return mncl_iallgather(comm, input.data(), all.data(), kBlock, MNCL_INT32, nullptr, q);
      },
      [&] { return mncl_allgather(comm, input.data(), all.data(), kBlock, MNCL_INT32, nullptr); });
  expect_equal("posted reduce_scatter beside blocking", got, block_sums);
  expect_equal("posted allgather beside blocking", all, gathered);
}

int count_lines(const std::string &path, const char *needle) {
  std::fflush(stderr);
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos ? 1 : 0;
  return n;
}

// Calls at the default thresholds (MNCL_FLAT_RING_MIN_BYTES unset) and one chunk element
// below, each with this rank's rings counted in its log around it.
void auto_threshold_cases(mncl_comm_t comm, const std::string &log_path) {
  const size_t n = static_cast<size_t>(g_size);
  // Bytes per rank: an allreduce's and a reduce's chunk, an allgather's and a reduce-scatter's
  // block (2 ranks: past the 3840 bytes the check exchange carries itself).
  const bool two = g_size == 2;
  const size_t chunk = two ? 2048 : 128 << 10;
  const size_t reduce_chunk = two ? 32 << 10 : 128 << 10;
  const size_t gather_block = two ? 4096 : 128 << 10;
  const size_t scatter_block = two ? 2048 : 32 << 10;
  enum class Kind { kAllreduce, kReduce, kAllgather, kReduceScatter };
  struct Case {
    const char *what;
    Kind kind;
    size_t count;  // int32 elements: the call's count (reduce-scatter, allgather: a block's)
    bool rings;
  };
  const Case cases[] = {
      {"allreduce at the threshold", Kind::kAllreduce, n * chunk / 4, true},
      {"allreduce a chunk element below", Kind::kAllreduce, n * (chunk / 4 - 1), false},
      {"reduce at the threshold", Kind::kReduce, n * reduce_chunk / 4, true},
      {"reduce a chunk element below", Kind::kReduce, n * (reduce_chunk / 4 - 1), false},
      {"allgather at the threshold", Kind::kAllgather, gather_block / 4, true},
      {"allgather an element below", Kind::kAllgather, gather_block / 4 - 1, false},
      {"reduce-scatter at the threshold", Kind::kReduceScatter, scatter_block / 4, true},
      {"reduce-scatter an element below", Kind::kReduceScatter, scatter_block / 4 - 1, false},
  };
  for (const Case &k : cases) {
    const bool blocks = k.kind == Kind::kAllgather || k.kind == Kind::kReduceScatter;
    const size_t total = blocks ? k.count * n : k.count;
    std::vector<int32_t> send(k.kind == Kind::kAllgather ? k.count : total);
    std::vector<int32_t> recv(k.kind == Kind::kReduceScatter ? k.count : total, -1);
    std::vector<int32_t> want(recv.size());
    for (size_t i = 0; i < send.size(); ++i) send[i] = value(g_rank, i);
    const std::vector<int32_t> input = send;
    for (size_t i = 0; i < want.size(); ++i) {
      if (k.kind == Kind::kAllgather) {
        want[i] = value(static_cast<int>(i / k.count), i % k.count);
        continue;
      }
      const size_t at =
          k.kind == Kind::kReduceScatter ? static_cast<size_t>(g_rank) * k.count + i : i;
      want[i] = 0;
      for (int r = 0; r < g_size; ++r) want[i] += value(r, at);
    }
    const int before = count_lines(log_path, "flat's ring over");
    mncl_status_t st = MNCL_OK;
    switch (k.kind) {
      case Kind::kAllreduce:
        st = mncl_allreduce(comm, send.data(), recv.data(), k.count, MNCL_INT32, MNCL_SUM, nullptr);
        break;
      case Kind::kReduce:
        st = mncl_reduce(comm, send.data(), recv.data(), k.count, MNCL_INT32, MNCL_SUM, 0, nullptr);
        if (g_rank != 0) want.assign(want.size(), -1);  // untouched there
        break;
      case Kind::kAllgather:
        st = mncl_allgather(comm, send.data(), recv.data(), k.count, MNCL_INT32, nullptr);
        break;
      default:
        st = mncl_reduce_scatter(comm, send.data(), recv.data(), k.count, MNCL_INT32, MNCL_SUM,
                                 nullptr);
        break;
    }
    check_status(k.what, st);
    const int rings = count_lines(log_path, "flat's ring over") - before;
    if (rings != (k.rings ? 1 : 0)) {
      fail(g_rank, std::string(k.what) + " (" + std::to_string(k.count) + " int32): " +
                       std::to_string(rings) + " ring(s) logged, want " + (k.rings ? "1" : "0"));
    }
    expect_equal(k.what, recv, want);
    expect_equal((std::string(k.what) + ", its input").c_str(), send, input);
  }
}

}  // namespace

int main(int argc, char **argv) {
  const bool threshold_differs = argc > 1 && std::strcmp(argv[1], "--threshold-differs") == 0;
  const bool auto_threshold = argc > 1 && std::strcmp(argv[1], "--auto-threshold") == 0;
  // flat reads its settings when the first communicator is made: the rank comes from the
  // launcher's variables.
  int launch_rank = -1;
  for (const char *name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (launch_rank < 0 && std::getenv(name) != nullptr) launch_rank = std::atoi(std::getenv(name));
  }
  if (threshold_differs && launch_rank < 0) {
    std::fprintf(stderr,
                 "ring_test --threshold-differs: no launcher rank variable "
                 "(OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK): run it under mpirun\n");
    return 1;
  }
  if (auto_threshold) {
    unsetenv("MNCL_FLAT_RING_MIN_BYTES");
  } else {
    setenv("MNCL_FLAT_RING_MIN_BYTES", threshold_differs && launch_rank == 1 ? "0" : "64K", 1);
  }
  setenv("MNCL_DEBUG", "trace", 1);
  unsetenv("MNCL_DEBUG_FILE");  // the log must reach stderr
  // This rank's log into a file of its own, unlinked at once (nothing left behind, whatever
  // happens) and read back through /proc.
  char name[] = "/tmp/mncl-ring-test-XXXXXX";
  const int file = mkstemp(name);
  const int saved_stderr = dup(2);
  if (file < 0 || saved_stderr < 0 || dup2(file, 2) < 0) {
    std::perror("ring_test: the log file");
    return 1;
  }
  unlink(name);
  const std::string log_path = "/proc/self/fd/" + std::to_string(file);

  mncl_comm_t comm = nullptr;
  int exit_code = 0;
  const bool opened = flat_test::open_world("flat_ring_test", &comm, &g_rank, &g_size, &exit_code);
  int calls = 0;
  if (opened && auto_threshold) auto_threshold_cases(comm, log_path);
  if (opened && !auto_threshold) {
    calls += block_cases(comm);
    calls += int32_cases(comm);
    calls += other_dtype_cases(comm);
    calls += coalesced_case(comm);
    calls += reduce_cases(comm);
    below_threshold_per_rank(comm);
  }
  std::fflush(stderr);
  const int rings = count_lines(log_path, "flat's ring over");
  const int declined = count_lines(log_path, "declined flat's ring");
  if (opened && !auto_threshold) posted_beside_blocking(comm);
  std::fflush(stderr);
  const int rings_after = count_lines(log_path, "flat's ring over") - rings;
  const int declined_after = count_lines(log_path, "declined flat's ring") - declined;
  if (opened) mncl_comm_destroy(comm);

  // Back to the real stderr, failures above included.
  std::fflush(stderr);
  dup2(saved_stderr, 2);
  {
    std::ifstream in(log_path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("FAIL") != std::string::npos || line.find("ERROR") != std::string::npos) {
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    }
  }
  close(file);
  if (!opened) return exit_code;
  if (auto_threshold) {
    std::printf("rank %d: default thresholds at %d ranks: %s\n", g_rank, g_size,
                flat_test::g_failures == 0 ? "PASS" : "FAIL");
    return flat_test::g_failures == 0 ? 0 : 1;
  }

  const bool declines = threshold_differs && g_rank != 1;  // rank 1 offers nothing
  const int want_rings = threshold_differs ? 0 : calls;
  const int want_declined = declines ? calls : 0;
  if (rings != want_rings || declined != want_declined) {
    fail(g_rank, "blocking calls: " + std::to_string(rings) + " ring(s) and " +
                     std::to_string(declined) + " decline(s) logged for " + std::to_string(calls) +
                     " calls, want " + std::to_string(want_rings) + " and " +
                     std::to_string(want_declined));
  }
  // Rank 0 posted all four: it offers nothing; every other rank that offered sees them declined.
  const int want_declined_after = g_rank == 0 || (threshold_differs && g_rank == 1) ? 0 : 4;
  if (rings_after != 0 || declined_after != want_declined_after) {
    fail(g_rank, "posted beside blocking: " + std::to_string(rings_after) + " ring(s) and " +
                     std::to_string(declined_after) + " decline(s) logged, want 0 and " +
                     std::to_string(want_declined_after));
  }
  std::printf("rank %d: %d ring(s), %d decline(s), then %d decline(s) beside a posted call: %s\n",
              g_rank, rings, declined, declined_after,
              flat_test::g_failures == 0 ? "PASS" : "FAIL");
  return flat_test::g_failures == 0 ? 0 : 1;
}

// flat's check exchange (bounded mode: each collective's fingerprint, and an allreduce of at
// most 3840 bytes itself, combined over the ranks over point-to-point messages: direct, every
// rank's element to every other, up to 8 ranks; recursive doubling beyond, or where
// MNCL_FLAT_CHECK_EXCHANGE=doubling, the odd ranks above a power of two paired up first): many
// exchanges in flight at once, started in one order on every rank but stepped at different
// paces, must each meet their own call's messages.
//
// Each round, every rank posts kPosted small allreduces (fused into their exchanges) of counts
// and values that differ per call, a broadcast and a reduce-scatter (whose data wait for their
// exchanges) among them, then a blocking small allreduce behind them all; ranks pause for
// different times between posts, and complete the posted calls in an order of their own
// (reverse, by mncl_test polling, or mncl_wait). Every result is exact. Then float32 sums that
// round, and MIN / MAX / SUM of signed zeros and of NaNs whose payloads differ: every rank must
// get the same bits (direct: every rank combines in rank order; doubling: both ends of a step
// put the lower rank's element first).
#include <mncl/mncl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mismatch_harness.h"

namespace {

using flat_test::fail;

int g_rank = 0, g_size = 1;

constexpr int kRounds = 12;
constexpr int kPosted = 24;

int32_t value(int rank, int call, size_t i) {
  return static_cast<int32_t>(
             (i * 31 + static_cast<size_t>(call) * 7 + static_cast<size_t>(rank) * 1009) % 2003) -
         1000;
}

void check(const std::string &what, mncl_status_t st) {
  if (st != MNCL_OK) fail(g_rank, what + ": " + mncl_status_string(st) + ": " + mncl_last_error());
}

// A posted call and what it must produce.
struct Posted {
  mncl_request_t request = nullptr;
  std::vector<int32_t> send, recv, want;
  std::string what;
};

void round_of_calls(mncl_comm_t comm, int round) {
  std::vector<Posted> posted(kPosted);
  for (int k = 0; k < kPosted; ++k) {
    Posted &p = posted[static_cast<size_t>(k)];
    const int call = round * kPosted + k;
    p.what = "round " + std::to_string(round) + " call " + std::to_string(k);
    if (k == kPosted / 3) {  // a broadcast from a rank that moves round by round
      const size_t n = 3000;
      const int root = round % g_size;
      p.recv.resize(n);
      p.want.resize(n);
      for (size_t i = 0; i < n; ++i) p.want[i] = value(root, call, i);
      if (g_rank == root) p.recv = p.want;
      check(p.what + " (ibcast)",
            mncl_ibcast(comm, p.recv.data(), n, MNCL_INT32, root, nullptr, &p.request));
    } else if (k == 2 * kPosted / 3) {  // a reduce-scatter of 500 per rank
      const size_t n = 500;
      p.send.resize(n * static_cast<size_t>(g_size));
      p.recv.assign(n, -1);
      p.want.assign(n, 0);
      for (size_t i = 0; i < p.send.size(); ++i) p.send[i] = value(g_rank, call, i);
      for (size_t i = 0; i < n; ++i) {
        for (int r = 0; r < g_size; ++r) p.want[i] += value(r, call, n * g_rank + i);
      }
      check(p.what + " (ireduce_scatter)",
            mncl_ireduce_scatter(comm, p.send.data(), p.recv.data(), n, MNCL_INT32, MNCL_SUM,
                                 nullptr, &p.request));
    } else {  // 1 to 960 int32: inside the exchange (at most 3840 bytes)
      const size_t n = 1 + static_cast<size_t>(call * 37 % 960);
      p.send.resize(n);
      p.recv.assign(n, -1);
      p.want.assign(n, 0);
      for (size_t i = 0; i < n; ++i) {
        p.send[i] = value(g_rank, call, i);
        for (int r = 0; r < g_size; ++r) p.want[i] += value(r, call, i);
      }
      check(p.what + " (iallreduce)", mncl_iallreduce(comm, p.send.data(), p.recv.data(), n,
                                                      MNCL_INT32, MNCL_SUM, nullptr, &p.request));
    }
    // Ranks post at different paces, so their exchanges are at different steps.
    if ((k + g_rank + round) % 5 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(50 * (g_rank + 1)));
    }
  }
  // A blocking one behind them all.
  const size_t n = 5;
  std::vector<int32_t> send(n), recv(n, -1), want(n, 0);
  for (size_t i = 0; i < n; ++i) {
    send[i] = value(g_rank, -round - 1, i);
    for (int r = 0; r < g_size; ++r) want[i] += value(r, -round - 1, i);
  }
  check("blocking allreduce",
        mncl_allreduce(comm, send.data(), recv.data(), n, MNCL_INT32, MNCL_SUM, nullptr));
  if (recv != want) fail(g_rank, "round " + std::to_string(round) + ": blocking allreduce");

  // Completion: reverse order, polled by mncl_test, or waited, as the rank and round say.
  const int style = (g_rank + round) % 3;
  for (int j = 0; j < kPosted; ++j) {
    Posted &p = posted[static_cast<size_t>(style == 0 ? kPosted - 1 - j : j)];
    if (p.request == nullptr) continue;
    if (style == 1) {
      int done = 0;
      mncl_status_t st = MNCL_OK;
      while (st == MNCL_OK && !done) st = mncl_test(p.request, &done);
      check(p.what + " (mncl_test)", st);
    } else {
      check(p.what + " (mncl_wait)", mncl_wait(p.request, 120000));
    }
    if (p.recv != p.want) fail(g_rank, p.what + ": wrong result");
  }
}

// Whether every rank got this rank's n floats, bit for bit (an allgather of them).
void expect_same_bits(mncl_comm_t comm, const char *what, const float *mine, size_t n) {
  std::vector<float> all(n * static_cast<size_t>(g_size));
  check(std::string(what) + ": allgather",
        mncl_allgather(comm, mine, all.data(), n, MNCL_FLOAT32, nullptr));
  for (int r = 0; r < g_size; ++r) {
    if (std::memcmp(all.data() + n * r, mine, n * sizeof(float)) != 0) {
      fail(g_rank, std::string(what) + ": rank " + std::to_string(r) + " got other bits");
    }
  }
}

// Float32 sums that round differently in each order, and MIN / MAX of -0 against +0 and of
// NaNs whose payloads differ (flat's kernels keep their destination's on a tie): the same bits
// on every rank.
void same_bits_everywhere(mncl_comm_t comm) {
  const size_t n = 200;
  std::vector<float> send(n), recv(n);
  for (size_t i = 0; i < n; ++i) {
    send[i] = 1.0f / static_cast<float>(3 + i + static_cast<size_t>(g_rank) * 7) *
              (g_rank % 2 == 0 ? 1e4f : 1e-3f);
  }
  check("float32 sum",
        mncl_allreduce(comm, send.data(), recv.data(), n, MNCL_FLOAT32, MNCL_SUM, nullptr));
  expect_same_bits(comm, "float32 sum", recv.data(), n);

  float ties[2];
  ties[0] = g_rank % 2 == 0 ? -0.0f : 0.0f;
  const uint32_t nan = 0x7fc00000u | static_cast<uint32_t>(g_rank + 1);
  std::memcpy(&ties[1], &nan, sizeof nan);
  for (mncl_op_t op : {MNCL_MIN, MNCL_MAX, MNCL_SUM}) {
    float result[2];
    const char *name = op == MNCL_MIN ? "MIN" : op == MNCL_MAX ? "MAX" : "SUM";
    const std::string what = std::string("float32 ") + name + " of signed zeros and NaN payloads";
    check(what, mncl_allreduce(comm, ties, result, 2, MNCL_FLOAT32, op, nullptr));
    expect_same_bits(comm, what.c_str(), result, 2);
  }
}

}  // namespace

int main() {
  mncl_comm_t comm = nullptr;
  int exit_code = 0;
  if (!flat_test::open_world("flat_exchange_test", &comm, &g_rank, &g_size, &exit_code)) {
    return exit_code;
  }
  for (int round = 0; round < kRounds; ++round) round_of_calls(comm, round);
  same_bits_everywhere(comm);
  mncl_comm_destroy(comm);
  std::printf("rank %d: %d rounds of %d posted calls: %s\n", g_rank, kRounds, kPosted,
              flat_test::g_failures == 0 ? "PASS" : "FAIL");
  return flat_test::g_failures == 0 ? 0 : 1;
}

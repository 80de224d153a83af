// libmncl-naive.so on its own: dlopen'ed directly (no core), given the in-memory store and host
// table of tests/common/plugin_harness.h, and run with 1..4 threads as ranks through every
// collective kind. Integer data, exact expected values, and an empty store after comm_destroy (no
// leaked keys).
#include <gtest/gtest.h>
#include <mncl/mncl_plugin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "common/half.h"
#include "plugin_harness.h"

#ifndef MNCL_NAIVE_PLUGIN
#error "MNCL_NAIVE_PLUGIN must name the built libmncl-naive.so"
#endif

namespace kit = mncl::kit;

namespace {

using mncl_testing::MemStore;
using mncl_testing::t_last_error;

// The plugin, loaded once for the whole program; logs above MNCL_TEST_LOG_LEVEL (default: warn).
// g_plugin is its v1 table, set by the environment before the first test.
mncl_testing::Plugin g_naive;
const mncl_plugin_v1_t *const &g_plugin = g_naive.v1;
::testing::Environment *const g_env = mncl_testing::add_plugins_env(
    {"naive", MNCL_LOG_WARN, {}, {}},
    {{"naive", MNCL_NAIVE_PLUGIN, mncl_testing::PluginsEnv::kV1, &g_naive}});

// One rank's side of a test: its communicator, and the sequence number the core assigns (it
// advances on every call, SEND/RECV included, as sdk/core does).
struct Rank {
  int rank = 0;
  int size = 0;
  void *comm = nullptr;
  uint64_t seq = 0;
  int64_t timeout_ms = 0;

  mncl_status_t run(int32_t kind, int32_t dtype, int32_t op, int32_t root, const void *sendbuf,
                    void *recvbuf, size_t count) {
    const mncl_coll_v1_t c =
        mncl_testing::make_coll(kind, dtype, op, root, sendbuf, recvbuf, count, seq++, timeout_ms);
    t_last_error.clear();
    return g_plugin->execute(comm, &c);
  }
  mncl_status_t coalesced(int32_t dtype, int32_t op, const std::vector<const void *> &send,
                          const std::vector<void *> &recv, const std::vector<size_t> &counts) {
    mncl_coll_v1_t c = mncl_testing::make_coll(MNCL_COLL_ALLREDUCE_COALESCED, dtype, op, -1,
                                               nullptr, nullptr, 0, seq++, timeout_ms);
    c.nbufs = counts.size();
    c.sendbufs = send.data();
    c.recvbufs = recv.data();
    c.counts = counts.data();
    return g_plugin->execute(comm, &c);
  }
};

// Runs body on `size` threads as ranks of one communicator over a fresh store. Unless
// expect_clean is false, checks that the store holds no key once every rank has destroyed its
// communicator.
void run_ranks(int size, const std::function<void(Rank &)> &body, int64_t timeout_ms = 20000,
               bool expect_clean = true, MemStore *store_in = nullptr,
               std::vector<Rank> *ranks_out = nullptr) {
  MemStore local;
  MemStore &store = store_in ? *store_in : local;
  std::vector<Rank> ranks(static_cast<size_t>(size));
  mncl_testing::on_threads(size, [&](int r) {
    Rank &me = ranks[static_cast<size_t>(r)];
    me.rank = r;
    me.size = size;
    me.timeout_ms = timeout_ms;
    const mncl_bootstrap_v1_t bs =
        mncl_testing::make_bootstrap(r, size, timeout_ms, "w", store.table());
    ASSERT_EQ(g_plugin->comm_create(&bs, &me.comm), MNCL_OK) << t_last_error;
    body(me);
    EXPECT_EQ(g_plugin->comm_destroy(me.comm), MNCL_OK);
  });
  if (expect_clean) {
    const std::vector<std::string> left = store.keys();
    std::string names;
    for (const auto &k : left) names += k + " ";
    EXPECT_TRUE(left.empty()) << "leaked store keys: " << names;
  }
  if (ranks_out) *ranks_out = ranks;
}

class Naive : public ::testing::TestWithParam<int> {};

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

TEST(NaiveTable, Fields) {
  ASSERT_NE(g_plugin, nullptr);
  EXPECT_EQ(g_plugin->struct_size, sizeof(mncl_plugin_v1_t));
  EXPECT_EQ(g_plugin->magic, MNCL_PLUGIN_MAGIC);
  EXPECT_EQ(g_plugin->abi_version, MNCL_PLUGIN_ABI_V1);
  EXPECT_STREQ(g_plugin->name, "naive");
  EXPECT_STREQ(g_plugin->version, "0.1.0");
  EXPECT_EQ(g_plugin->caps, MNCL_CAP_HOST_MEMORY);
  EXPECT_EQ(g_plugin->coll_mask, (1u << MNCL_NUM_COLL_KINDS_V1) - 1u);
  EXPECT_EQ(g_plugin->dtype_mask, (1u << MNCL_NUM_DTYPES) - 1u);
  EXPECT_EQ(g_plugin->op_mask, (1u << MNCL_NUM_OPS) - 1u);
  EXPECT_EQ(g_plugin->reserved0, 0u);
  EXPECT_EQ(g_plugin->post, nullptr);
  EXPECT_EQ(g_plugin->test, nullptr);

  mncl_probe_v1_t info{sizeof(mncl_probe_v1_t), 4, 4, 1, 0, 0, 0};
  int32_t score = -1;
  char reason[16] = "garbage";
  EXPECT_EQ(g_plugin->probe(&info, &score, reason, sizeof reason), MNCL_OK);
  EXPECT_EQ(score, 10);
  EXPECT_STREQ(reason, "");
}

TEST(NaiveTable, RejectsBadBootstrap) {
  MemStore store;
  mncl_bootstrap_v1_t bs{
      sizeof(mncl_bootstrap_v1_t), 2, 2, -1, -1, -1, -1, 1000, "w", store.table()};  // rank == size
  void *comm = nullptr;
  EXPECT_EQ(g_plugin->comm_create(&bs, &comm), MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(t_last_error.find("invalid bootstrap"), std::string::npos) << t_last_error;
}

// ---------------------------------------------------------------------------------------------
// Every collective kind, exact integer results, in place and out of place.
// ---------------------------------------------------------------------------------------------

TEST_P(Naive, EveryCollectiveKind) {
  const int n = GetParam();
  run_ranks(n, [n](Rank &me) {
    const int r = me.rank;
    const size_t count = 5;
    const int last = n - 1;

    // allreduce, out of place and in place.
    std::vector<int32_t> send(count), recv(count, -1);
    for (size_t i = 0; i < count; ++i) send[i] = r * 10 + static_cast<int32_t>(i);
    ASSERT_EQ(
        me.run(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, -1, send.data(), recv.data(), count),
        MNCL_OK)
        << t_last_error;
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(recv[i], 10 * n * (n - 1) / 2 + n * static_cast<int32_t>(i));
    }
    std::vector<int64_t> inplace(count);
    for (size_t i = 0; i < count; ++i) inplace[i] = r + 2;
    ASSERT_EQ(me.run(MNCL_COLL_ALLREDUCE, MNCL_INT64, MNCL_PROD, -1, inplace.data(), inplace.data(),
                     count),
              MNCL_OK)
        << t_last_error;
    int64_t fact = 1;
    for (int k = 0; k < n; ++k) fact *= k + 2;
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(inplace[i], fact);

    // reduce to the last rank (out of place), then to rank 0 in place.
    std::fill(recv.begin(), recv.end(), -1);
    ASSERT_EQ(me.run(MNCL_COLL_REDUCE, MNCL_INT32, MNCL_MAX, last, send.data(), recv.data(), count),
              MNCL_OK)
        << t_last_error;
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(recv[i], r == last ? last * 10 + static_cast<int32_t>(i) : -1);
    }
    std::vector<int32_t> red = send;
    ASSERT_EQ(me.run(MNCL_COLL_REDUCE, MNCL_INT32, MNCL_MIN, 0, red.data(),
                     r == 0 ? red.data() : nullptr, count),
              MNCL_OK)
        << t_last_error;
    if (r == 0) {
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(red[i], static_cast<int32_t>(i));
    }

    // bcast from each root.
    for (int root = 0; root < n; ++root) {
      std::vector<int32_t> buf(count, r == root ? 700 + root : -1);
      ASSERT_EQ(me.run(MNCL_COLL_BCAST, MNCL_INT32, 0, root, buf.data(), buf.data(), count),
                MNCL_OK)
          << t_last_error;
      for (int32_t v : buf) EXPECT_EQ(v, 700 + root);
    }

    // scatter from the last rank; then from rank 0 in place.
    std::vector<int32_t> all(count * n);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < count; ++i) all[j * count + i] = 100 * j + static_cast<int32_t>(i);
    }
    std::fill(recv.begin(), recv.end(), -1);
    ASSERT_EQ(me.run(MNCL_COLL_SCATTER, MNCL_INT32, 0, last, r == last ? all.data() : nullptr,
                     recv.data(), count),
              MNCL_OK)
        << t_last_error;
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(recv[i], 100 * r + static_cast<int32_t>(i));
    std::vector<int32_t> all2 = all;
    std::fill(recv.begin(), recv.end(), -1);
    ASSERT_EQ(me.run(MNCL_COLL_SCATTER, MNCL_INT32, 0, 0, r == 0 ? all2.data() : nullptr,
                     r == 0 ? all2.data() : recv.data(), count),
              MNCL_OK)
        << t_last_error;
    if (r != 0) {
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(recv[i], 100 * r + static_cast<int32_t>(i));
    }
    EXPECT_EQ(all2, all);

    // gather to rank 0; then to the last rank in place.
    std::vector<int32_t> gathered(count * n, -1);
    ASSERT_EQ(me.run(MNCL_COLL_GATHER, MNCL_INT32, 0, 0, send.data(),
                     r == 0 ? gathered.data() : nullptr, count),
              MNCL_OK)
        << t_last_error;
    if (r == 0) {
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < count; ++i) EXPECT_EQ(gathered[j * count + i], j * 10 + int(i));
      }
    }
    std::vector<int32_t> g2(count * n, -1);
    std::copy(send.begin(), send.end(), g2.begin() + r * count);
    ASSERT_EQ(me.run(MNCL_COLL_GATHER, MNCL_INT32, 0, last,
                     r == last ? g2.data() + r * count : send.data(),
                     r == last ? g2.data() : nullptr, count),
              MNCL_OK)
        << t_last_error;
    if (r == last) {
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < count; ++i) EXPECT_EQ(g2[j * count + i], j * 10 + int(i));
      }
    }

    // allgather, out of place and in place.
    std::vector<int32_t> ag(count * n, -1);
    ASSERT_EQ(me.run(MNCL_COLL_ALLGATHER, MNCL_INT32, 0, -1, send.data(), ag.data(), count),
              MNCL_OK)
        << t_last_error;
    std::vector<int32_t> ag2(count * n, -1);
    std::copy(send.begin(), send.end(), ag2.begin() + r * count);
    ASSERT_EQ(
        me.run(MNCL_COLL_ALLGATHER, MNCL_INT32, 0, -1, ag2.data() + r * count, ag2.data(), count),
        MNCL_OK)
        << t_last_error;
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < count; ++i) {
        EXPECT_EQ(ag[j * count + i], j * 10 + int(i));
        EXPECT_EQ(ag2[j * count + i], j * 10 + int(i));
      }
    }

    // reduce_scatter: block j of rank r holds 1000*j + r + i; rank r gets the sum of block r.
    std::vector<uint32_t> rs_send(count * n), rs_recv(count, 0);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < count; ++i) rs_send[j * count + i] = 1000u * j + r + unsigned(i);
    }
    std::vector<uint32_t> rs_inplace = rs_send;
    ASSERT_EQ(me.run(MNCL_COLL_REDUCE_SCATTER, MNCL_UINT32, MNCL_SUM, -1, rs_send.data(),
                     rs_recv.data(), count),
              MNCL_OK)
        << t_last_error;
    ASSERT_EQ(me.run(MNCL_COLL_REDUCE_SCATTER, MNCL_UINT32, MNCL_SUM, -1, rs_inplace.data(),
                     rs_inplace.data() + r * count, count),
              MNCL_OK)
        << t_last_error;
    for (size_t i = 0; i < count; ++i) {
      const uint32_t want = 1000u * r * n + unsigned(n * (n - 1) / 2) + unsigned(n * i);
      EXPECT_EQ(rs_recv[i], want);
      EXPECT_EQ(rs_inplace[r * count + i], want);
    }

    // alltoall: block j of rank r is 1000*r + 10*j + i; lands in block r of rank j.
    std::vector<int64_t> a2a(count * n), a2a_out(count * n, -1);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < count; ++i) a2a[j * count + i] = 1000 * r + 10 * j + int(i);
    }
    std::vector<int64_t> a2a_inplace = a2a;
    ASSERT_EQ(me.run(MNCL_COLL_ALLTOALL, MNCL_INT64, 0, -1, a2a.data(), a2a_out.data(), count),
              MNCL_OK)
        << t_last_error;
    ASSERT_EQ(me.run(MNCL_COLL_ALLTOALL, MNCL_INT64, 0, -1, a2a_inplace.data(), a2a_inplace.data(),
                     count),
              MNCL_OK)
        << t_last_error;
    for (int src = 0; src < n; ++src) {
      for (size_t i = 0; i < count; ++i) {
        EXPECT_EQ(a2a_out[src * count + i], 1000 * src + 10 * r + int(i));
        EXPECT_EQ(a2a_inplace[src * count + i], 1000 * src + 10 * r + int(i));
      }
    }

    // barrier, twice in a row.
    ASSERT_EQ(me.run(MNCL_COLL_BARRIER, 0, 0, -1, nullptr, nullptr, 0), MNCL_OK) << t_last_error;
    ASSERT_EQ(me.run(MNCL_COLL_BARRIER, 0, 0, -1, nullptr, nullptr, 0), MNCL_OK) << t_last_error;

    // coalesced allreduce: three buffers, one empty, one in place.
    std::vector<uint8_t> c0(3, uint8_t(r + 1)), c0_out(3, 0);
    std::vector<uint8_t> c1;
    std::vector<uint8_t> c2(4, uint8_t(2 * r));
    ASSERT_EQ(me.coalesced(MNCL_UINT8, MNCL_SUM, {c0.data(), c1.data(), c2.data()},
                           {c0_out.data(), c1.data(), c2.data()}, {3, 0, 4}),
              MNCL_OK)
        << t_last_error;
    for (uint8_t v : c0_out) EXPECT_EQ(v, n * (n + 1) / 2);
    for (uint8_t v : c2) EXPECT_EQ(v, n * (n - 1));

    // zero-element collectives are no-ops.
    ASSERT_EQ(me.run(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, -1, send.data(), recv.data(), 0),
              MNCL_OK)
        << t_last_error;
  });
}

// Send/recv in a ring; several messages per pair match in issue order, empty ones included.
TEST_P(Naive, SendRecvMatchInOrder) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "send/recv needs a peer";
  run_ranks(n, [n](Rank &me) {
    const int next = (me.rank + 1) % n, prev = (me.rank + n - 1) % n;
    // Sends complete eagerly (the data sits in the store), so send all, then receive.
    for (int k = 0; k < 4; ++k) {
      std::vector<int32_t> msg(static_cast<size_t>(k), 100 * me.rank + k);  // k elements
      ASSERT_EQ(me.run(MNCL_COLL_SEND, MNCL_INT32, 0, next, msg.data(), nullptr, msg.size()),
                MNCL_OK)
          << t_last_error;
    }
    for (int k = 0; k < 4; ++k) {
      std::vector<int32_t> msg(static_cast<size_t>(k), -1);
      ASSERT_EQ(me.run(MNCL_COLL_RECV, MNCL_INT32, 0, prev, nullptr, msg.data(), msg.size()),
                MNCL_OK)
          << t_last_error;
      for (int32_t v : msg) EXPECT_EQ(v, 100 * prev + k);
    }
  });
}

// SEND/RECV between two ranks advance the core's seq on those two only; collectives that follow
// must still meet (naive numbers its collectives itself).
TEST_P(Naive, PointToPointOnSomeRanksKeepsCollectivesInStep) {
  const int n = GetParam();
  if (n < 3) GTEST_SKIP() << "needs a rank that takes no part in the send/recv";
  run_ranks(n, [](Rank &me) {
    int32_t v = 40 + me.rank;
    if (me.rank == 0) {
      ASSERT_EQ(me.run(MNCL_COLL_SEND, MNCL_INT32, 0, 1, &v, nullptr, 1), MNCL_OK) << t_last_error;
    } else if (me.rank == 1) {
      ASSERT_EQ(me.run(MNCL_COLL_RECV, MNCL_INT32, 0, 0, nullptr, &v, 1), MNCL_OK) << t_last_error;
      EXPECT_EQ(v, 40);
    }
    int32_t one = 1;
    ASSERT_EQ(me.run(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, -1, &one, &one, 1), MNCL_OK)
        << t_last_error;
    EXPECT_EQ(one, me.size);
    ASSERT_EQ(me.run(MNCL_COLL_BARRIER, 0, 0, -1, nullptr, nullptr, 0), MNCL_OK) << t_last_error;
  });
}

// allreduce of every dtype x op: small positive integers, exact in every type (bf16 rounds
// the one product it cannot hold, once, as promised).
TEST_P(Naive, AllreduceEveryDtypeAndOp) {
  const int n = GetParam();
  run_ranks(n, [n](Rank &me) {
    const size_t count = 7;
    auto value = [](int rank, size_t i) { return static_cast<int>((rank + 1) * (i + 1) % 5) + 1; };
    for (int dtype = 0; dtype < MNCL_NUM_DTYPES; ++dtype) {
      for (int op = 0; op < MNCL_NUM_OPS; ++op) {
        kit::dispatch_dtype(dtype, [&](auto tag) {
          using T = typename decltype(tag)::type;
          auto make = [](double v) {
            if constexpr (kit::is_half_v<T>) {
              return kit::from_float<T>(static_cast<float>(v));
            } else {
              return static_cast<T>(v);
            }
          };
          auto as_double = [](T v) {
            if constexpr (kit::is_half_v<T>) {
              return static_cast<double>(kit::to_float(v));
            } else {
              return static_cast<double>(v);
            }
          };
          std::vector<T> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = make(value(me.rank, i));
          ASSERT_EQ(me.run(MNCL_COLL_ALLREDUCE, dtype, op, -1, buf.data(), buf.data(), count),
                    MNCL_OK)
              << t_last_error;
          for (size_t i = 0; i < count; ++i) {
            uint64_t sum = 0, prod = 1;
            int lo = 1 << 30, hi = 0;
            for (int q = 0; q < n; ++q) {
              const int v = value(q, i);
              sum += v;
              prod *= v;
              lo = std::min(lo, v);
              hi = std::max(hi, v);
            }
            T want{};
            switch (op) {
              case MNCL_SUM:
                want = make(double(sum));
                break;
              case MNCL_MIN:
                want = make(lo);
                break;
              case MNCL_MAX:
                want = make(hi);
                break;
              case MNCL_PROD:
                if constexpr (std::is_integral_v<T>) {
                  want = static_cast<T>(prod);  // wraps for int8/uint8 (5^4 > 255)
                } else {
                  want = make(double(prod));
                }
                break;
              case MNCL_AVG:
                if constexpr (std::is_integral_v<T>) {
                  want = static_cast<T>(sum / unsigned(n));
                } else if constexpr (std::is_same_v<T, double>) {
                  want = double(sum) / n;
                } else {
                  want = make(static_cast<float>(sum) / static_cast<float>(n));
                }
                break;
            }
            ASSERT_EQ(as_double(buf[i]), as_double(want))
                << kit::dtype_name(dtype) << " " << kit::op_name(op) << " i=" << i;
          }
        });
      }
    }
  });
}

// float32 sums come out bit-identical on every rank: rank-order reduction everywhere.
TEST_P(Naive, FloatResultsIdenticalOnEveryRank) {
  const int n = GetParam();
  const size_t count = 1000;
  std::vector<std::vector<float>> results(static_cast<size_t>(n));
  run_ranks(n, [&](Rank &me) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i)
      buf[i] = 1.0f / float(3 + i + 7 * me.rank) * (i % 2 ? 1e6f : 1e-3f);
    std::vector<float> out(count);
    ASSERT_EQ(
        me.run(MNCL_COLL_ALLREDUCE, MNCL_FLOAT32, MNCL_SUM, -1, buf.data(), out.data(), count),
        MNCL_OK)
        << t_last_error;
    results[static_cast<size_t>(me.rank)] = out;
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)), 0) << r;
  }
  for (size_t i = 0; i < count; ++i) {  // equals the sequential sum in rank order
    float want = 0;
    for (int q = 0; q < n; ++q) {
      const float x = 1.0f / float(3 + i + 7 * q) * (i % 2 ? 1e6f : 1e-3f);
      want = q == 0 ? x : want + x;
    }
    ASSERT_EQ(results[0][i], want) << i;
  }
}

// Many collectives back to back stay bounded in the store: keys of finished ops are gone.
TEST_P(Naive, StoreStaysSmall) {
  const int n = GetParam();
  MemStore store;
  run_ranks(
      n,
      [](Rank &me) {
        int32_t v = 1;
        for (int k = 0; k < 50; ++k) {
          ASSERT_EQ(me.run(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, -1, &v, &v, 1), MNCL_OK);
          ASSERT_EQ(me.run(MNCL_COLL_BARRIER, 0, 0, -1, nullptr, nullptr, 0), MNCL_OK);
        }
      },
      20000, true, &store);
  // A fast rank may run ahead by at most one op, so a few ops' keys coexist; never 100 ops'.
  EXPECT_LE(store.max_keys(), static_cast<size_t>(3 * (n + 2)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Naive, ::testing::Values(1, 2, 3, 4),
                         [](const auto &info) { return "n" + std::to_string(info.param); });

// ---------------------------------------------------------------------------------------------
// Failures: timeouts name the missing ranks; abort wakes a blocked call.
// ---------------------------------------------------------------------------------------------

TEST(NaiveFailures, TimeoutNamesTheMissingRank) {
  std::vector<std::string> errors(3);
  std::vector<mncl_status_t> status(3, MNCL_OK);
  run_ranks(
      3,
      [&](Rank &me) {
        if (me.rank == 2) return;  // never shows up
        int32_t v = 1;
        status[me.rank] = me.run(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, -1, &v, &v, 1);
        errors[me.rank] = t_last_error;
      },
      /*timeout_ms=*/300, /*expect_clean=*/false);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r], MNCL_ERR_TIMEOUT);
    EXPECT_EQ(errors[r], "naive allreduce #0: no contribution from rank 2 within 0.3 s");
  }
}

TEST(NaiveFailures, TimeoutNamesEveryMissingRank) {
  std::string error;
  mncl_status_t status = MNCL_OK;
  run_ranks(
      4,
      [&](Rank &me) {
        if (me.rank != 2) return;
        me.seq = 12;
        int32_t v = 1;
        std::vector<int32_t> all(4);
        status = me.run(MNCL_COLL_ALLGATHER, MNCL_INT32, 0, -1, &v, all.data(), 1);
        error = t_last_error;
      },
      200, false);
  EXPECT_EQ(status, MNCL_ERR_TIMEOUT);
  EXPECT_EQ(error, "naive allgather #12: no contribution from ranks 0, 1, 3 within 0.2 s");
}

TEST(NaiveFailures, BarrierAndRecvTimeouts) {
  std::string barrier_error, recv_error;
  run_ranks(
      2,
      [&](Rank &me) {
        if (me.rank != 0) return;
        EXPECT_EQ(me.run(MNCL_COLL_BARRIER, 0, 0, -1, nullptr, nullptr, 0), MNCL_ERR_TIMEOUT);
        barrier_error = t_last_error;
        int32_t v;
        EXPECT_EQ(me.run(MNCL_COLL_RECV, MNCL_INT32, 0, 1, nullptr, &v, 1), MNCL_ERR_TIMEOUT);
        recv_error = t_last_error;
      },
      100, false);
  EXPECT_EQ(barrier_error, "naive barrier #0: only 1 of 2 ranks arrived within 0.1 s");
  EXPECT_EQ(recv_error, "naive recv #1: no message #0 from rank 1 within 0.1 s");
}

// The last rank arrives just as another's wait for the barrier runs out (the audit's race:
// that rank reported "only 2 of 2 ranks arrived", naming a rank that had arrived, while the
// last one returned MNCL_OK). Made deterministic by a store whose get of the barrier's "go"
// key, once timed out, lets rank 1 arrive and waits for its count before it answers.
TEST(NaiveFailures, BarrierWhoseLastRankArrivesAsTheWaitEndsSucceeds) {
  struct LateStore {
    MemStore inner;
    mncl_store_v1_t table{};
    std::mutex mu;
    std::condition_variable cv;
    bool timed_out = false;
    static LateStore *self(void *ctx) { return static_cast<LateStore *>(ctx); }
    static mncl_status_t get(void *ctx, const char *key, void **value, size_t *len,
                             int64_t timeout_ms) {
      LateStore *s = self(ctx);
      const mncl_store_v1_t &t = *s->inner.table();
      const mncl_status_t st = t.get(t.ctx, key, value, len, timeout_ms);
      const std::string name = key;
      if (st != MNCL_ERR_TIMEOUT || name.size() < 3 || name.substr(name.size() - 3) != "/go") {
        return st;
      }
      {
        const std::lock_guard<std::mutex> lock(s->mu);
        s->timed_out = true;
      }
      s->cv.notify_all();
      const std::string counter = name.substr(0, name.size() - 2) + "n";
      for (int64_t arrived = 0; arrived < 2;) {  // rank 1's arrival, then the timeout
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        EXPECT_EQ(t.add(t.ctx, counter.c_str(), 0, &arrived), MNCL_OK);
      }
      return st;
    }
  } store;
  store.table = *store.inner.table();
  store.table.ctx = &store;
  store.table.get = &LateStore::get;
  store.table.set = [](void *ctx, const char *key, const void *value, size_t len) {
    const mncl_store_v1_t &t = *LateStore::self(ctx)->inner.table();
    return t.set(t.ctx, key, value, len);
  };
  store.table.release = [](void *ctx, void *value) {
    const mncl_store_v1_t &t = *LateStore::self(ctx)->inner.table();
    t.release(t.ctx, value);
  };
  store.table.add = [](void *ctx, const char *key, int64_t delta, int64_t *result) {
    const mncl_store_v1_t &t = *LateStore::self(ctx)->inner.table();
    return t.add(t.ctx, key, delta, result);
  };
  store.table.wait = [](void *ctx, const char *const *keys, size_t nkeys, int64_t timeout_ms) {
    const mncl_store_v1_t &t = *LateStore::self(ctx)->inner.table();
    return t.wait(t.ctx, keys, nkeys, timeout_ms);
  };
  store.table.del = [](void *ctx, const char *key) {
    const mncl_store_v1_t &t = *LateStore::self(ctx)->inner.table();
    return t.del(t.ctx, key);
  };
  std::vector<mncl_status_t> status(2, MNCL_ERR_INTERNAL);
  std::vector<std::string> errors(2);
  mncl_testing::on_threads(2, [&](int r) {
    Rank me;
    me.rank = r;
    me.size = 2;
    me.timeout_ms = 100;
    const mncl_bootstrap_v1_t bs = mncl_testing::make_bootstrap(r, 2, 100, "w", &store.table);
    ASSERT_EQ(g_plugin->comm_create(&bs, &me.comm), MNCL_OK) << t_last_error;
    if (r == 1) {  // arrives only once rank 0's wait has run out
      std::unique_lock<std::mutex> lock(store.mu);
      store.cv.wait(lock, [&] { return store.timed_out; });
    }
    status[r] = me.run(MNCL_COLL_BARRIER, 0, 0, -1, nullptr, nullptr, 0);
    errors[r] = t_last_error;
    EXPECT_EQ(g_plugin->comm_destroy(me.comm), MNCL_OK);
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(status[r], MNCL_OK) << "rank " << r << ": " << errors[r];
  EXPECT_TRUE(store.inner.keys().empty()) << "the barrier's keys were left in the store";
}

TEST(NaiveFailures, MismatchedCountsAreReported) {
  std::vector<mncl_status_t> status(2);
  std::vector<std::string> errors(2);
  run_ranks(
      2,
      [&](Rank &me) {
        std::vector<int32_t> v(4, 1);
        status[me.rank] = me.run(MNCL_COLL_ALLREDUCE, MNCL_INT32, MNCL_SUM, -1, v.data(), v.data(),
                                 me.rank == 0 ? 4 : 2);
        errors[me.rank] = t_last_error;
      },
      2000, false);
  EXPECT_EQ(status[0], MNCL_ERR_REMOTE);
  EXPECT_NE(errors[0].find("rank 1 sent 8 bytes where rank 0 expects 16"), std::string::npos)
      << errors[0];
}

TEST(NaiveFailures, AbortWakesABlockedCall) {
  MemStore store;
  std::atomic<void *> comm0{nullptr};
  mncl_status_t blocked = MNCL_OK, after = MNCL_OK;
  std::string error;
  std::chrono::steady_clock::duration waited{};
  std::thread aborter;
  run_ranks(
      2,
      [&](Rank &me) {
        if (me.rank != 0) return;  // rank 1 never sends
        comm0 = me.comm;
        aborter = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          store.abort();  // what the core does on mncl_comm_abort, before telling the plugin
          EXPECT_EQ(g_plugin->comm_abort(comm0.load()), MNCL_OK);
        });
        const auto start = std::chrono::steady_clock::now();
        int32_t v;
        blocked = me.run(MNCL_COLL_RECV, MNCL_INT32, 0, 1, nullptr, &v, 1);
        error = t_last_error;
        waited = std::chrono::steady_clock::now() - start;
        aborter.join();
        after = me.run(MNCL_COLL_BARRIER, 0, 0, -1, nullptr, nullptr, 0);
      },
      /*timeout_ms=*/20000, false, &store);
  EXPECT_EQ(blocked, MNCL_ERR_ABORTED);
  EXPECT_EQ(error,
            "naive recv #0: communicator aborted while waiting for the message #0 of rank 1");
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_EQ(after, MNCL_ERR_ABORTED);
}

}  // namespace

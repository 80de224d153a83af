// CUDA buffers through a host-only backend, end to end over the public API, without a GPU:
// every rank allocates "device" memory from the fake CUDA driver (fake_cuda.h: PROT_NONE
// pages, so a backend touching them directly would crash) and runs each collective on it;
// results must be exact. Run under mncl-run at 1-4 ranks with MNCL_BACKEND=naive (or gloo)
// and MNCL_CUDA_LIBRARY pointing at the fake.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mncl/mncl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_cuda.h"

namespace {

mncl_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1;

struct Fake {
  int (*init)();
  void *(*malloc)(size_t, int, int);
  void (*free)(void *);
  void (*write)(void *, const void *, size_t);
  void (*read)(void *, const void *, size_t);
  void *(*stream)();
  void (*counters)(fake_cuda_counters_t *);
  void (*hold)(void *, int);
} g_fake;

bool load_fake() {
  const char *path = std::getenv("MNCL_CUDA_LIBRARY");
  void *h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (h == nullptr) {
    std::fprintf(stderr, "set MNCL_CUDA_LIBRARY to libmncl-fake-cuda.so (%s)\n", dlerror());
    return false;
  }
  g_fake.init = reinterpret_cast<int (*)()>(dlsym(h, "fake_cuda_init"));
  g_fake.malloc = reinterpret_cast<void *(*)(size_t, int, int)>(dlsym(h, "fake_cuda_malloc"));
  g_fake.free = reinterpret_cast<void (*)(void *)>(dlsym(h, "fake_cuda_free"));
  g_fake.write =
      reinterpret_cast<void (*)(void *, const void *, size_t)>(dlsym(h, "fake_cuda_write"));
  g_fake.read =
      reinterpret_cast<void (*)(void *, const void *, size_t)>(dlsym(h, "fake_cuda_read"));
  g_fake.stream = reinterpret_cast<void *(*)()>(dlsym(h, "fake_cuda_stream_create"));
  g_fake.counters =
      reinterpret_cast<void (*)(fake_cuda_counters_t *)>(dlsym(h, "fake_cuda_get_counters"));
  g_fake.hold = reinterpret_cast<void (*)(void *, int)>(dlsym(h, "fake_cuda_hold_stream"));
  return g_fake.init() == 0;
}

#define MNCL_OK_OR_DIE(call)                                                                \
  do {                                                                                      \
    mncl_status_t st_ = (call);                                                             \
    if (st_ != MNCL_OK) {                                                                   \
      std::fprintf(stderr, "rank %d: %s: %s: %s\n", g_rank, #call, mncl_status_string(st_), \
                   mncl_last_error());                                                      \
      std::_Exit(1); /* the ranks could no longer match up */                               \
    }                                                                                       \
  } while (0)

// Fake device memory of int64 values.
class Dev {
 public:
  explicit Dev(size_t n) : n_(n), p_(static_cast<int64_t *>(g_fake.malloc(n * 8, 0, 0))) {}
  Dev(const std::vector<int64_t> &v) : Dev(v.size()) { set(v); }
  ~Dev() { g_fake.free(p_); }
  void set(const std::vector<int64_t> &v) { g_fake.write(p_, v.data(), v.size() * 8); }
  std::vector<int64_t> get() const {
    std::vector<int64_t> v(n_);
    g_fake.read(v.data(), p_, n_ * 8);
    return v;
  }
  int64_t *ptr() const { return p_; }

 private:
  size_t n_;
  int64_t *p_;
};

int64_t value(int rank, size_t i) {
  return 1000 * (rank + 1) + static_cast<int64_t>(i);
}
std::vector<int64_t> values(int rank, size_t n, size_t first = 0) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, first + i);
  return v;
}
int64_t sum_over_ranks(size_t i) {
  int64_t s = 0;
  for (int r = 0; r < g_size; ++r) s += value(r, i);
  return s;
}

constexpr size_t kCounts[] = {1, 1021, 100003};

TEST(CudaStaging, Allreduce) {
  for (size_t n : kCounts) {
    Dev send(values(g_rank, n)), recv(n);
    void *stream = g_fake.stream();
    MNCL_OK_OR_DIE(mncl_allreduce(g_comm, send.ptr(), recv.ptr(), n, MNCL_INT64, MNCL_SUM, stream));
    const auto r = recv.get();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], sum_over_ranks(i)) << "n=" << n << " i=" << i;
  }
}

TEST(CudaStaging, AllreduceInPlaceAndMax) {
  Dev buf(values(g_rank, 777));
  MNCL_OK_OR_DIE(mncl_allreduce(g_comm, buf.ptr(), buf.ptr(), 777, MNCL_INT64, MNCL_MAX, nullptr));
  EXPECT_EQ(buf.get(), values(g_size - 1, 777));
}

TEST(CudaStaging, BcastReduceScatterGather) {
  const size_t n = 513;
  const int root = g_size - 1;
  Dev b(g_rank == root ? values(root, n) : std::vector<int64_t>(n, -1));
  MNCL_OK_OR_DIE(mncl_bcast(g_comm, b.ptr(), n, MNCL_INT64, root, nullptr));
  EXPECT_EQ(b.get(), values(root, n));

  Dev rsend(values(g_rank, n)), rrecv(n);
  MNCL_OK_OR_DIE(
      mncl_reduce(g_comm, rsend.ptr(), rrecv.ptr(), n, MNCL_INT64, MNCL_SUM, 0, nullptr));
  if (g_rank == 0) {
    const auto r = rrecv.get();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], sum_over_ranks(i));
  }

  std::vector<int64_t> all;
  for (int r = 0; r < g_size; ++r) {
    const auto v = values(r, n);
    all.insert(all.end(), v.begin(), v.end());
  }
  Dev ssend(g_rank == root ? all : std::vector<int64_t>(1)), srecv(n);
  MNCL_OK_OR_DIE(mncl_scatter(g_comm, ssend.ptr(), srecv.ptr(), n, MNCL_INT64, root, nullptr));
  EXPECT_EQ(srecv.get(), values(g_rank, n));

  // In-place gather at the root: its block is already in place.
  Dev gbuf(g_rank == root ? all : values(g_rank, n));
  const int64_t *gsend = g_rank == root ? gbuf.ptr() + root * n : gbuf.ptr();
  MNCL_OK_OR_DIE(mncl_gather(g_comm, gsend, gbuf.ptr(), n, MNCL_INT64, root, nullptr));
  if (g_rank == root) {
    EXPECT_EQ(gbuf.get(), all);
  }
}

TEST(CudaStaging, AllgatherReduceScatterAlltoall) {
  const size_t n = 301;
  Dev agsend(values(g_rank, n)), agrecv(n * g_size);
  MNCL_OK_OR_DIE(mncl_allgather(g_comm, agsend.ptr(), agrecv.ptr(), n, MNCL_INT64, nullptr));
  const auto ag = agrecv.get();
  for (int r = 0; r < g_size; ++r) {
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(ag[r * n + i], value(r, i));
  }

  Dev rs(values(g_rank, n * g_size));  // in place: result lands in block `rank`
  MNCL_OK_OR_DIE(mncl_reduce_scatter(g_comm, rs.ptr(), rs.ptr() + g_rank * n, n, MNCL_INT64,
                                     MNCL_SUM, nullptr));
  const auto rsv = rs.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rsv[g_rank * n + i], sum_over_ranks(g_rank * n + i));

  // Block j of rank i holds 100000*i + j; afterwards block i of rank j holds it.
  std::vector<int64_t> a2a(n * g_size);
  for (int j = 0; j < g_size; ++j) {
    for (size_t i = 0; i < n; ++i) a2a[j * n + i] = 100000 * g_rank + 100 * j + (i % 100);
  }
  Dev at(a2a);
  MNCL_OK_OR_DIE(mncl_alltoall(g_comm, at.ptr(), at.ptr(), n, MNCL_INT64, nullptr));
  const auto got = at.get();
  for (int i = 0; i < g_size; ++i) {
    for (size_t k = 0; k < n; ++k) {
      ASSERT_EQ(got[i * n + k], 100000 * i + 100 * g_rank + static_cast<int64_t>(k % 100));
    }
  }
}

TEST(CudaStaging, SendRecvRingAndCoalescedAndBarrier) {
  const size_t n = 4099;
  if (g_size > 1) {
    const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    Dev out(values(g_rank, n)), in(n);
    if (g_rank % 2 == 0) {
      MNCL_OK_OR_DIE(mncl_send(g_comm, out.ptr(), n, MNCL_INT64, next, nullptr));
      MNCL_OK_OR_DIE(mncl_recv(g_comm, in.ptr(), n, MNCL_INT64, prev, nullptr));
    } else {
      MNCL_OK_OR_DIE(mncl_recv(g_comm, in.ptr(), n, MNCL_INT64, prev, nullptr));
      MNCL_OK_OR_DIE(mncl_send(g_comm, out.ptr(), n, MNCL_INT64, next, nullptr));
    }
    EXPECT_EQ(in.get(), values(prev, n));
  }
  Dev a(values(g_rank, 10)), b(values(g_rank, 20));
  std::vector<int64_t> host_send = values(g_rank, 5), host_recv(5);
  const void *sends[] = {a.ptr(), b.ptr(), host_send.data()};
  void *recvs[] = {a.ptr(), b.ptr(), host_recv.data()};
  const size_t counts[] = {10, 20, 5};
  MNCL_OK_OR_DIE(
      mncl_allreduce_coalesced(g_comm, sends, recvs, counts, 3, MNCL_INT64, MNCL_SUM, nullptr));
  const auto av = a.get(), bv = b.get();
  for (size_t i = 0; i < 10; ++i) ASSERT_EQ(av[i], sum_over_ranks(i));
  for (size_t i = 0; i < 20; ++i) ASSERT_EQ(bv[i], sum_over_ranks(i));
  for (size_t i = 0; i < 5; ++i) ASSERT_EQ(host_recv[i], sum_over_ranks(i));
  MNCL_OK_OR_DIE(mncl_barrier(g_comm, nullptr));
}

TEST(CudaStaging, NonBlockingInIssueOrder) {
  const size_t n = 2048;
  Dev x(values(g_rank, n)), y(values(g_rank, n, 7)), z(n);
  mncl_request_t r1 = nullptr, r2 = nullptr;
  MNCL_OK_OR_DIE(mncl_iallreduce(g_comm, x.ptr(), x.ptr(), n, MNCL_INT64, MNCL_SUM, nullptr, &r1));
  MNCL_OK_OR_DIE(mncl_iallreduce(g_comm, y.ptr(), z.ptr(), n, MNCL_INT64, MNCL_SUM, nullptr, &r2));
  MNCL_OK_OR_DIE(mncl_wait(r2, -1));
  MNCL_OK_OR_DIE(mncl_wait(r1, -1));
  const auto xv = x.get(), zv = z.get();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(xv[i], sum_over_ranks(i));
    ASSERT_EQ(zv[i], sum_over_ranks(i + 7));
  }
}

TEST(CudaStaging, ExchangeWithEveryPeerAtOncePoolsPinnedBuffers) {
  // Receives from and sends to every peer posted at once, device buffers on both sides: each
  // runs on a lane of its own (send/recv per peer) and stages concurrently. The results must be
  // exact, and afterwards at most StagingPool::kKeptIdle (4) pinned buffers stay allocated in
  // this process, however many lanes staged (before the pool, one per lane: 7 at 4 ranks).
  constexpr uint64_t kKeptIdle = 4;
  if (g_size == 1) GTEST_SKIP() << "needs a peer";
  const size_t n = 3001;
  std::vector<std::unique_ptr<Dev>> outs, ins;
  for (int round = 0; round < 3; ++round) {
    std::vector<mncl_request_t> requests;
    outs.clear();
    ins.clear();
    for (int peer = 0; peer < g_size; ++peer) {
      if (peer == g_rank) continue;
      ins.push_back(std::make_unique<Dev>(n));
      outs.push_back(std::make_unique<Dev>(values(g_rank, n, 10 * peer + round)));
      requests.emplace_back();
      MNCL_OK_OR_DIE(
          mncl_irecv(g_comm, ins.back()->ptr(), n, MNCL_INT64, peer, nullptr, &requests.back()));
    }
    size_t i = 0;
    for (int peer = 0; peer < g_size; ++peer) {
      if (peer == g_rank) continue;
      requests.emplace_back();
      MNCL_OK_OR_DIE(
          mncl_isend(g_comm, outs[i++]->ptr(), n, MNCL_INT64, peer, nullptr, &requests.back()));
    }
    for (auto it = requests.rbegin(); it != requests.rend(); ++it) {
      MNCL_OK_OR_DIE(mncl_wait(*it, -1));
    }
    i = 0;
    for (int peer = 0; peer < g_size; ++peer) {
      if (peer == g_rank) continue;
      ASSERT_EQ(ins[i++]->get(), values(peer, n, 10 * g_rank + round)) << "from rank " << peer;
    }
  }
  fake_cuda_counters_t k{};
  g_fake.counters(&k);
  EXPECT_LE(k.host_allocs - k.host_frees, kKeptIdle)
      << k.host_allocs << " pinned allocations, " << k.host_frees << " frees";
  MNCL_OK_OR_DIE(mncl_barrier(g_comm, nullptr));
}

// Work on the caller's stream that never finishes (a hung kernel): every rank's staging wait
// ends at the communicator's timeout with MNCL_ERR_TIMEOUT, or at once on mncl_comm_abort with
// MNCL_ERR_ABORTED, instead of blocking forever in a stream synchronization. No rank reached
// the backend, so the communicator still works once the stream moves again.
TEST(CudaStaging, AStuckStreamTimesOutOrIsAbortedInsteadOfHanging) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.timeout_ms = 300;
  mncl_comm_t short_lived = nullptr;
  MNCL_OK_OR_DIE(mncl_comm_split_config(g_comm, 0, g_rank, &config, &short_lived));
  Dev buf(values(g_rank, 64));
  void *stream = g_fake.stream();
  g_fake.hold(stream, 1);
  mncl_status_t st =
      mncl_allreduce(short_lived, buf.ptr(), buf.ptr(), 64, MNCL_INT64, MNCL_SUM, stream);
  EXPECT_EQ(st, MNCL_ERR_TIMEOUT) << mncl_last_error();
  const std::string message = mncl_last_error();
  EXPECT_NE(message.find("mncl_allreduce #"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA staging: the caller's stream"), std::string::npos) << message;
  EXPECT_NE(message.find("timeout of 0.3 s"), std::string::npos) << message;
  g_fake.hold(stream, 0);
  MNCL_OK_OR_DIE(
      mncl_allreduce(short_lived, buf.ptr(), buf.ptr(), 64, MNCL_INT64, MNCL_SUM, stream));
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(buf.get()[i], sum_over_ranks(i)) << i;

  config.timeout_ms = 600000;
  mncl_comm_t aborted = nullptr;
  MNCL_OK_OR_DIE(mncl_comm_split_config(g_comm, 0, g_rank, &config, &aborted));
  g_fake.hold(stream, 1);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mncl_comm_abort(aborted);
  });
  st = mncl_allreduce(aborted, buf.ptr(), buf.ptr(), 64, MNCL_INT64, MNCL_SUM, stream);
  aborter.join();
  EXPECT_EQ(st, MNCL_ERR_ABORTED) << mncl_last_error();
  g_fake.hold(stream, 0);
  mncl_comm_destroy(aborted);
  MNCL_OK_OR_DIE(mncl_comm_destroy(short_lived));
  MNCL_OK_OR_DIE(mncl_barrier(g_comm, nullptr));
}

// cudaStreamPerThread (handle 0x2) names the calling thread's default stream. A non-blocking
// operation runs on a lane's thread, where staging on 0x2 would copy on that thread's stream,
// unordered with the caller's kernels (stale inputs, silently). The lane waits for a marker
// recorded on the caller's stream when the operation was issued: with the caller's stream held
// (the fake's 0x2 is per thread, as CUDA's), nothing finishes.
TEST(CudaStaging, APerThreadStreamQueuedToALaneWaitsForTheCallersWork) {
  void *const per_thread = reinterpret_cast<void *>(0x2);
  Dev buf(values(g_rank, 64));
  g_fake.hold(per_thread, 1);
  mncl_request_t request = nullptr;
  MNCL_OK_OR_DIE(mncl_iallreduce(g_comm, buf.ptr(), buf.ptr(), 64, MNCL_INT64, MNCL_SUM, per_thread,
                                 &request));
  // Its inputs wait for the caller's stream: not finished, however long it is given.
  EXPECT_EQ(mncl_wait(request, 300), MNCL_ERR_TIMEOUT) << mncl_last_error();
  g_fake.hold(per_thread, 0);
  MNCL_OK_OR_DIE(mncl_wait(request, -1));
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(buf.get()[i], sum_over_ranks(i)) << i;
  MNCL_OK_OR_DIE(mncl_barrier(g_comm, nullptr));
}

TEST(CudaStaging, StagingReallyHappened) {
  fake_cuda_counters_t k{};
  g_fake.counters(&k);
  EXPECT_GT(k.d2h_copies, 10u);
  EXPECT_GT(k.h2d_copies, 10u);
  EXPECT_GE(k.syncs, k.d2h_copies > 0 ? 2u : 0u);
  EXPECT_EQ(k.bad_context, 0u);
  EXPECT_EQ(k.ctx_depth, 0);
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!load_fake()) return 1;
  MNCL_OK_OR_DIE(mncl_comm_create(nullptr, &g_comm));
  MNCL_OK_OR_DIE(mncl_comm_rank(g_comm, &g_rank));
  MNCL_OK_OR_DIE(mncl_comm_size(g_comm, &g_size));
  if (g_rank != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  MNCL_OK_OR_DIE(mncl_comm_destroy(g_comm));
  if (failed) std::fprintf(stderr, "rank %d: FAILED\n", g_rank);
  return failed;
}

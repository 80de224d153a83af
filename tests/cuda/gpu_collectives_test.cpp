// Collectives on real CUDA buffers over the public API, for a machine with NVIDIA GPUs (run by
// tests/gpu/run.sh, and by ctest, where it skips without a GPU). SPMD under mncl-run:
//   MNCL_BACKEND=nccl  mncl-run -n <GPUs> -- gpu_collectives_test     (one GPU per rank)
//   MNCL_BACKEND=naive mncl-run -n 3 -- gpu_collectives_test          (staging, GPUs shared)
// Each rank uses GPU local_rank % count. Data are small integers: results are exact.
// MNCL_GPU_TEST_DEAD_PEER=1 runs only the failure test: rank 1 leaves after creation and
// rank 0's allreduce must fail within MNCL_TIMEOUT instead of hanging.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mncl/mncl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

mncl_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1;

#define CUDA_OK(call)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "rank %d: %s: %s\n", g_rank, #call, cudaGetErrorString(e_)); \
      std::_Exit(1);                                                                    \
    }                                                                                   \
  } while (0)
#define MNCL_OK_OR_DIE(call)                                                                \
  do {                                                                                      \
    mncl_status_t st_ = (call);                                                             \
    if (st_ != MNCL_OK) {                                                                   \
      std::fprintf(stderr, "rank %d: %s: %s: %s\n", g_rank, #call, mncl_status_string(st_), \
                   mncl_last_error());                                                      \
      std::_Exit(1);                                                                        \
    }                                                                                       \
  } while (0)

template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit Dev(const std::vector<T> &v) : Dev(v.size()) { set(v); }
  ~Dev() { cudaFree(p_); }
  void set(const std::vector<T> &v) {
    CUDA_OK(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> get() const {
    CUDA_OK(cudaDeviceSynchronize());  // stream-ordered backends return before the GPU is done
    std::vector<T> v(n_);
    CUDA_OK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  T *ptr() const { return p_; }

 private:
  size_t n_;
  T *p_ = nullptr;
};

int64_t value(int rank, size_t i) {
  return (rank + 1) * 10 + static_cast<int64_t>(i % 50);
}
template <typename T>
std::vector<T> values(int rank, size_t n, size_t first = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value(rank, first + i));
  return v;
}
int64_t sum_over_ranks(size_t i) {
  int64_t s = 0;
  for (int r = 0; r < g_size; ++r) s += value(r, i);
  return s;
}

bool dead_peer_mode() {
  return std::getenv("MNCL_GPU_TEST_DEAD_PEER") != nullptr;
}

TEST(Gpu, AllreduceEveryOp) {
  if (dead_peer_mode()) GTEST_SKIP();
  const size_t n = 100003;
  for (mncl_op_t op : {MNCL_SUM, MNCL_PROD, MNCL_MIN, MNCL_MAX, MNCL_AVG}) {
    Dev<int32_t> send(values<int32_t>(g_rank, n)), recv(n);
    if (op == MNCL_PROD) send.set(std::vector<int32_t>(n, g_rank % 2 ? -1 : 1));
    MNCL_OK_OR_DIE(mncl_allreduce(g_comm, send.ptr(), recv.ptr(), n, MNCL_INT32, op, nullptr));
    const auto r = recv.get();
    for (size_t i = 0; i < n; ++i) {
      int64_t want = sum_over_ranks(i);
      if (op == MNCL_PROD) want = (g_size / 2) % 2 ? -1 : 1;
      if (op == MNCL_MIN) want = value(0, i);
      if (op == MNCL_MAX) want = value(g_size - 1, i);
      if (op == MNCL_AVG) want = sum_over_ranks(i) / g_size;
      ASSERT_EQ(r[i], want) << "op " << op << " i " << i;
    }
  }
}

TEST(Gpu, FloatDtypesAndStreamOrder) {
  if (dead_peer_mode()) GTEST_SKIP();
  const size_t n = 4099;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  Dev<float> f(n);
  // Written on the stream right before the allreduce: the collective must see it.
  CUDA_OK(cudaMemcpyAsync(f.ptr(), values<float>(g_rank, n).data(), n * sizeof(float),
                          cudaMemcpyHostToDevice, stream));
  CUDA_OK(cudaStreamSynchronize(stream));  // the vector above was a temporary
  MNCL_OK_OR_DIE(mncl_allreduce(g_comm, f.ptr(), f.ptr(), n, MNCL_FLOAT32, MNCL_SUM, stream));
  std::vector<float> out(n);
  CUDA_OK(cudaMemcpyAsync(out.data(), f.ptr(), n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<float>(sum_over_ranks(i)));
  Dev<double> d(values<double>(g_rank, n));
  MNCL_OK_OR_DIE(mncl_allreduce(g_comm, d.ptr(), d.ptr(), n, MNCL_FLOAT64, MNCL_MAX, nullptr));
  EXPECT_EQ(d.get(), values<double>(g_size - 1, n));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(Gpu, RootedAndDataMovement) {
  if (dead_peer_mode()) GTEST_SKIP();
  const size_t n = 1021;
  const int root = g_size - 1;
  std::vector<int64_t> all;
  for (int r = 0; r < g_size; ++r) {
    auto v = values<int64_t>(r, n);
    all.insert(all.end(), v.begin(), v.end());
  }
  Dev<int64_t> b(g_rank == root ? values<int64_t>(root, n) : std::vector<int64_t>(n, -1));
  MNCL_OK_OR_DIE(mncl_bcast(g_comm, b.ptr(), n, MNCL_INT64, root, nullptr));
  EXPECT_EQ(b.get(), values<int64_t>(root, n));

  Dev<int64_t> rs(values<int64_t>(g_rank, n)), rr(n);
  MNCL_OK_OR_DIE(mncl_reduce(g_comm, rs.ptr(), rr.ptr(), n, MNCL_INT64, MNCL_SUM, root, nullptr));
  if (g_rank == root) {
    const auto v = rr.get();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], sum_over_ranks(i));
  }

  Dev<int64_t> ss(g_rank == root ? all : std::vector<int64_t>(1)), sr(n);
  MNCL_OK_OR_DIE(mncl_scatter(g_comm, ss.ptr(), sr.ptr(), n, MNCL_INT64, root, nullptr));
  EXPECT_EQ(sr.get(), values<int64_t>(g_rank, n));

  Dev<int64_t> gs(values<int64_t>(g_rank, n)), gr(n * g_size);
  MNCL_OK_OR_DIE(mncl_gather(g_comm, gs.ptr(), gr.ptr(), n, MNCL_INT64, root, nullptr));
  if (g_rank == root) {
    EXPECT_EQ(gr.get(), all);
  }

  Dev<int64_t> ag(n * g_size);
  MNCL_OK_OR_DIE(mncl_allgather(g_comm, gs.ptr(), ag.ptr(), n, MNCL_INT64, nullptr));
  EXPECT_EQ(ag.get(), all);

  Dev<int64_t> rsc(values<int64_t>(g_rank, n * g_size)), rso(n);
  MNCL_OK_OR_DIE(
      mncl_reduce_scatter(g_comm, rsc.ptr(), rso.ptr(), n, MNCL_INT64, MNCL_SUM, nullptr));
  const auto rsv = rso.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rsv[i], sum_over_ranks(g_rank * n + i));

  std::vector<int64_t> a2a(n * g_size);
  for (int j = 0; j < g_size; ++j) {
    for (size_t i = 0; i < n; ++i) a2a[j * n + i] = 100000 * g_rank + 100 * j + (i % 100);
  }
  for (bool in_place : {false, true}) {
    Dev<int64_t> at(a2a), ao(n * g_size);
    int64_t *out = in_place ? at.ptr() : ao.ptr();
    MNCL_OK_OR_DIE(mncl_alltoall(g_comm, at.ptr(), out, n, MNCL_INT64, nullptr));
    const auto got = in_place ? at.get() : ao.get();
    for (int i = 0; i < g_size; ++i) {
      for (size_t k = 0; k < n; ++k) {
        ASSERT_EQ(got[i * n + k], 100000 * i + 100 * g_rank + static_cast<int64_t>(k % 100))
            << (in_place ? "in place" : "out of place");
      }
    }
  }
}

TEST(Gpu, PointToPointCoalescedBarrierNonBlocking) {
  if (dead_peer_mode()) GTEST_SKIP();
  const size_t n = 65537;
  if (g_size > 1) {
    const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    Dev<int32_t> out(values<int32_t>(g_rank, n)), in(n);
    // Even ranks send first: on one stream NCCL runs a recv and a later send in order, so an
    // all-receive-first ring would wait forever.
    mncl_request_t rs = nullptr, rr = nullptr;
    if (g_rank % 2 == 0) {
      MNCL_OK_OR_DIE(mncl_isend(g_comm, out.ptr(), n, MNCL_INT32, next, nullptr, &rs));
      MNCL_OK_OR_DIE(mncl_irecv(g_comm, in.ptr(), n, MNCL_INT32, prev, nullptr, &rr));
    } else {
      MNCL_OK_OR_DIE(mncl_irecv(g_comm, in.ptr(), n, MNCL_INT32, prev, nullptr, &rr));
      MNCL_OK_OR_DIE(mncl_isend(g_comm, out.ptr(), n, MNCL_INT32, next, nullptr, &rs));
    }
    MNCL_OK_OR_DIE(mncl_wait(rs, -1));
    MNCL_OK_OR_DIE(mncl_wait(rr, -1));
    EXPECT_EQ(in.get(), values<int32_t>(prev, n));
  }
  Dev<int32_t> a(values<int32_t>(g_rank, 10)), b(values<int32_t>(g_rank, 20));
  const void *sends[] = {a.ptr(), b.ptr()};
  void *recvs[] = {a.ptr(), b.ptr()};
  const size_t counts[] = {10, 20};
  MNCL_OK_OR_DIE(
      mncl_allreduce_coalesced(g_comm, sends, recvs, counts, 2, MNCL_INT32, MNCL_SUM, nullptr));
  const auto av = a.get(), bv = b.get();
  for (size_t i = 0; i < 10; ++i) ASSERT_EQ(av[i], sum_over_ranks(i));
  for (size_t i = 0; i < 20; ++i) ASSERT_EQ(bv[i], sum_over_ranks(i));
  MNCL_OK_OR_DIE(mncl_barrier(g_comm, nullptr));

  Dev<int32_t> x(values<int32_t>(g_rank, n));
  mncl_request_t r = nullptr;
  MNCL_OK_OR_DIE(mncl_iallreduce(g_comm, x.ptr(), x.ptr(), n, MNCL_INT32, MNCL_SUM, nullptr, &r));
  MNCL_OK_OR_DIE(mncl_wait(r, -1));  // synchronizes: the host may read now
  std::vector<int32_t> host(n);
  CUDA_OK(cudaMemcpy(host.data(), x.ptr(), n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(host[i], sum_over_ranks(i));
}

// allgatherv, gatherv, scatterv and alltoallv on device memory (nccl: grouped send/recv; host
// backends: staged), with uneven blocks, an empty one, and gaps between blocks that must keep
// their contents.
TEST(Gpu, VariableCountCollectives) {
  if (dead_peer_mode()) GTEST_SKIP();
  const size_t n = static_cast<size_t>(g_size), me = static_cast<size_t>(g_rank);
  constexpr int32_t kGap = -7;
  auto count = [](size_t from, size_t to) {
    return (from + 2 * to) % 4 == 1 ? 0 : 1000 + 37 * from + 11 * to;
  };
  {  // allgatherv: rank i's block of count(i, 0), blocks in reverse rank order, 3-element gaps
    std::vector<size_t> counts(n), displs(n);
    size_t at = 3;
    for (size_t k = n; k-- > 0;) {
      counts[k] = count(k, 0);
      displs[k] = at;
      at += counts[k] + 3;
    }
    std::vector<int32_t> want(at, kGap);
    for (size_t r = 0; r < n; ++r) {
      const auto v = values<int32_t>(static_cast<int>(r), counts[r]);
      std::copy(v.begin(), v.end(), want.begin() + static_cast<ptrdiff_t>(displs[r]));
    }
    Dev<int32_t> send(values<int32_t>(g_rank, counts[me])), recv(std::vector<int32_t>(at, kGap));
    MNCL_OK_OR_DIE(mncl_allgatherv(g_comm, send.ptr(), counts[me], recv.ptr(), counts.data(),
                                   displs.data(), MNCL_INT32, nullptr));
    EXPECT_EQ(recv.get(), want) << "allgatherv";

    // gatherv onto the last rank in the same layout, then scatterv back from it, in place there.
    const int root = g_size - 1;
    const bool is_root = g_rank == root;
    Dev<int32_t> gathered(std::vector<int32_t>(at, kGap));
    MNCL_OK_OR_DIE(mncl_gatherv(g_comm, send.ptr(), counts[me], gathered.ptr(), counts.data(),
                                displs.data(), MNCL_INT32, root, nullptr));
    if (is_root) {
      EXPECT_EQ(gathered.get(), want) << "gatherv";
    } else {
      EXPECT_EQ(gathered.get(), std::vector<int32_t>(at, kGap)) << "gatherv: a non-root's recvbuf";
    }
    Dev<int32_t> back(std::vector<int32_t>(counts[me], kGap));
    int32_t *own = is_root ? gathered.ptr() + displs[me] : back.ptr();
    MNCL_OK_OR_DIE(mncl_scatterv(g_comm, gathered.ptr(), counts.data(), displs.data(), own,
                                 counts[me], MNCL_INT32, root, nullptr));
    if (is_root) {
      EXPECT_EQ(gathered.get(), want) << "scatterv in place";
    } else {
      EXPECT_EQ(back.get(), values<int32_t>(g_rank, counts[me])) << "scatterv";
    }
  }
  {  // alltoallv: count(i, j) from rank i to rank j, packed send side, gapped receive side
    std::vector<size_t> sendcounts(n), sdispls(n), recvcounts(n), rdispls(n);
    size_t sat = 0, rat = 2;
    std::vector<int32_t> sendv;
    for (size_t j = 0; j < n; ++j) {
      sendcounts[j] = count(me, j);
      sdispls[j] = sat;
      sat += sendcounts[j];
      const auto v = values<int32_t>(g_rank, sendcounts[j], 7 * j);
      sendv.insert(sendv.end(), v.begin(), v.end());
      recvcounts[j] = count(j, me);
      rdispls[j] = rat;
      rat += recvcounts[j] + 2;
    }
    std::vector<int32_t> want(rat, kGap);
    for (size_t i = 0; i < n; ++i) {
      const auto v = values<int32_t>(static_cast<int>(i), recvcounts[i], 7 * me);
      std::copy(v.begin(), v.end(), want.begin() + static_cast<ptrdiff_t>(rdispls[i]));
    }
    Dev<int32_t> send(sendv), recv(std::vector<int32_t>(rat, kGap));
    MNCL_OK_OR_DIE(mncl_alltoallv(g_comm, send.ptr(), sendcounts.data(), sdispls.data(), recv.ptr(),
                                  recvcounts.data(), rdispls.data(), MNCL_INT32, nullptr));
    EXPECT_EQ(recv.get(), want) << "alltoallv";
  }
}

// A buffer on another GPU than the rank's: a local argument error, and the communicator lives.
TEST(Gpu, BufferOnAnotherGpuIsRefusedAndTheCommLives) {
  if (dead_peer_mode()) GTEST_SKIP();
  const char *backend = "";
  mncl_comm_backend(g_comm, &backend);
  if (std::strcmp(backend, "nccl") != 0) GTEST_SKIP() << "host backends stage any GPU's memory";
  int count = 0, mine = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  CUDA_OK(cudaGetDevice(&mine));
  if (count < 2) GTEST_SKIP() << "needs 2 visible GPUs";
  const size_t n = 64;
  CUDA_OK(cudaSetDevice((mine + 1) % count));
  Dev<int32_t> elsewhere(values<int32_t>(g_rank, n));
  CUDA_OK(cudaSetDevice(mine));
  const mncl_status_t st =
      mncl_allreduce(g_comm, elsewhere.ptr(), elsewhere.ptr(), n, MNCL_INT32, MNCL_SUM, nullptr);
  EXPECT_EQ(st, MNCL_ERR_INVALID_ARGUMENT) << mncl_status_string(st) << ": " << mncl_last_error();
  EXPECT_NE(std::strstr(mncl_last_error(), "memory of CUDA device"), nullptr) << mncl_last_error();
  // Every rank refused it before NCCL saw it: the next collective works.
  Dev<int32_t> x(values<int32_t>(g_rank, n));
  MNCL_OK_OR_DIE(mncl_allreduce(g_comm, x.ptr(), x.ptr(), n, MNCL_INT32, MNCL_SUM, nullptr));
  const auto r = x.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], sum_over_ranks(i));
}

const char *backend_name() {
  const char *backend = "";
  mncl_comm_backend(g_comm, &backend);
  return backend;
}

// CUDA graphs: nccl records collectives into a capture and every launch runs them; a host
// backend refuses a capturing stream without breaking the capture (a graph without the
// collective would be silently wrong). Rank 0 captures while one of its collectives is still
// in flight: the plugin's watchdog polls that collective's event during the capture, which must
// not invalidate it (global capture mode prohibits such queries from any thread by default).
TEST(Gpu, CollectivesInACudaGraphRunOnEveryLaunch) {
  if (dead_peer_mode()) GTEST_SKIP();
  const bool nccl = std::strcmp(backend_name(), "nccl") == 0;
  const size_t n = 4099;
  const size_t un = static_cast<size_t>(g_size);
  cudaStream_t stream, side;
  CUDA_OK(cudaStreamCreate(&stream));
  CUDA_OK(cudaStreamCreate(&side));
  Dev<int32_t> x(n), all(n * un), blocks(n * un), pending(values<int32_t>(g_rank, n));

  // NCCL connects point-to-point peers lazily (alltoall is grouped send/recv here), with calls
  // a global-mode capture prohibits: one uncaptured alltoall first, as NCCL's docs advise.
  if (nccl)
    MNCL_OK_OR_DIE(mncl_alltoall(g_comm, blocks.ptr(), blocks.ptr(), n, MNCL_INT32, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  mncl_request_t in_flight = nullptr;
  if (nccl && g_size > 1) {
    // Rank 0's allreduce waits for the others, which join 0.5 s later: it is in flight (and
    // watched) during rank 0's capture below.
    if (g_rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MNCL_OK_OR_DIE(mncl_iallreduce(g_comm, pending.ptr(), pending.ptr(), n, MNCL_INT32, MNCL_SUM,
                                   side, &in_flight));
    if (g_rank != 0) MNCL_OK_OR_DIE(mncl_wait(in_flight, -1));
  }

  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  if (!nccl) {
    const mncl_status_t st =
        mncl_allreduce(g_comm, x.ptr(), x.ptr(), n, MNCL_INT32, MNCL_SUM, stream);
    EXPECT_EQ(st, MNCL_ERR_NOT_SUPPORTED) << mncl_status_string(st) << ": " << mncl_last_error();
    EXPECT_NE(std::strstr(mncl_last_error(), "capturing a CUDA graph"), nullptr)
        << mncl_last_error();
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the refusal broke the capture";
    if (graph != nullptr) cudaGraphDestroy(graph);
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaStreamDestroy(side));
    return;
  }
  // Host memory cannot be captured: refused, and the capture lives on.
  std::vector<int32_t> host(n, 1);
  mncl_status_t st =
      mncl_allreduce(g_comm, host.data(), host.data(), n, MNCL_INT32, MNCL_SUM, stream);
  EXPECT_EQ(st, MNCL_ERR_NOT_SUPPORTED) << mncl_status_string(st) << ": " << mncl_last_error();
  MNCL_OK_OR_DIE(mncl_allgather(g_comm, x.ptr(), all.ptr(), n, MNCL_INT32, stream));
  MNCL_OK_OR_DIE(mncl_allreduce(g_comm, x.ptr(), x.ptr(), n, MNCL_INT32, MNCL_SUM, stream));
  MNCL_OK_OR_DIE(mncl_alltoall(g_comm, blocks.ptr(), blocks.ptr(), n, MNCL_INT32, stream));
  MNCL_OK_OR_DIE(mncl_barrier(g_comm, stream));  // recorded, not waited for
  mncl_request_t r = nullptr;
  MNCL_OK_OR_DIE(mncl_ibcast(g_comm, all.ptr(), n, MNCL_INT32, g_size - 1, stream, &r));
  MNCL_OK_OR_DIE(mncl_wait(r, -1));  // done at once: it runs on each launch
  if (g_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // watchdog polls
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the capture was invalidated";
  if (in_flight != nullptr && g_rank == 0) MNCL_OK_OR_DIE(mncl_wait(in_flight, -1));
  if (g_size > 1) {
    const auto p = pending.get();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], sum_over_ranks(i));
  }
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int launch = 0; launch < 3; ++launch) {
    const int32_t shift = 1000 * launch;
    auto shifted = [&](int rank, size_t count, size_t first) {
      auto v = values<int32_t>(rank, count, first);
      for (auto &e : v) e += shift;
      return v;
    };
    x.set(shifted(g_rank, n, 0));
    std::vector<int32_t> b(n * un);  // block p: what this rank sends to rank p
    for (size_t p = 0; p < un; ++p) {
      const auto v = shifted(g_rank, n, p * 7);
      std::copy(v.begin(), v.end(), b.begin() + static_cast<ptrdiff_t>(p * n));
    }
    blocks.set(b);
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    const auto xr = x.get(), ar = all.get(), br = blocks.get();
    const size_t me = static_cast<size_t>(g_rank);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(xr[i], sum_over_ranks(i) + shift * g_size) << "launch " << launch << " i " << i;
    }
    // allgather ran before the allreduce, then the bcast sent rank size-1's gather to everyone.
    for (size_t p = 0; p < un; ++p) {
      const auto want = shifted(static_cast<int>(p), n, 0);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(ar[p * n + i], want[i]) << "launch " << launch;
      const auto sent = shifted(static_cast<int>(p), n, me * 7);  // rank p's block for me
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(br[p * n + i], sent[i]) << "launch " << launch;
    }
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaStreamDestroy(side));
  // The communicator is still in step on every rank.
  Dev<int32_t> after(values<int32_t>(g_rank, n));
  MNCL_OK_OR_DIE(
      mncl_allreduce(g_comm, after.ptr(), after.ptr(), n, MNCL_INT32, MNCL_SUM, nullptr));
  const auto ar = after.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(ar[i], sum_over_ranks(i));
}

// Another thread captures a CUDA graph in global mode (touching no MNCL) while this one runs
// ordinary collectives on its own stream, more than 64 (nccl then prunes its finished events)
// and a non-blocking one it waits for: none of MNCL's event queries may invalidate that capture
// (they once did: a query in global mode is prohibited while any thread captures).
TEST(Gpu, CollectivesBesideAnotherThreadsCaptureLeaveItIntact) {
  if (dead_peer_mode()) GTEST_SKIP();
  const size_t n = 257;
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  cudaStream_t mine, theirs;
  CUDA_OK(cudaStreamCreate(&mine));
  CUDA_OK(cudaStreamCreate(&theirs));
  Dev<int32_t> x(values<int32_t>(g_rank, n)), y(n);
  CUDA_OK(cudaStreamSynchronize(mine));
  MNCL_OK_OR_DIE(mncl_barrier(g_comm, nullptr));
  std::mutex m;
  std::condition_variable cv;
  bool begun = false, finish = false;
  cudaError_t begin = cudaErrorUnknown, end = cudaErrorUnknown;
  std::thread capturer([&] {
    cudaSetDevice(device);
    begin = cudaStreamBeginCapture(theirs, cudaStreamCaptureModeGlobal);
    std::unique_lock<std::mutex> lock(m);
    begun = true;
    cv.notify_all();
    cv.wait(lock, [&] { return finish; });
    cudaGraph_t graph = nullptr;
    end = cudaStreamEndCapture(theirs, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return begun; });
  }
  for (int i = 0; i < 70; ++i) {
    MNCL_OK_OR_DIE(mncl_allreduce(g_comm, x.ptr(), y.ptr(), n, MNCL_INT32, MNCL_SUM, mine));
  }
  mncl_request_t r = nullptr;
  MNCL_OK_OR_DIE(mncl_iallreduce(g_comm, x.ptr(), y.ptr(), n, MNCL_INT32, MNCL_SUM, mine, &r));
  MNCL_OK_OR_DIE(mncl_wait(r, -1));
  {
    std::lock_guard<std::mutex> lock(m);
    finish = true;
  }
  cv.notify_all();
  capturer.join();
  EXPECT_EQ(begin, cudaSuccess);
  EXPECT_EQ(end, cudaSuccess) << "the other thread's capture was invalidated: "
                              << cudaGetErrorString(end);
  const auto got = y.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], sum_over_ranks(i));
  CUDA_OK(cudaStreamDestroy(mine));
  CUDA_OK(cudaStreamDestroy(theirs));
}

// Batched point to point on device memory: a ring shift both ways in one mncl_sendrecv_batch,
// its receives listed first (as separate calls on one stream that never completes on NCCL,
// and the fake GPU's NCCL deadlocks as NCCL does), mncl_sendrecv and mncl_isendrecv_batch on a
// stream; then a batch and an mncl_isendrecv recorded into a CUDA graph and run by every
// launch (nccl), or refused on a capturing stream without breaking the capture (host backends,
// which stage device buffers otherwise).
TEST(Gpu, BatchedPointToPointAndInACudaGraph) {
  if (dead_peer_mode()) GTEST_SKIP();
  const bool nccl = std::strcmp(backend_name(), "nccl") == 0;
  MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, nullptr, 0, nullptr));  // valid at every size
  if (g_size == 1) GTEST_SKIP() << "a ring needs two ranks (the empty batch ran)";
  const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  const size_t n = 65537, m = 1021;  // to the next rank, to the previous one
  // What `rank` sends to its next and previous ranks, shifted by `shift`.
  auto rightward = [&](int rank, int32_t shift) {
    auto v = values<int32_t>(rank, n, 3);
    for (auto &e : v) e += shift;
    return v;
  };
  auto leftward = [&](int rank, int32_t shift) {
    auto v = values<int32_t>(rank, m, 17);
    for (auto &e : v) e = -e - shift;
    return v;
  };
  Dev<int32_t> to_next(rightward(g_rank, 0)), to_prev(leftward(g_rank, 0)), from_prev(n),
      from_next(m), back(n);
  // At 2 ranks both neighbours are one peer: sends to the next rank come first, and so do
  // receives from the previous one, so the messages pair up in array order.
  const mncl_p2p_op_t ops[] = {mncl_p2p_op(MNCL_P2P_RECV, from_prev.ptr(), n, MNCL_INT32, prev),
                               mncl_p2p_op(MNCL_P2P_RECV, from_next.ptr(), m, MNCL_INT32, next),
                               mncl_p2p_op(MNCL_P2P_SEND, to_next.ptr(), n, MNCL_INT32, next),
                               mncl_p2p_op(MNCL_P2P_SEND, to_prev.ptr(), m, MNCL_INT32, prev)};
  if (std::strcmp(backend_name(), "flat") == 0) {
    // flat without a CUDA-aware MPI stages device buffers one posted operation at a time, and a
    // staged post runs to its end before the next starts: the ops of an exchange could not
    // progress together, so such a batch is refused before anything starts.
    mncl_status_t st = mncl_sendrecv_batch(g_comm, ops, 4, nullptr);
    EXPECT_EQ(st, MNCL_ERR_NOT_SUPPORTED) << mncl_status_string(st) << ": " << mncl_last_error();
    EXPECT_NE(std::strstr(mncl_last_error(), "could not progress together"), nullptr)
        << mncl_last_error();
    // Host buffers in one batch work, and so does one device op per batch, posted in an order
    // that cannot deadlock (even ranks send first); the refused batch consumed nothing.
    std::vector<int32_t> host_out = rightward(g_rank, 0), host_in(n);
    const mncl_p2p_op_t host_ops[] = {
        mncl_p2p_op(MNCL_P2P_RECV, host_in.data(), n, MNCL_INT32, prev),
        mncl_p2p_op(MNCL_P2P_SEND, host_out.data(), n, MNCL_INT32, next)};
    MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, host_ops, 2, nullptr));
    EXPECT_EQ(host_in, rightward(prev, 0)) << "host batch: from the previous rank";
    const int first = g_rank % 2 == 0 ? 2 : 0;  // ops[2] sends to next, ops[0] receives
    MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, &ops[first], 1, nullptr));
    MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, &ops[2 - first], 1, nullptr));
    EXPECT_EQ(from_prev.get(), rightward(prev, 0)) << "one device op per batch";
    return;
  }
  MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, ops, 4, nullptr));
  EXPECT_EQ(from_prev.get(), rightward(prev, 0)) << "batch: from the previous rank";
  EXPECT_EQ(from_next.get(), leftward(next, 0)) << "batch: from the next rank";

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  {  // mncl_sendrecv on a stream: float64, the other way round
    const size_t k = 4099;
    Dev<double> out(values<double>(g_rank, k)), in(k);
    MNCL_OK_OR_DIE(
        mncl_sendrecv(g_comm, out.ptr(), k, prev, in.ptr(), k, next, MNCL_FLOAT64, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(in.get(), values<double>(next, k)) << "sendrecv from the next rank";
  }
  {  // mncl_isendrecv_batch, waited
    Dev<int32_t> p(n), q(m);
    mncl_p2p_op_t again[4];
    std::copy(ops, ops + 4, again);
    again[0].buf = p.ptr();
    again[1].buf = q.ptr();
    mncl_request_t r = nullptr;
    MNCL_OK_OR_DIE(mncl_isendrecv_batch(g_comm, again, 4, stream, &r));
    MNCL_OK_OR_DIE(mncl_wait(r, -1));
    EXPECT_EQ(p.get(), rightward(prev, 0)) << "isendrecv_batch: from the previous rank";
    EXPECT_EQ(q.get(), leftward(next, 0)) << "isendrecv_batch: from the next rank";
  }

  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  if (!nccl) {
    mncl_status_t st = mncl_sendrecv_batch(g_comm, ops, 4, stream);
    EXPECT_EQ(st, MNCL_ERR_NOT_SUPPORTED) << mncl_status_string(st) << ": " << mncl_last_error();
    EXPECT_NE(std::strstr(mncl_last_error(), "capturing a CUDA graph"), nullptr)
        << mncl_last_error();
    st = mncl_sendrecv(g_comm, from_prev.ptr(), n, prev, back.ptr(), n, next, MNCL_INT32, stream);
    EXPECT_EQ(st, MNCL_ERR_NOT_SUPPORTED) << mncl_status_string(st) << ": " << mncl_last_error();
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the refusal broke the capture";
    if (graph != nullptr) cudaGraphDestroy(graph);
    CUDA_OK(cudaStreamDestroy(stream));
    // Nothing of the refused calls ran: the next batch pairs up as before.
    to_next.set(rightward(g_rank, 7));
    MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, ops, 4, nullptr));
    EXPECT_EQ(from_prev.get(), rightward(prev, 7)) << "batch after the refusals";
    return;
  }
  // Host memory cannot be captured: refused on every rank, and the capture lives on.
  std::vector<int32_t> host(m);
  mncl_p2p_op_t with_host[4];
  std::copy(ops, ops + 4, with_host);
  with_host[1].buf = host.data();
  mncl_status_t st = mncl_sendrecv_batch(g_comm, with_host, 4, stream);
  EXPECT_EQ(st, MNCL_ERR_NOT_SUPPORTED) << mncl_status_string(st) << ": " << mncl_last_error();
  // Recorded: the batch, then what it received sent back the other way round.
  MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, ops, 4, stream));
  mncl_request_t r = nullptr;
  MNCL_OK_OR_DIE(mncl_isendrecv(g_comm, from_prev.ptr(), n, prev, back.ptr(), n, next, MNCL_INT32,
                                stream, &r));
  MNCL_OK_OR_DIE(mncl_wait(r, -1));  // done at once: it runs on each launch
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the capture was invalidated";
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int launch = 0; launch < 3; ++launch) {
    const int32_t shift = 1000 * (launch + 1);
    to_next.set(rightward(g_rank, shift));
    to_prev.set(leftward(g_rank, shift));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(from_prev.get(), rightward(prev, shift)) << "launch " << launch;
    EXPECT_EQ(from_next.get(), leftward(next, shift)) << "launch " << launch;
    // The next rank received this rank's message to it and sent it back.
    EXPECT_EQ(back.get(), rightward(g_rank, shift)) << "launch " << launch << ": sent back";
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  // The communicator is still in step on every rank.
  to_next.set(rightward(g_rank, 5));
  MNCL_OK_OR_DIE(mncl_sendrecv_batch(g_comm, ops, 4, nullptr));
  EXPECT_EQ(from_prev.get(), rightward(prev, 5)) << "batch after the graph";
}

TEST(Gpu, DeadPeerIsAnErrorNotAHang) {
  if (!dead_peer_mode()) GTEST_SKIP() << "set MNCL_GPU_TEST_DEAD_PEER=1 (tests/gpu/run.sh)";
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  // Rank 1 leaves (without a word to MNCL) only once rank 0 is past mncl_comm_create: rank 0
  // sends it one element, which rank 1 waits for on the GPU. Leaving at once sometimes ended
  // rank 0's NCCL init instead ("remote process exited" from mncl_comm_create; once in CI).
  Dev<int32_t> word(1);
  if (g_rank == 0) MNCL_OK_OR_DIE(mncl_send(g_comm, word.ptr(), 1, MNCL_INT32, 1, nullptr));
  if (g_rank == 1) {
    MNCL_OK_OR_DIE(mncl_recv(g_comm, word.ptr(), 1, MNCL_INT32, 0, nullptr));
    word.get();  // synchronizes the device: the element arrived
    std::_Exit(0);
  }
  if (g_rank != 0) return;
  Dev<float> x(1 << 20);
  const auto start = std::chrono::steady_clock::now();
  mncl_request_t r = nullptr;
  mncl_status_t st =
      mncl_iallreduce(g_comm, x.ptr(), x.ptr(), 1 << 20, MNCL_FLOAT32, MNCL_SUM, nullptr, &r);
  if (st == MNCL_OK) st = mncl_wait(r, -1);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(st, MNCL_OK);
  std::printf("dead peer: %s after %.1f s: %s\n", mncl_status_string(st), s, mncl_last_error());
  std::fflush(stdout);
  std::_Exit(st != MNCL_OK ? 0 : 1);  // the comm is broken: no collective destroy
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    // ctest marks this skipped (SKIP_REGULAR_EXPRESSION); every rank decides alike.
    std::printf("[  SKIPPED ] no CUDA device (cudaGetDeviceCount: %s)\n",
                e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    return 0;
  }
  const char *local = std::getenv("MNCL_LOCAL_RANK");
  CUDA_OK(cudaSetDevice((local ? std::atoi(local) : 0) % count));
  MNCL_OK_OR_DIE(mncl_comm_create(nullptr, &g_comm));
  MNCL_OK_OR_DIE(mncl_comm_rank(g_comm, &g_rank));
  MNCL_OK_OR_DIE(mncl_comm_size(g_comm, &g_size));
  const char *backend = "";
  mncl_comm_backend(g_comm, &backend);
  if (g_rank == 0) std::printf("backend %s, %d ranks, %d GPUs\n", backend, g_size, count);
  // MNCL_BACKEND=auto runs: the backend the topology and MNCL_MEMORY should have chosen.
  const char *expect = std::getenv("MNCL_GPU_TEST_EXPECT_BACKEND");
  if (expect != nullptr && std::strcmp(expect, backend) != 0) {
    std::fprintf(stderr, "rank %d: backend %s chosen, %s expected\n", g_rank, backend, expect);
    return 1;
  }
  if (g_rank != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  MNCL_OK_OR_DIE(mncl_comm_destroy(g_comm));
  if (failed) std::fprintf(stderr, "rank %d: FAILED\n", g_rank);
  return failed;
}

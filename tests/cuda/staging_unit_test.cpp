// White-box tests of the core's CUDA staging path (sdk/cuda) against the fake driver
// (fake_cuda.h), one process, no GPU: pointer classification, what is copied and when, the
// in-place forms, contexts, pinned-buffer reuse and CUDA failures. The host collective is a
// lambda standing in for the backend. Tests run in file order: the first one needs the fake
// driver not to be loaded yet.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/coll.h"  // plugin kit
#include "common/error.h"
#include "cuda/driver.h"
#include "cuda/staging.h"
#include "fake_cuda.h"

namespace {

using mncl::cuda::Staging;
using mncl::cuda::StagingPool;

// The fake's test controls, resolved from the library the core is pointed at.
struct Fake {
  void *handle = nullptr;
  int (*init)() = nullptr;
  void *(*malloc)(size_t, int, int) = nullptr;
  void (*free)(void *) = nullptr;
  void (*write)(void *, const void *, size_t) = nullptr;
  void (*read)(void *, const void *, size_t) = nullptr;
  void *(*stream)() = nullptr;
  void (*counters)(fake_cuda_counters_t *) = nullptr;
  void (*reset)() = nullptr;
  void (*fail_next)(const char *) = nullptr;
  void (*fail_after)(const char *, int) = nullptr;
  void (*hold)(void *, int) = nullptr;

  void load() {
    const char *path = std::getenv("MNCL_CUDA_LIBRARY");
    ASSERT_NE(path, nullptr) << "run with MNCL_CUDA_LIBRARY=<path of libmncl-fake-cuda.so>";
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle, nullptr) << dlerror();
    auto sym = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      ASSERT_NE(fn, nullptr) << name;
    };
    sym(init, "fake_cuda_init");
    sym(malloc, "fake_cuda_malloc");
    sym(free, "fake_cuda_free");
    sym(write, "fake_cuda_write");
    sym(read, "fake_cuda_read");
    sym(stream, "fake_cuda_stream_create");
    sym(counters, "fake_cuda_get_counters");
    sym(reset, "fake_cuda_reset_counters");
    sym(fail_next, "fake_cuda_fail_next");
    sym(fail_after, "fake_cuda_fail_after");
    sym(hold, "fake_cuda_hold_stream");
  }
  fake_cuda_counters_t get() const {
    fake_cuda_counters_t c{};
    counters(&c);
    return c;
  }
};
Fake g_fake;

// Fake device memory holding ints.
struct DevInts {
  int *ptr;
  size_t n;
  explicit DevInts(size_t count, int first = 0, bool managed = false) : n(count) {
    ptr = static_cast<int *>(g_fake.malloc(count * sizeof(int), 0, managed ? 1 : 0));
    std::vector<int> v(count);
    std::iota(v.begin(), v.end(), first);
    g_fake.write(ptr, v.data(), count * sizeof(int));
  }
  ~DevInts() { g_fake.free(ptr); }
  std::vector<int> get(size_t offset = 0, size_t count = SIZE_MAX) const {
    if (count == SIZE_MAX) count = n - offset;
    std::vector<int> v(count);
    g_fake.read(v.data(), ptr + offset, count * sizeof(int));
    return v;
  }
};

std::vector<int> range(size_t n, int first) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

mncl_coll_v1_t coll(int kind, const void *send, void *recv, size_t count, int root = -1) {
  return mncl::kit::make_coll(kind, MNCL_INT32, MNCL_SUM, root, send, recv, count);
}

// What bounds the waits on the caller's stream in the tests that do not test them.
const Staging::WaitBounds kBounds{60000, nullptr, "mncl_test #1"};

const int *ints(const void *p) {
  return static_cast<const int *>(p);
}
int *ints(void *p) {
  return static_cast<int *>(p);
}

class StagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_fake.handle == nullptr) g_fake.load();
    g_fake.init();
    g_fake.reset();
  }
  void TearDown() override { EXPECT_EQ(g_fake.get().ctx_depth, 0) << "a context was left pushed"; }
};

// Must run first: no driver in the process means no device pointer, and nothing is loaded.
TEST(StagingBeforeCuda, NothingIsDeviceMemoryAndNothingIsLoaded) {
  std::vector<int> host(4);
  EXPECT_FALSE(mncl::cuda::is_device_pointer(host.data()));
  const char *path = std::getenv("MNCL_CUDA_LIBRARY");
  ASSERT_NE(path, nullptr);
  EXPECT_EQ(dlopen(path, RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "the core loaded the CUDA driver into a process that had not";
  Staging staging(0, 1, "test");
  auto c = coll(MNCL_COLL_ALLREDUCE, host.data(), host.data(), 4);
  EXPECT_FALSE(staging.needed(c));
}

TEST(StagingBeforeInit, LoadedButUninitializedDriverMeansHostMemory) {
  g_fake.load();
  void *dev = g_fake.malloc(64, 0, 0);  // allocations exist only after cuInit really, but the
  EXPECT_FALSE(mncl::cuda::is_device_pointer(dev));  // driver answers NOT_INITIALIZED anyway
  g_fake.init();
  EXPECT_TRUE(mncl::cuda::is_device_pointer(dev));
  g_fake.free(dev);
}

TEST_F(StagingTest, ClassifiesPointers) {
  DevInts dev(8), managed(8, 0, true);
  std::vector<int> host(8);
  EXPECT_TRUE(mncl::cuda::is_device_pointer(dev.ptr));
  EXPECT_TRUE(mncl::cuda::is_device_pointer(dev.ptr + 7));  // inside the allocation
  EXPECT_TRUE(mncl::cuda::is_device_pointer(managed.ptr));  // staged: not stream-ordered
  EXPECT_FALSE(mncl::cuda::is_device_pointer(host.data()));
  EXPECT_FALSE(mncl::cuda::is_device_pointer(nullptr));
}

TEST_F(StagingTest, NeededOnlyForDeviceBuffersThisRankTouches) {
  Staging staging(1, 2, "test");
  DevInts dev(4);
  std::vector<int> host(8);
  EXPECT_FALSE(staging.needed(coll(MNCL_COLL_ALLREDUCE, host.data(), host.data(), 4)));
  EXPECT_TRUE(staging.needed(coll(MNCL_COLL_ALLREDUCE, host.data(), dev.ptr, 4)));
  EXPECT_FALSE(staging.needed(coll(MNCL_COLL_ALLREDUCE, dev.ptr, dev.ptr, 0)));  // count 0
  // reduce on a non-root: recvbuf is ignored, so a device pointer there needs nothing.
  EXPECT_FALSE(staging.needed(coll(MNCL_COLL_REDUCE, host.data(), dev.ptr, 4, 0)));
  EXPECT_FALSE(staging.needed(coll(MNCL_COLL_BARRIER, nullptr, nullptr, 0)));
}

TEST_F(StagingTest, AllreduceOutOfPlaceCopiesInThenOutOnTheCallersStream) {
  Staging staging(0, 1, "test");
  DevInts send(100, 1), recv(100, -1);
  void *stream = g_fake.stream();
  auto c = coll(MNCL_COLL_ALLREDUCE, send.ptr, recv.ptr, 100);
  c.stream = stream;
  bool ran = false;
  staging.run(
      c,
      [&](const mncl_coll_v1_t &h) {
        ran = true;
        EXPECT_FALSE(mncl::cuda::is_device_pointer(h.sendbuf));
        EXPECT_FALSE(mncl::cuda::is_device_pointer(h.recvbuf));
        EXPECT_NE(h.sendbuf, h.recvbuf);
        EXPECT_EQ(h.stream, stream);
        // The input has landed (the fake only copies when a query finds this stream done).
        EXPECT_EQ(std::vector<int>(ints(h.sendbuf), ints(h.sendbuf) + 100), range(100, 1));
        for (int i = 0; i < 100; ++i) ints(h.recvbuf)[i] = ints(h.sendbuf)[i] * 2;
      },
      kBounds);
  EXPECT_TRUE(ran);
  const auto r = recv.get();
  for (int i = 0; i < 100; ++i) ASSERT_EQ(r[i], 2 * (i + 1));
  const auto k = g_fake.get();
  EXPECT_EQ(k.d2h_copies, 1u);
  EXPECT_EQ(k.h2d_copies, 1u);
  EXPECT_EQ(k.syncs, 2u);
  EXPECT_EQ(k.host_allocs, 1u);
}

TEST_F(StagingTest, InPlaceFormsStayInPlace) {
  const int rank = 1, size = 3;
  Staging staging(rank, size, "test");
  const size_t n = 5;
  struct Case {
    int kind;
    size_t send_offset, recv_offset, total;  // in elements, within one allocation
    int root;
  };
  const Case cases[] = {
      {MNCL_COLL_ALLREDUCE, 0, 0, n, -1},
      {MNCL_COLL_ALLGATHER, rank * n, 0, size * n, -1},
      {MNCL_COLL_REDUCE_SCATTER, 0, rank * n, size * n, -1},
      {MNCL_COLL_ALLTOALL, 0, 0, size * n, -1},
      {MNCL_COLL_SCATTER, 0, rank * n, size * n, rank},
      {MNCL_COLL_GATHER, rank * n, 0, size * n, rank},
      {MNCL_COLL_REDUCE, 0, 0, n, rank},
      {MNCL_COLL_BCAST, 0, 0, n, rank},
  };
  for (const Case &k : cases) {
    SCOPED_TRACE(k.kind);
    DevInts buf(k.total, 100);
    auto c = coll(k.kind, buf.ptr + k.send_offset, buf.ptr + k.recv_offset, n, k.root);
    staging.run(
        c,
        [&](const mncl_coll_v1_t &h) {
          EXPECT_FALSE(mncl::cuda::is_device_pointer(h.sendbuf));
          EXPECT_EQ(ints(h.sendbuf) - ints(h.recvbuf),
                    static_cast<ptrdiff_t>(k.send_offset) - static_cast<ptrdiff_t>(k.recv_offset));
        },
        kBounds);
  }
}

TEST_F(StagingTest, InPlaceAllgatherKeepsOwnBlockAndReturnsAll) {
  const int rank = 2, size = 4;
  const size_t n = 3;
  Staging staging(rank, size, "test");
  DevInts buf(size * n, 0);
  auto c = coll(MNCL_COLL_ALLGATHER, buf.ptr + rank * n, buf.ptr, n);
  staging.run(
      c,
      [&](const mncl_coll_v1_t &h) {
        for (size_t i = 0; i < n; ++i)
          EXPECT_EQ(ints(h.sendbuf)[i], static_cast<int>(rank * n + i));
        for (size_t i = 0; i < size * n; ++i) {
          if (i / n != static_cast<size_t>(rank)) ints(h.recvbuf)[i] = 1000 + static_cast<int>(i);
        }
      },
      kBounds);
  const auto r = buf.get();
  for (size_t i = 0; i < size * n; ++i) {
    EXPECT_EQ(r[i], i / n == static_cast<size_t>(rank) ? static_cast<int>(i)
                                                       : 1000 + static_cast<int>(i));
  }
  EXPECT_EQ(g_fake.get().d2h_copies, 1u);  // only the own block goes in
}

TEST_F(StagingTest, BcastCopiesOnlyTheWayDataFlows) {
  DevInts buf(16, 7);
  {
    Staging root(0, 2, "test");
    root.run(
        coll(MNCL_COLL_BCAST, buf.ptr, buf.ptr, 16, 0),
        [&](const mncl_coll_v1_t &h) {
          EXPECT_EQ(h.sendbuf, h.recvbuf);
          EXPECT_EQ(ints(h.recvbuf)[0], 7);
        },
        kBounds);
  }
  auto k = g_fake.get();
  EXPECT_EQ(k.d2h_copies, 1u);
  EXPECT_EQ(k.h2d_copies, 0u);
  g_fake.reset();
  {
    Staging other(1, 2, "test");
    other.run(
        coll(MNCL_COLL_BCAST, buf.ptr, buf.ptr, 16, 0),
        [&](const mncl_coll_v1_t &h) {
          for (int i = 0; i < 16; ++i) ints(h.recvbuf)[i] = 42;
        },
        kBounds);
  }
  k = g_fake.get();
  EXPECT_EQ(k.d2h_copies, 0u);
  EXPECT_EQ(k.h2d_copies, 1u);
  EXPECT_EQ(k.syncs, 1u);
  EXPECT_EQ(buf.get(), std::vector<int>(16, 42));
}

TEST_F(StagingTest, MixedHostAndDeviceOnlyStagesTheDeviceSide) {
  Staging staging(0, 1, "test");
  DevInts send(8, 3);
  std::vector<int> recv(8, 0);
  staging.run(
      coll(MNCL_COLL_ALLREDUCE, send.ptr, recv.data(), 8),
      [&](const mncl_coll_v1_t &h) {
        EXPECT_EQ(h.recvbuf, recv.data());  // host buffers pass through untouched
        std::memcpy(h.recvbuf, h.sendbuf, 8 * sizeof(int));
      },
      kBounds);
  EXPECT_EQ(recv, range(8, 3));
  EXPECT_EQ(g_fake.get().h2d_copies, 0u);
}

TEST_F(StagingTest, PointToPointAndIgnoredBuffers) {
  Staging staging(1, 2, "test");
  DevInts buf(4, 9);
  staging.run(
      coll(MNCL_COLL_SEND, buf.ptr, nullptr, 4, 0),
      [&](const mncl_coll_v1_t &h) {
        EXPECT_EQ(ints(h.sendbuf)[3], 12);
        EXPECT_EQ(h.recvbuf, nullptr);
      },
      kBounds);
  staging.run(
      coll(MNCL_COLL_RECV, nullptr, buf.ptr, 4, 0),
      [&](const mncl_coll_v1_t &h) {
        for (int i = 0; i < 4; ++i) ints(h.recvbuf)[i] = -i;
      },
      kBounds);
  EXPECT_EQ(buf.get(), (std::vector<int>{0, -1, -2, -3}));
  // Non-root reduce: the device recvbuf is ignored and handed through as is.
  staging.run(
      coll(MNCL_COLL_REDUCE, buf.ptr, buf.ptr + 2, 2, 0),
      [&](const mncl_coll_v1_t &h) { EXPECT_EQ(h.recvbuf, buf.ptr + 2); }, kBounds);
}

TEST_F(StagingTest, CoalescedStagesEachDeviceBuffer) {
  Staging staging(0, 1, "test");
  DevInts a(3, 1), b(5, 10);
  std::vector<int> host_send = range(2, 50), host_recv(2);
  const void *sends[] = {a.ptr, b.ptr, host_send.data()};
  void *recvs[] = {a.ptr, b.ptr, host_recv.data()};  // first two in place
  const size_t counts[] = {3, 5, 2};
  auto c = coll(MNCL_COLL_ALLREDUCE_COALESCED, nullptr, nullptr, 0);
  c.nbufs = 3;
  c.sendbufs = sends;
  c.recvbufs = recvs;
  c.counts = counts;
  staging.run(
      c,
      [&](const mncl_coll_v1_t &h) {
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_FALSE(mncl::cuda::is_device_pointer(h.sendbufs[i]));
          if (i < 2) {
            EXPECT_EQ(h.sendbufs[i], h.recvbufs[i]);
          }
          for (size_t j = 0; j < counts[i]; ++j) {
            ints(h.recvbufs[i])[j] = ints(h.sendbufs[i])[j] + 1;
          }
        }
      },
      kBounds);
  EXPECT_EQ(sends[0], a.ptr);  // the caller's arrays are not modified
  EXPECT_EQ(a.get(), range(3, 2));
  EXPECT_EQ(b.get(), range(5, 11));
  EXPECT_EQ(host_recv, range(2, 51));
}

TEST_F(StagingTest, PinnedBufferIsReusedAndFreed) {
  {
    // A Staging, and a pool whose calls come in turn: one buffer each, reused.
    Staging staging(0, 1, "test");
    StagingPool pool(0, 1, "test");
    DevInts buf(1000);
    for (int i = 0; i < 3; ++i) {
      staging.run(
          coll(MNCL_COLL_ALLREDUCE, buf.ptr, buf.ptr, 1000), [](const mncl_coll_v1_t &) {},
          kBounds);
      pool.run(
          coll(MNCL_COLL_ALLREDUCE, buf.ptr, buf.ptr, 1000), [](const mncl_coll_v1_t &) {},
          kBounds);
    }
    EXPECT_EQ(g_fake.get().host_allocs, 2u);
    EXPECT_GE(staging.pinned_bytes(), 4000u);
    EXPECT_EQ(pool.idle_count(), 1u);
    EXPECT_GE(pool.idle_pinned_bytes(), 4000u);
  }
  EXPECT_EQ(g_fake.get().host_frees, 2u);
}

TEST_F(StagingTest, CudaFailureIsAnErrorNamingTheCall) {
  Staging staging(0, 1, "test");
  DevInts buf(10);
  g_fake.fail_next("cuMemcpyDtoHAsync_v2");
  bool ran = false;
  try {
    staging.run(
        coll(MNCL_COLL_ALLREDUCE, buf.ptr, buf.ptr, 10),
        [&](const mncl_coll_v1_t &) { ran = true; }, kBounds);
    FAIL() << "no error";
  } catch (const mncl::Error &e) {
    EXPECT_EQ(e.status(), MNCL_ERR_SYSTEM);
    EXPECT_NE(std::string(e.what()).find("cuMemcpyDtoHAsync"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_LAUNCH_FAILED"), std::string::npos);
  }
  EXPECT_FALSE(ran);
}

// A copy that fails after others were queued: they are waited for before the error goes up,
// since the pinned buffer they read or write goes back to the pool (and to another lane) then.
TEST_F(StagingTest, CopiesQueuedBeforeAFailedOneAreWaitedFor) {
  Staging staging(0, 1, "test");
  DevInts a(10), b(10);
  const void *sends[2] = {a.ptr, b.ptr};
  void *recvs[2] = {a.ptr, b.ptr};
  const size_t counts[2] = {10, 10};
  mncl_coll_v1_t c = coll(MNCL_COLL_ALLREDUCE_COALESCED, nullptr, nullptr, 0);
  c.sendbufs = sends;
  c.recvbufs = recvs;
  c.counts = counts;
  c.nbufs = 2;
  for (const char *copy : {"cuMemcpyDtoHAsync_v2", "cuMemcpyHtoDAsync_v2"}) {
    SCOPED_TRACE(copy);
    g_fake.reset();
    g_fake.fail_after(copy, 1);  // the second copy of that kind fails
    EXPECT_THROW(staging.run(
                     c, [](const mncl_coll_v1_t &) {}, kBounds),
                 mncl::Error);
    // Every copy in (and, for a failure on the way out, every one out) was followed by a sync.
    const bool out = std::string(copy) == "cuMemcpyHtoDAsync_v2";
    EXPECT_EQ(g_fake.get().syncs, out ? 2u : 1u) << "the queued copy was not waited for";
  }
}

// Waits on a stream whose work never finishes (the fake's held stream): an allreduce of 10
// ints in place on its own stream.
class StuckStreamTest : public StagingTest {
 protected:
  void SetUp() override {
    StagingTest::SetUp();
    c.stream = g_fake.stream();
  }
  void TearDown() override {
    g_fake.hold(c.stream, 0);
    // The stream moved again: what the test abandoned is freed, before later tests count.
    EXPECT_EQ(mncl::cuda::free_abandoned_pinned(), 0u);
    StagingTest::TearDown();
  }
  Staging staging{0, 1, "test"};
  DevInts buf{10};
  mncl_coll_v1_t c = coll(MNCL_COLL_ALLREDUCE, buf.ptr, buf.ptr, 10);

  // Runs c through the staging with `bounds`, which must fail with `status` and a message
  // containing `text`; returns the message.
  std::string expect_failure(
      const Staging::WaitBounds &bounds, mncl_status_t status, const std::string &text,
      const Staging::HostRun &host_run = [](const mncl_coll_v1_t &) {}) {
    try {
      staging.run(c, host_run, bounds);
    } catch (const mncl::Error &e) {
      EXPECT_EQ(e.status(), status) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }
};

// Work on the caller's stream that never finishes (a hung kernel before the call): the wait is
// bounded by the operation's timeout, and the pinned buffer, which the copies still queued
// behind that work will write, is abandoned rather than reused or freed.
TEST_F(StuckStreamTest, TimesOutAndItsPinnedBufferIsAbandoned) {
  g_fake.hold(c.stream, 1);
  bool ran = false;
  const std::string what =
      expect_failure(Staging::WaitBounds{200, nullptr, "mncl_allreduce #7"}, MNCL_ERR_TIMEOUT,
                     "did not finish the work queued on it before the call",
                     [&](const mncl_coll_v1_t &) { ran = true; });
  EXPECT_NE(what.find("mncl_allreduce #7 on test"), std::string::npos) << what;
  EXPECT_NE(what.find("timeout of 0.2 s"), std::string::npos) << what;
  EXPECT_FALSE(ran);
  EXPECT_GT(g_fake.get().queries, 1u) << "the stream was not polled";
  EXPECT_EQ(staging.pinned_bytes(), 0u);
  EXPECT_EQ(g_fake.get().host_frees, 0u) << "a buffer that queued copies still use was freed";
  // Once the stream moves again the next call stages through a new buffer.
  g_fake.hold(c.stream, 0);
  staging.run(
      c, [&](const mncl_coll_v1_t &h) { ints(h.recvbuf)[0] = 42; }, kBounds);
  EXPECT_EQ(buf.get(0, 1), std::vector<int>{42});
  EXPECT_EQ(g_fake.get().host_allocs, 2u);
}

// The abandoned buffer is freed once the copies queued before its marker are done, by a later
// staged call: not while the stream is still stuck.
TEST_F(StuckStreamTest, AnAbandonedBufferIsFreedOnceItsCopiesAreDone) {
  g_fake.hold(c.stream, 1);
  EXPECT_THROW(staging.run(
                   c, [](const mncl_coll_v1_t &) {},
                   Staging::WaitBounds{100, nullptr, "mncl_allreduce #10"}),
               mncl::Error);
  EXPECT_EQ(g_fake.get().events, 1) << "no marker after the abandoned buffer's copies";
  mncl_coll_v1_t elsewhere = c;
  elsewhere.stream = g_fake.stream();
  Staging other{0, 1, "test"};
  other.run(
      elsewhere, [](const mncl_coll_v1_t &) {}, kBounds);
  EXPECT_EQ(g_fake.get().host_frees, 0u) << "freed while copies on the stuck stream may use it";
  g_fake.hold(c.stream, 0);
  other.run(
      elsewhere, [](const mncl_coll_v1_t &) {}, kBounds);
  EXPECT_EQ(g_fake.get().host_frees, 1u);
  EXPECT_EQ(g_fake.get().events, 0);
}

// The inputs wait for a marker on the caller's stream (a queued cudaStreamPerThread call): up
// to the timeout while that stream is stuck, and a CUDA error there is reported as one at once,
// not as work that never ends.
TEST_F(StuckStreamTest, InputsWaitForTheCallersMarker) {
  StagingPool pool(0, 1, "test");
  g_fake.hold(c.stream, 1);
  void *marker = pool.mark_stream(c);
  ASSERT_NE(marker, nullptr);
  Staging::WaitBounds bounds{200, nullptr, "mncl_allreduce #11"};
  bounds.inputs_ready = marker;
  bool ran = false;
  const auto run = [&](const mncl_coll_v1_t &) { ran = true; };
  expect_failure(bounds, MNCL_ERR_TIMEOUT, "the work queued on the caller's stream before the call",
                 run);
  g_fake.fail_next("cuEventQuery");
  bounds.timeout_ms = 600000;
  expect_failure(bounds, MNCL_ERR_SYSTEM, "cuEventQuery failed", run);
  EXPECT_FALSE(ran);
  g_fake.hold(c.stream, 0);
  staging.run(
      c, [&](const mncl_coll_v1_t &) { ran = true; }, bounds);
  EXPECT_TRUE(ran);
  mncl::cuda::Driver::get().drop_mark(marker);
}

TEST_F(StuckStreamTest, ResultCopiesThatNeverFinishTimeOut) {
  expect_failure(Staging::WaitBounds{200, nullptr, "mncl_allreduce #8"}, MNCL_ERR_TIMEOUT,
                 "the copies of the results to device memory", [&](const mncl_coll_v1_t &h) {
                   ints(h.recvbuf)[0] = 42;
                   g_fake.hold(c.stream, 1);  // something queued there meanwhile hangs
                 });
  EXPECT_EQ(staging.pinned_bytes(), 0u);
  EXPECT_EQ(buf.get(0, 1), std::vector<int>{0}) << "the result copy had not happened";
}

// The communicator's abort ends the wait at once, whatever is left of the timeout.
TEST_F(StuckStreamTest, AnAbortEndsTheWait) {
  g_fake.hold(c.stream, 1);
  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    aborted.store(true);
  });
  expect_failure(Staging::WaitBounds{600000, &aborted, "mncl_allreduce #9"}, MNCL_ERR_ABORTED,
                 "was aborted while CUDA staging waited");
  aborter.join();
  EXPECT_EQ(staging.pinned_bytes(), 0u);
}

TEST_F(StagingTest, BackendFailurePropagatesUnchanged) {
  Staging staging(0, 1, "test");
  DevInts buf(10);
  EXPECT_THROW(
      staging.run(
          coll(MNCL_COLL_ALLREDUCE, buf.ptr, buf.ptr, 10),
          [](const mncl_coll_v1_t &) { throw mncl::Error(MNCL_ERR_REMOTE, "peer 1 went away"); },
          kBounds),
      mncl::Error);
  EXPECT_EQ(g_fake.get().h2d_copies, 0u);
}

TEST_F(StagingTest, PoolKeepsTheLargestFewAfterConcurrentCalls) {
  // Six lanes stage at once (all inside host_run together), each a different size: six pinned
  // buffers exist meanwhile; afterwards only kKeptIdle remain, the largest ones.
  constexpr int kLanes = 6;
  static_assert(kLanes > static_cast<int>(StagingPool::kKeptIdle));
  auto pool = std::make_unique<StagingPool>(0, 1, "test");
  std::vector<std::unique_ptr<DevInts>> bufs;
  for (int i = 0; i < kLanes; ++i) bufs.push_back(std::make_unique<DevInts>(100000 * (i + 1)));
  std::mutex mutex;
  std::condition_variable cv;
  int inside = 0;
  std::vector<std::thread> lanes;
  for (int i = 0; i < kLanes; ++i) {
    lanes.emplace_back([&, i] {
      pool->run(
          coll(MNCL_COLL_ALLREDUCE, bufs[i]->ptr, bufs[i]->ptr, bufs[i]->n),
          [&](const mncl_coll_v1_t &host) {
            for (size_t k = 0; k < bufs[i]->n; ++k) ints(host.recvbuf)[k] *= 2;
            std::unique_lock<std::mutex> lock(mutex);
            ++inside;
            cv.notify_all();
            // Bounded, so that a pool serializing its callers fails instead of hanging.
            cv.wait_for(lock, std::chrono::seconds(30), [&] { return inside == kLanes; });
          },
          kBounds);
    });
  }
  for (auto &t : lanes) t.join();
  EXPECT_EQ(inside, kLanes);
  for (int i = 0; i < kLanes; ++i) {
    const auto v = bufs[i]->get();
    for (size_t k = 0; k < v.size(); k += 9973) ASSERT_EQ(v[k], 2 * static_cast<int>(k)) << i;
  }
  const auto c = g_fake.get();
  EXPECT_EQ(c.host_allocs, static_cast<uint64_t>(kLanes)) << "one buffer per concurrent call";
  EXPECT_EQ(c.host_allocs - c.host_frees, StagingPool::kKeptIdle);
  EXPECT_EQ(pool->idle_count(), StagingPool::kKeptIdle);
  // The four largest calls were 3..6 x 400000 B.
  EXPECT_GE(pool->idle_pinned_bytes(), (3u + 4u + 5u + 6u) * 400000u);
  pool.reset();
  EXPECT_EQ(g_fake.get().host_frees, static_cast<uint64_t>(kLanes));
}

}  // namespace

// Single-process tests of mncl::PrefetchLoader and the hybrid-parallel grid arithmetic:
// determinism whatever the thread count, every sample once per epoch, the bounded prefetch
// window, and clean shutdown (assembler exceptions, destruction mid-epoch, unwinding callers).
#include "mncl/frontends/prefetch_loader.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "mncl/frontends/hybrid.hpp"

namespace {

using Batch = std::vector<int>;
using Loader = mncl::PrefetchLoader<int, Batch>;

std::vector<int> iota_shard(int n) {
  std::vector<int> shard(n);
  std::iota(shard.begin(), shard.end(), 1000);  // sample value != index, to catch mix-ups
  return shard;
}

void copy_batch(const int *const *samples, std::size_t n, Batch &out) {
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = *samples[i];
}

std::vector<Batch> one_epoch(Loader &loader, uint64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

mncl::PrefetchOptions options(std::size_t batch, int threads, std::size_t depth, uint64_t seed,
                              bool drop_last = true) {
  mncl::PrefetchOptions o;
  o.batch_size = batch;
  o.threads = threads;
  o.depth = depth;
  o.seed = seed;
  o.drop_last = drop_last;
  return o;
}

TEST(PrefetchLoader, DeterministicWhateverTheThreadsAndDepth) {
  const auto shard = iota_shard(103);
  Loader reference(shard, options(8, 0, 1, 42), copy_batch);
  for (int threads : {1, 3, 8}) {
    for (std::size_t depth : {1, 2, 7}) {
      Loader loader(shard, options(8, threads, depth, 42), copy_batch);
      for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
        EXPECT_EQ(one_epoch(loader, epoch), one_epoch(reference, epoch))
            << threads << " threads, depth " << depth << ", epoch " << epoch;
      }
    }
  }
  // Another epoch or another seed reorders; the same (seed, epoch) reproduces.
  EXPECT_NE(one_epoch(reference, 1), one_epoch(reference, 2));
  Loader other_seed(shard, options(8, 2, 2, 43), copy_batch);
  EXPECT_NE(one_epoch(other_seed, 1), one_epoch(reference, 1));
  EXPECT_EQ(reference.epoch_order(5), reference.epoch_order(5));
}

TEST(PrefetchLoader, EverySampleOncePerEpoch) {
  const auto shard = iota_shard(1001);
  for (bool drop_last : {false, true}) {
    Loader loader(shard, options(16, 4, 3, 7, drop_last), copy_batch);
    EXPECT_EQ(loader.batches_per_epoch(), drop_last ? 62u : 63u);
    for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
      const auto batches = one_epoch(loader, epoch);
      ASSERT_EQ(batches.size(), loader.batches_per_epoch());
      std::multiset<int> seen;
      for (const auto &b : batches) {
        if (&b != &batches.back() || drop_last) {
          ASSERT_EQ(b.size(), 16u);
        }
        seen.insert(b.begin(), b.end());
      }
      EXPECT_EQ(seen.size(), drop_last ? 62u * 16u : 1001u);
      EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), seen.size()) << "a duplicate";
      for (int s : seen) ASSERT_TRUE(s >= 1000 && s < 2001) << s;
    }
  }
  // Without shuffling: the shard in order.
  mncl::PrefetchOptions plain = options(10, 2, 2, 0, false);
  plain.shuffle = false;
  Loader in_order(shard, plain, copy_batch);
  const auto batches = one_epoch(in_order, 1);
  EXPECT_EQ(batches.front().front(), 1000);
  EXPECT_EQ(batches.back().back(), 2000);
}

TEST(PrefetchLoader, PrefetchesAtMostDepthAhead) {
  const auto shard = iota_shard(400);
  std::atomic<int> assembled{0};
  const std::size_t depth = 3;
  Loader loader(shard, options(4, 4, depth, 1),
                [&](const int *const *s, std::size_t n, Batch &out) {
                  copy_batch(s, n, out);
                  ++assembled;
                });
  loader.start_epoch(1);
  for (int consumed = 0; consumed < 20; ++consumed) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow consumer
    ASSERT_LE(assembled.load(), consumed + static_cast<int>(depth)) << "after " << consumed;
    ASSERT_TRUE(loader.next().has_value());
  }
}

TEST(PrefetchLoader, AssemblerExceptionReachesTheConsumerInOrder) {
  const auto shard = iota_shard(64);
  for (int threads : {0, 3}) {
    Loader plain(shard, options(4, 0, 1, 3), copy_batch);
    const int poisoned = shard[plain.epoch_order(1)[5 * 4]];  // first sample of batch 5
    Loader failing(shard, options(4, threads, 4, 3),
                   [&](const int *const *s, std::size_t n, Batch &out) {
                     copy_batch(s, n, out);
                     if (out.front() == poisoned) throw std::runtime_error("bad sample");
                   });
    failing.start_epoch(1);
    for (int b = 0; b < 5; ++b) ASSERT_TRUE(failing.next().has_value()) << b;
    try {
      failing.next();
      FAIL() << "batch 5 did not throw";
    } catch (const std::runtime_error &e) {
      EXPECT_STREQ(e.what(), "bad sample");
    }
    EXPECT_TRUE(failing.next().has_value());  // the epoch goes on past the bad batch
    // A fresh epoch (another order) still works, and destruction mid-epoch joins cleanly.
    failing.start_epoch(2);
    EXPECT_EQ(failing.next()->size(), 4u);
  }
}

TEST(PrefetchLoader, ShutsDownMidEpochAndWhileCallerUnwinds) {
  const auto shard = iota_shard(10000);
  // Destroyed with a full window and slow assemblers still running.
  const auto start = std::chrono::steady_clock::now();
  {
    Loader loader(shard, options(8, 4, 16, 1), [](const int *const *s, std::size_t n, Batch &out) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      copy_batch(s, n, out);
    });
    loader.start_epoch(1);
    ASSERT_TRUE(loader.next().has_value());
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0)
      << "the destructor waited for the whole epoch";

  // The training loop throws while batches are queued: the loader is destroyed during
  // unwinding and the exception arrives intact.
  auto train = [&] {
    Loader loader(shard, options(8, 2, 4, 1), copy_batch);
    loader.start_epoch(1);
    for (int step = 0;; ++step) {
      auto batch = loader.next();
      if (step == 3) throw std::out_of_range("loss is NaN");
    }
  };
  EXPECT_THROW(train(), std::out_of_range);

  // Restarting an epoch mid-way drops the old queue and starts the new order from batch 0.
  Loader loader(shard, options(8, 3, 4, 9), copy_batch);
  Loader reference(shard, options(8, 0, 1, 9), copy_batch);
  loader.start_epoch(1);
  for (int i = 0; i < 10; ++i) loader.next();
  loader.start_epoch(2);
  reference.start_epoch(2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(*loader.next(), *reference.next());
}

TEST(PrefetchLoader, RejectsBadOptions) {
  const auto shard = iota_shard(4);
  EXPECT_THROW(Loader(shard, options(0, 1, 1, 0), copy_batch), mncl::InvalidArgument);
  EXPECT_THROW(Loader(shard, options(1, -1, 1, 0), copy_batch), mncl::InvalidArgument);
  Loader loader(shard, options(2, 1, 1, 0), copy_batch);
  EXPECT_THROW(loader.next(), mncl::InvalidArgument);  // no epoch started
}

TEST(Hybrid, GridCoordinatesAndMembers) {
  // 4 ranks = 2 replicas x 2 stages: stages of a replica are neighbours.
  const auto c = mncl::hybrid_coordinates(3, 4, 2);
  EXPECT_EQ(c.replica, 1);
  EXPECT_EQ(c.stage, 1);
  EXPECT_EQ(mncl::data_parallel_members(c), (std::vector<int>{1, 3}));
  EXPECT_EQ(mncl::model_parallel_members(c), (std::vector<int>{2, 3}));
  const auto d = mncl::hybrid_coordinates(4, 6, 3);
  EXPECT_EQ(mncl::data_parallel_members(d), (std::vector<int>{1, 4}));
  EXPECT_EQ(mncl::model_parallel_members(d), (std::vector<int>{3, 4, 5}));
  EXPECT_THROW(mncl::hybrid_coordinates(0, 4, 3), mncl::InvalidArgument);
  EXPECT_THROW(mncl::hybrid_coordinates(4, 4, 2), mncl::InvalidArgument);
}

}  // namespace

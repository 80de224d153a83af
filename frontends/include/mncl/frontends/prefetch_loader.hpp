// A prefetching batch loader over a rank's shard (ChainerMN users pair scatter_dataset with
// MultiprocessIterator; this is the threaded C++ equivalent):
//
//   mncl::PrefetchOptions lo;  lo.batch_size = 64;  lo.threads = 2;  lo.depth = 4;  lo.seed = 1;
//   mncl::PrefetchLoader<Sample, Batch> loader(shard, lo,
//       [](const Sample *const *samples, std::size_t n, Batch &out) { ...assemble... });
//   for (int epoch = 1; ...) {
//     loader.start_epoch(epoch);
//     while (auto batch = loader.next()) train_on(*batch);
//   }
//
//  - Batches are assembled by `threads` background threads, at most `depth` batches ahead of
//    the consumer (bounded memory), and handed out in order.
//  - Every epoch visits each sample of the shard exactly once, in an order that depends only
//    on (seed, epoch) — deterministic whatever the thread count or timing. With drop_last the
//    final partial batch is skipped (its samples come first in another epoch's order).
//  - An exception thrown by the assemble function is rethrown by next() for that batch (the
//    batches before it are still delivered); the loader stays usable for the next epoch.
//  - The destructor (and start_epoch) stop the work in flight and join cleanly, also while an
//    exception unwinds the training loop with batches still queued.
//  - threads = 0 assembles synchronously inside next() (no background threads).
#ifndef MNCL_FRONTENDS_PREFETCH_LOADER_HPP
#define MNCL_FRONTENDS_PREFETCH_LOADER_HPP

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mncl/frontends/dataset.hpp"
#include "mncl/frontends/error.hpp"

namespace mncl {

struct PrefetchOptions {
  std::size_t batch_size = 32;
  int threads = 2;        // background assemblers; 0: assemble in next()
  std::size_t depth = 4;  // batches assembled ahead of the consumer (at least 1)
  bool shuffle = true;
  uint64_t seed = 0;      // with the epoch, fixes the order
  bool drop_last = true;  // skip the final partial batch of an epoch
};

template <class Sample, class Batch>
class PrefetchLoader {
 public:
  // Builds `out` from n samples (n == batch_size except for a final partial batch). Called on
  // the background threads, concurrently for different batches: it must not share mutable
  // state between calls.
  using Assemble = std::function<void(const Sample *const *samples, std::size_t n, Batch &out)>;

  // `shard` must outlive the loader and stay unchanged.
  PrefetchLoader(const std::vector<Sample> &shard, PrefetchOptions options, Assemble assemble)
      : shard_(&shard), options_(options), assemble_(std::move(assemble)) {
    if (options_.batch_size == 0) throw InvalidArgument("PrefetchLoader: batch_size must be > 0");
    if (options_.threads < 0) throw InvalidArgument("PrefetchLoader: threads must be >= 0");
    if (!assemble_) throw InvalidArgument("PrefetchLoader: no assemble function");
    if (options_.depth == 0) options_.depth = 1;
    slots_.resize(options_.depth);
    workers_.reserve(static_cast<std::size_t>(options_.threads));
    for (int t = 0; t < options_.threads; ++t) workers_.emplace_back([this] { work(); });
  }
  PrefetchLoader(const PrefetchLoader &) = delete;
  PrefetchLoader &operator=(const PrefetchLoader &) = delete;
  ~PrefetchLoader() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_ready_.notify_all();
    for (auto &worker : workers_) worker.join();
  }

  std::size_t batches_per_epoch() const noexcept {
    const std::size_t n = shard_->size(), b = options_.batch_size;
    return options_.drop_last ? n / b : (n + b - 1) / b;
  }
  const PrefetchOptions &options() const noexcept { return options_; }

  // The sample order of an epoch: a pure function of (seed, epoch, shard size).
  std::vector<std::size_t> epoch_order(uint64_t epoch) const {
    if (!options_.shuffle) return permutation_identity(shard_->size());
    // splitmix-style mixing so nearby (seed, epoch) pairs give unrelated orders.
    uint64_t z = options_.seed + 0x9e3779b97f4a7c15ull * (epoch + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return permutation(shard_->size(), z ^ (z >> 31));
  }

  // Starts (or restarts) an epoch: drops whatever the previous one had queued.
  void start_epoch(uint64_t epoch) {
    auto order = epoch_order(epoch);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++generation_;  // batches of older epochs still being assembled are discarded
      order_ = std::move(order);
      total_ = batches_per_epoch();
      next_to_assemble_ = 0;
      next_to_deliver_ = 0;
      for (auto &slot : slots_) slot = Slot{};
      started_ = true;
    }
    work_ready_.notify_all();
  }

  // The next batch of the epoch in order, or nullopt once the epoch is done. Rethrows the
  // assemble function's exception for that batch.
  std::optional<Batch> next() {
    const auto begin = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    if (!started_) throw InvalidArgument("PrefetchLoader::next: call start_epoch first");
    if (next_to_deliver_ >= total_) return std::nullopt;
    const std::size_t index = next_to_deliver_;
    Slot result;
    if (workers_.empty()) {
      const auto indices = batch_indices(index);
      lock.unlock();
      result = assemble_slot(indices);
      lock.lock();
    } else {
      Slot &slot = slots_[index % slots_.size()];
      batch_ready_.wait(lock, [&] { return slot.ready && slot.index == index; });
      result = std::move(slot);
      slot = Slot{};
    }
    ++next_to_deliver_;
    lock.unlock();
    work_ready_.notify_all();  // a slot is free again
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (result.error) std::rethrow_exception(result.error);
    return std::move(result.batch);
  }

  // Seconds the consumer spent inside next() (waiting for data) since the last reset.
  double wait_seconds() const noexcept { return wait_seconds_; }
  void reset_wait_seconds() noexcept { wait_seconds_ = 0; }

 private:
  struct Slot {
    bool ready = false;
    std::size_t index = 0;
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  static std::vector<std::size_t> permutation_identity(std::size_t n) {
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    return order;
  }

  // Under the lock: the samples of batch `index` of the current epoch.
  std::vector<std::size_t> batch_indices(std::size_t index) const {
    const std::size_t first = index * options_.batch_size;
    const std::size_t last = std::min(first + options_.batch_size, order_.size());
    return std::vector<std::size_t>(order_.begin() + first, order_.begin() + last);
  }

  Slot assemble_slot(const std::vector<std::size_t> &indices) const {
    Slot slot;
    try {
      std::vector<const Sample *> samples(indices.size());
      for (std::size_t i = 0; i < indices.size(); ++i) samples[i] = &(*shard_)[indices[i]];
      Batch batch{};
      assemble_(samples.data(), samples.size(), batch);
      slot.batch = std::move(batch);
    } catch (...) {
      slot.error = std::current_exception();
    }
    return slot;
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      // Work exists when the epoch has batches left and the window of `depth` has room.
      work_ready_.wait(lock, [&] {
        return stop_ || (started_ && next_to_assemble_ < total_ &&
                         next_to_assemble_ < next_to_deliver_ + slots_.size());
      });
      if (stop_) return;
      const std::size_t index = next_to_assemble_++;
      const uint64_t generation = generation_;
      const auto indices = batch_indices(index);  // copied: start_epoch may replace order_
      lock.unlock();
      Slot slot = assemble_slot(indices);
      lock.lock();
      if (generation != generation_) continue;  // a newer epoch started meanwhile
      slot.ready = true;
      slot.index = index;
      slots_[index % slots_.size()] = std::move(slot);
      batch_ready_.notify_all();
    }
  }

  const std::vector<Sample> *shard_;
  PrefetchOptions options_;
  Assemble assemble_;

  std::mutex mutex_;
  std::condition_variable work_ready_, batch_ready_;
  bool stop_ = false;
  bool started_ = false;
  uint64_t generation_ = 0;
  std::vector<std::size_t> order_;
  std::size_t total_ = 0;
  std::size_t next_to_assemble_ = 0;
  std::size_t next_to_deliver_ = 0;
  std::vector<Slot> slots_;           // batch i lives in slots_[i % depth]
  double wait_seconds_ = 0;           // consumer thread only
  std::vector<std::thread> workers_;  // last: started after everything they use exists
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_PREFETCH_LOADER_HPP

#include "cuda/staging.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "common/buffers.h"  // the plugin kit's, shared with the nccl plugin
#include "common/error.h"
#include "common/log.h"
#include "cuda/driver.h"

namespace mncl::cuda {

namespace {

using Clock = std::chrono::steady_clock;

using kit::for_each_buffer;
using kit::kRecv;
using kit::kSend;

// One device buffer to stage, and where its stand-in lives in the pinned buffer.
struct Slot {
  size_t index;
  const char *dev;
  size_t bytes;
  bool in, out;
  size_t offset = 0;
};

// The host descriptor handed to the backend, with its own coalesced arrays.
struct HostColl {
  mncl_coll_v1_t coll;
  std::vector<const void *> sendbufs;
  std::vector<void *> recvbufs;

  explicit HostColl(const mncl_coll_v1_t &c) : coll(c) {
    if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED && c.nbufs > 0) {
      sendbufs.assign(c.sendbufs, c.sendbufs + c.nbufs);
      recvbufs.assign(c.recvbufs, c.recvbufs + c.nbufs);
      coll.sendbufs = sendbufs.data();
      coll.recvbufs = recvbufs.data();
    }
  }
  void set(size_t index, void *host) {
    if (index == kSend) {
      coll.sendbuf = host;
    } else if (index == kRecv) {
      coll.recvbuf = host;
    } else if (index % 2 == 0) {
      sendbufs[(index - 2) / 2] = host;
    } else {
      recvbufs[(index - 3) / 2] = host;
    }
  }
};

constexpr size_t kAlign = 256;  // each region starts on its own cache lines
size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// Pinned buffers abandoned after a wait on a stuck stream, each with a marker after the copies
// that may still use it: freed once those are done (looked at by later staged calls). Leaked
// on purpose, as the driver: one still in use at exit stays reachable, never freed under it.
struct Abandoned {
  void *pinned;
  size_t bytes;
  void *context;
  int ordinal;
  void *marker;
};
std::mutex &graveyard_mutex() {
  static auto *mutex = new std::mutex;
  return *mutex;
}
std::vector<Abandoned> &graveyard() {
  static auto *buried = new std::vector<Abandoned>;
  return *buried;
}

}  // namespace

size_t free_abandoned_pinned() noexcept {
  std::lock_guard<std::mutex> lock(graveyard_mutex());
  auto &buried = graveyard();
  if (buried.empty()) return 0;
  Driver &driver = Driver::get();
  for (auto it = buried.begin(); it != buried.end();) {
    try {
      Driver::Scope scope(driver, static_cast<CUcontext>(it->context), it->ordinal);
      if (!driver.marked_done(it->marker)) {
        ++it;
        continue;
      }
      driver.drop_mark(it->marker);
      driver.host_free(it->pinned);
      MNCL_INFO(
          "CUDA staging: freed %zu bytes of pinned host memory abandoned earlier: the "
          "copies queued on it are done",
          it->bytes);
      it = buried.erase(it);
    } catch (const std::exception &) {
      ++it;  // no context now: looked at again next time
    }
  }
  return buried.size();
}

bool is_device_pointer(const void *ptr) {
  return Driver::get().classify(ptr).device;
}

Staging::Staging(int rank, int size, std::string backend)
    : rank_(rank), size_(size), backend_(std::move(backend)) {}

Staging::~Staging() {
  if (pinned_ == nullptr) return;
  try {
    Driver &driver = Driver::get();
    Driver::Scope scope(driver, static_cast<CUcontext>(pinned_context_), pinned_ordinal_);
    driver.host_free(pinned_);
  } catch (const std::exception &e) {
    MNCL_WARN("CUDA staging: could not free %zu bytes of pinned memory: %s", capacity_, e.what());
  }
}

bool Staging::needed(const mncl_coll_v1_t &coll) const {
  Driver &driver = Driver::get();
  if (!driver.loaded()) return false;  // one look per call, not one per buffer
  bool device = false;
  for_each_buffer(coll, rank_, size_, [&](size_t, const void *ptr, size_t bytes, bool, bool) {
    if (!device && bytes > 0) device = driver.classify(ptr).device;
  });
  return device;
}

void Staging::reserve(size_t bytes, void *context, int ordinal) {
  if (bytes <= capacity_) return;
  Driver &driver = Driver::get();
  // Grow by half again at least, so a slowly growing size does not reallocate every call.
  const size_t want = align_up(std::max(bytes, capacity_ + capacity_ / 2), size_t{1} << 16);
  if (pinned_ != nullptr) driver.host_free(pinned_);
  pinned_ = nullptr;
  capacity_ = 0;
  pinned_ = driver.host_alloc(want);
  capacity_ = want;
  pinned_context_ = context;
  pinned_ordinal_ = ordinal;
  MNCL_TRACE("CUDA staging: %zu bytes of pinned host memory for backend %s", want,
             backend_.c_str());
}

void Staging::abandon_pinned(void *stream) noexcept {
  if (pinned_ == nullptr) return;
  void *marker = nullptr;
  try {
    Driver &driver = Driver::get();
    Driver::Scope scope(driver, static_cast<CUcontext>(pinned_context_), pinned_ordinal_);
    marker = driver.mark(stream);
  } catch (const std::exception &) {
    marker = nullptr;
  }
  if (marker != nullptr) {
    try {
      std::lock_guard<std::mutex> lock(graveyard_mutex());
      graveyard().push_back({pinned_, capacity_, pinned_context_, pinned_ordinal_, marker});
    } catch (const std::exception &) {
      marker = nullptr;  // out of memory: it stays abandoned
    }
  }
  MNCL_WARN(
      "CUDA staging: %zu bytes of pinned host memory are abandoned: copies still queued on "
      "the caller's stream may use them; %s",
      capacity_,
      marker != nullptr ? "freed once they are done"
                        : "never freed (this CUDA driver gives no event to tell when)");
  pinned_ = nullptr;
  capacity_ = 0;
}

void Staging::wait_for_stream(void *stream, const WaitBounds &bounds, Deadline deadline,
                              const char *pending) {
  switch (Driver::get().synchronize(stream, deadline, bounds.aborted)) {
    case kit::PollResult::kReady:
      return;
    case kit::PollResult::kTimedOut:
      abandon_pinned(stream);
      throw Error(MNCL_ERR_TIMEOUT,
                  format("%s on %s: CUDA staging: the caller's stream (%p) did not finish %s "
                         "within the operation's timeout of %.1f s (is work queued on that "
                         "stream stuck?)",
                         bounds.what.c_str(), backend_.c_str(), stream, pending,
                         static_cast<double>(bounds.timeout_ms) / 1000.0));
    case kit::PollResult::kStopped:
      abandon_pinned(stream);
      throw Error(MNCL_ERR_ABORTED,
                  format("%s on %s: the communicator was aborted while CUDA staging waited "
                         "for the caller's stream (%p) to finish %s",
                         bounds.what.c_str(), backend_.c_str(), stream, pending));
  }
}

// A copy failed after others were queued: they may still read or write the pinned buffer,
// which goes back to the pool (and to another lane) when the call ends. Waits for them, best
// effort (the copy's own error is the one to report), or abandons the buffer.
void Staging::settle_copies(void *stream, const WaitBounds &bounds, Deadline deadline) noexcept {
  try {
    if (Driver::get().synchronize(stream, deadline, bounds.aborted) == kit::PollResult::kReady) {
      return;
    }
  } catch (...) {
  }
  abandon_pinned(stream);
}

void Staging::wait_for_inputs(const WaitBounds &bounds, Deadline deadline) {
  if (bounds.inputs_ready == nullptr) return;
  Driver &driver = Driver::get();
  const auto done = [&] { return driver.marked_done_or_throw(bounds.inputs_ready); };
  switch (kit::poll_until(done, deadline, bounds.aborted)) {
    case kit::PollResult::kReady:
      return;
    case kit::PollResult::kTimedOut:
      throw Error(MNCL_ERR_TIMEOUT,
                  format("%s on %s: CUDA staging: the work queued on the caller's stream before "
                         "the call did not finish within the operation's timeout of %.1f s (is "
                         "work queued on that stream stuck?)",
                         bounds.what.c_str(), backend_.c_str(),
                         static_cast<double>(bounds.timeout_ms) / 1000.0));
    case kit::PollResult::kStopped:
      throw Error(MNCL_ERR_ABORTED,
                  format("%s on %s: the communicator was aborted while CUDA staging waited for "
                         "the work queued on the caller's stream before the call",
                         bounds.what.c_str(), backend_.c_str()));
  }
}

void Staging::run(const mncl_coll_v1_t &coll, const HostRun &host_run, const WaitBounds &bounds) {
  Driver &driver = Driver::get();
  std::vector<Slot> slots;
  PointerInfo first;
  for_each_buffer(coll, rank_, size_,
                  [&](size_t index, const void *ptr, size_t bytes, bool in, bool out) {
                    if (bytes == 0) return;
                    const PointerInfo info = driver.classify(ptr);
                    if (!info.device) return;
                    if (!first.device) first = info;
                    slots.push_back(Slot{index, static_cast<const char *>(ptr), bytes, in, out});
                  });
  if (slots.empty()) {
    host_run(coll);
    return;
  }
  free_abandoned_pinned();
  static std::once_flag logged;
  std::call_once(logged, [&] {
    MNCL_WARN(
        "backend %s does not take CUDA memory: device buffers are staged through pinned "
        "host memory on the caller's stream (slower than a CUDA-aware backend such as "
        "nccl)",
        backend_.c_str());
  });

  // Overlapping buffers (the in-place forms) become one region, so that the backend sees the
  // same aliasing between its host pointers as the caller made between the device ones.
  std::sort(slots.begin(), slots.end(), [](const Slot &a, const Slot &b) { return a.dev < b.dev; });
  size_t total = 0;
  const char *region_dev = nullptr, *region_end = nullptr;
  size_t region_offset = 0;
  for (Slot &s : slots) {
    if (region_dev == nullptr || s.dev >= region_end) {  // starts a new region
      total = align_up(total, kAlign);
      region_dev = s.dev;
      region_end = s.dev;
      region_offset = total;
    }
    s.offset = region_offset + static_cast<size_t>(s.dev - region_dev);
    if (s.dev + s.bytes > region_end) {
      total += static_cast<size_t>(s.dev + s.bytes - region_end);
      region_end = s.dev + s.bytes;
    }
  }

  HostColl host(coll);
  void *stream = coll.stream;
  // One deadline for the whole call: the waits and the backend share the timeout.
  const Deadline deadline = Clock::now() + std::chrono::milliseconds(bounds.timeout_ms);
  {
    Driver::Scope scope(driver, first.context, first.ordinal);
    reserve(total, first.context, first.ordinal);
    wait_for_inputs(bounds, deadline);
    char *pinned = static_cast<char *>(pinned_);
    bool copied = false;
    try {
      for (const Slot &s : slots) {
        host.set(s.index, pinned + s.offset);
        if (s.in) {
          driver.copy_d2h_async(pinned + s.offset, s.dev, s.bytes, stream);
          copied = true;
        }
      }
    } catch (...) {
      if (copied) settle_copies(stream, bounds, deadline);
      throw;
    }
    // The host collective reads the copies: they must have landed.
    if (copied) {
      wait_for_stream(stream, bounds, deadline,
                      "the work queued on it before the call and the copies of the device inputs");
    }
  }
  // The backend gets what is left of the timeout, as a queued operation does.
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  host.coll.timeout_ms = std::max<int64_t>(1, std::min<int64_t>(host.coll.timeout_ms, left));
  host_run(host.coll);
  {
    Driver::Scope scope(driver, first.context, first.ordinal);
    char *pinned = static_cast<char *>(pinned_);
    bool copied = false;
    try {
      for (const Slot &s : slots) {
        if (!s.out) continue;
        driver.copy_h2d_async(const_cast<char *>(s.dev), pinned + s.offset, s.bytes, stream);
        copied = true;
      }
    } catch (...) {
      if (copied) settle_copies(stream, bounds, deadline);
      throw;
    }
    // The result is in device memory when the call returns, and the pinned buffer is free.
    if (copied) {
      wait_for_stream(stream, bounds, deadline, "the copies of the results to device memory");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// StagingPool
// ---------------------------------------------------------------------------------------------

StagingPool::StagingPool(int rank, int size, std::string backend)
    : rank_(rank), size_(size), backend_(std::move(backend)), probe_(rank, size, backend_) {}

bool StagingPool::needed(const mncl_coll_v1_t &coll) const {
  return probe_.needed(coll);
}

void StagingPool::run(const mncl_coll_v1_t &coll, const Staging::HostRun &host_run,
                      const Staging::WaitBounds &bounds) {
  std::unique_ptr<Staging> staging = borrow();
  // Given back however run() ends: its buffer is sound after a failure too.
  struct Return {
    StagingPool &pool;
    std::unique_ptr<Staging> &staging;
    ~Return() { pool.give_back(std::move(staging)); }
  } give_back_on_exit{*this, staging};
  staging->run(coll, host_run, bounds);
}

void *StagingPool::mark_stream(const mncl_coll_v1_t &coll) const noexcept {
  try {
    Driver &driver = Driver::get();
    PointerInfo first;
    for_each_buffer(coll, rank_, size_, [&](size_t, const void *ptr, size_t bytes, bool, bool) {
      if (first.device || bytes == 0) return;
      first = driver.classify(ptr);
    });
    if (!first.device) return nullptr;
    Driver::Scope scope(driver, first.context, first.ordinal);
    return driver.mark(coll.stream);
  } catch (const std::exception &) {
    return nullptr;
  }
}

std::unique_ptr<Staging> StagingPool::borrow() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      auto largest = std::max_element(idle_.begin(), idle_.end(), [](const auto &a, const auto &b) {
        return a->pinned_bytes() < b->pinned_bytes();
      });
      std::unique_ptr<Staging> staging = std::move(*largest);
      idle_.erase(largest);
      return staging;
    }
  }
  return std::make_unique<Staging>(rank_, size_, backend_);
}

void StagingPool::give_back(std::unique_ptr<Staging> staging) {
  std::unique_ptr<Staging> surplus;  // freed outside the lock (cuMemFreeHost may be slow)
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(staging));
  if (idle_.size() > kKeptIdle) {
    auto smallest = std::min_element(idle_.begin(), idle_.end(), [](const auto &a, const auto &b) {
      return a->pinned_bytes() < b->pinned_bytes();
    });
    surplus = std::move(*smallest);
    idle_.erase(smallest);
  }
}

size_t StagingPool::idle_pinned_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto &s : idle_) total += s->pinned_bytes();
  return total;
}

size_t StagingPool::idle_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_.size();
}

}  // namespace mncl::cuda

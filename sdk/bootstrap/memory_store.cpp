#include "bootstrap/memory_store.h"

#include <condition_variable>
#include <map>
#include <mutex>

#include "bootstrap/store_util.h"
#include "common/error.h"

namespace mncl::bootstrap {

namespace {

class MemoryStore final : public Store {
 public:
  void set(const std::string &key, const void *data, size_t len) override {
    const auto *bytes = static_cast<const uint8_t *>(data);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      values_[key] = Bytes(bytes, bytes + len);
    }
    changed_.notify_all();
  }

  Bytes get(const std::string &key, const WaitOptions &opts) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_until_locked(lock, {key}, opts);
    auto it = values_.find(key);
    MNCL_CHECK(it != values_.end(), MNCL_ERR_TIMEOUT, "store key '%s' not set within %.1f s",
               key.c_str(), opts.timeout.count() / 1000.0);
    return it->second;
  }

  int64_t add(const std::string &key, int64_t delta) override {
    int64_t result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Bytes &value = values_[key];
      const int64_t current =
          value.empty() ? 0 : std::stoll(std::string(value.begin(), value.end()));
      result = current + delta;
      const std::string text = std::to_string(result);
      value.assign(text.begin(), text.end());
    }
    changed_.notify_all();
    return result;
  }

  std::vector<std::string> wait(const std::vector<std::string> &keys,
                                const WaitOptions &opts) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_until_locked(lock, keys, opts);
    std::vector<std::string> missing;
    for (const auto &k : keys) {
      if (values_.count(k) == 0) missing.push_back(k);
    }
    return missing;
  }

  size_t erase_prefix(const std::string &prefix) override {
    check_erase_prefix(prefix);
    std::lock_guard<std::mutex> lock(mutex_);
    size_t erased = 0;
    for (auto it = values_.lower_bound(prefix);
         it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++erased) {
      it = values_.erase(it);
    }
    return erased;
  }
  bool erase(const std::string &key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.erase(key) > 0;
  }

  std::string describe() const override { return "memory://"; }

 private:
  // Waits in short slices so a raised abort flag is noticed promptly.
  void wait_until_locked(std::unique_lock<std::mutex> &lock, const std::vector<std::string> &keys,
                         const WaitOptions &opts) {
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    auto all_present = [&] {
      for (const auto &k : keys) {
        if (values_.count(k) == 0) return false;
      }
      return true;
    };
    while (!all_present()) {
      MNCL_CHECK(!(opts.aborted && opts.aborted->load()), MNCL_ERR_ABORTED,
                 "store wait aborted (communicator aborted)");
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return;
      changed_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(
                                  deadline - now, std::chrono::milliseconds(50)));
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
};

}  // namespace

std::shared_ptr<Store> make_memory_store() {
  return std::make_shared<MemoryStore>();
}

}  // namespace mncl::bootstrap

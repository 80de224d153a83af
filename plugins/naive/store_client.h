// The bootstrap store (mncl_store_v1_t) as a small C++ class: std::string keys, values released
// automatically, and failures thrown as kit::Error.
//
// Only the calls whose failure callers want to explain (get and exists, which time out) report a
// status; everything else throws kit::Error(status) and keeps the message the core's store
// callback already set ("connection to the store lost", "aborted").
//
// Values longer than part_bytes (default 256 MiB) travel in parts, because the TCP store takes at
// most 1 GiB per value: the parts first, under "<key>#<i>", then the key itself holding a
// 24-byte manifest (magic, total length, part count). A reader that finds the key therefore finds
// every part, and gets the whole value back; del() removes the parts of a value this client wrote
// or read. Every naive value is either Header-prefixed (put) or a short flag, so none can be
// mistaken for a manifest.
#pragma once

#include <mncl/mncl_plugin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/host.h"

namespace mncl::naive {

// A value fetched from the store. Owns the copy the store made; releases it when destroyed.
class Value {
 public:
  Value() = default;
  Value(const mncl_store_v1_t *store, void *data, size_t size)
      : store_(store), data_(data), size_(size) {}
  // A value assembled from parts: owned here, not by the store.
  explicit Value(std::vector<unsigned char> assembled)
      : owned_(std::move(assembled)), data_(owned_.data()), size_(owned_.size()) {}
  Value(Value &&other) noexcept { *this = std::move(other); }
  Value &operator=(Value &&other) noexcept {
    if (this != &other) {
      reset();
      store_ = std::exchange(other.store_, nullptr);
      owned_ = std::move(other.owned_);
      data_ = store_ != nullptr ? std::exchange(other.data_, nullptr) : owned_.data();
      other.data_ = nullptr;
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  Value(const Value &) = delete;
  Value &operator=(const Value &) = delete;
  ~Value() { reset(); }

  const void *data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset() {
    if (data_ != nullptr && store_ != nullptr) store_->release(store_->ctx, data_);
    owned_.clear();
    data_ = nullptr;
    size_ = 0;
  }

  const mncl_store_v1_t *store_ = nullptr;
  std::vector<unsigned char> owned_;
  void *data_ = nullptr;
  size_t size_ = 0;
};

class StoreClient {
 public:
  static constexpr size_t kDefaultPartBytes = size_t{256} << 20;

  explicit StoreClient(const mncl_store_v1_t *store, size_t part_bytes = kDefaultPartBytes)
      : store_(store), part_bytes_(part_bytes) {}

  void set(const std::string &key, const void *data, size_t len) {
    if (len <= part_bytes_) {
      check(store_->set(store_->ctx, key.c_str(), data, len));
      return;
    }
    const uint64_t parts = (len + part_bytes_ - 1) / part_bytes_;
    const auto *bytes = static_cast<const unsigned char *>(data);
    for (uint64_t i = 0; i < parts; ++i) {
      const size_t offset = static_cast<size_t>(i) * part_bytes_;
      check(store_->set(store_->ctx, part_key(key, i).c_str(), bytes + offset,
                        std::min(part_bytes_, len - offset)));
    }
    remember(key, parts);
    unsigned char manifest[kManifestBytes];
    const uint64_t total = len;
    std::memcpy(manifest, kPartsMagic, 8);
    std::memcpy(manifest + 8, &total, 8);
    std::memcpy(manifest + 16, &parts, 8);
    check(store_->set(store_->ctx, key.c_str(), manifest, sizeof manifest));
  }

  // Waits up to timeout_ms for key. Returns MNCL_ERR_TIMEOUT / MNCL_ERR_ABORTED for the caller
  // to explain; throws on any other failure.
  mncl_status_t get(const std::string &key, int64_t timeout_ms, Value *out) {
    Value value;
    const mncl_status_t st = get_one(key, timeout_ms, &value);
    if (st != MNCL_OK) return st;
    if (value.size() != kManifestBytes || std::memcmp(value.data(), kPartsMagic, 8) != 0) {
      *out = std::move(value);
      return MNCL_OK;
    }
    uint64_t total = 0, parts = 0;
    std::memcpy(&total, static_cast<const unsigned char *>(value.data()) + 8, 8);
    std::memcpy(&parts, static_cast<const unsigned char *>(value.data()) + 16, 8);
    std::vector<unsigned char> whole(static_cast<size_t>(total));
    size_t offset = 0;
    for (uint64_t i = 0; i < parts; ++i) {
      Value part;
      // Written before the manifest, so already there; the caller's timeout bounds the wait all
      // the same (stores whose clients may see files out of order, NFS).
      const mncl_status_t part_st = get_one(part_key(key, i), timeout_ms, &part);
      if (part_st == MNCL_ERR_ABORTED) return part_st;
      if (part_st != MNCL_OK || offset + part.size() > whole.size()) {
        throw kit::Error(
            MNCL_ERR_REMOTE,
            kit::format("naive: store key '%s' was written in %llu parts (%llu "
                        "bytes), but part %llu is %s",
                        key.c_str(), static_cast<unsigned long long>(parts),
                        static_cast<unsigned long long>(total), static_cast<unsigned long long>(i),
                        part_st != MNCL_OK ? "missing" : "too long"));
      }
      if (part.size() > 0) std::memcpy(whole.data() + offset, part.data(), part.size());
      offset += part.size();
    }
    if (offset != whole.size()) {
      throw kit::Error(MNCL_ERR_REMOTE,
                       kit::format("naive: store key '%s' was written as %llu bytes, its parts "
                                   "hold %zu",
                                   key.c_str(), static_cast<unsigned long long>(total), offset));
    }
    remember(key, parts);
    *out = Value(std::move(whole));
    return MNCL_OK;
  }

  // MNCL_OK if key exists now (a zero-timeout wait), MNCL_ERR_TIMEOUT if not.
  mncl_status_t exists(const std::string &key) {
    const char *keys[] = {key.c_str()};
    return expected_or_throw(store_->wait(store_->ctx, keys, 1, 0));
  }

  int64_t add(const std::string &key, int64_t delta) {
    int64_t result = 0;
    check(store_->add(store_->ctx, key.c_str(), delta, &result));
    return result;
  }

  void del(const std::string &key) {
    check(store_->del(store_->ctx, key.c_str()));
    uint64_t parts = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = parted_.find(key);
      if (it == parted_.end()) return;
      parts = it->second.parts;
      order_.erase(it->second.position);
      parted_.erase(it);
    }
    for (uint64_t i = 0; i < parts; ++i) check(store_->del(store_->ctx, part_key(key, i).c_str()));
  }

 private:
  static constexpr size_t kManifestBytes = 24;
  static constexpr size_t kRemembered = 4096;
  static constexpr char kPartsMagic[8] = {'M', 'N', 'C', 'L', 'P', 'R', 'T', 'S'};

  static std::string part_key(const std::string &key, uint64_t i) {
    return key + "#" + std::to_string(i);
  }
  // Whoever deletes the key (its writer or a reader) removes the parts too. Ranks that never
  // delete a key they wrote or read would keep it for ever, so only the newest kRemembered keys
  // still held are kept: a key is deleted within the operation that reads it.
  void remember(const std::string &key, uint64_t parts) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (parted_.count(key) != 0) return;
    order_.push_back(key);
    parted_.emplace(key, Parted{parts, std::prev(order_.end())});
    while (parted_.size() > kRemembered) {
      parted_.erase(order_.front());
      order_.pop_front();
    }
  }
  mncl_status_t get_one(const std::string &key, int64_t timeout_ms, Value *out) {
    void *data = nullptr;
    size_t len = 0;
    const mncl_status_t st = store_->get(store_->ctx, key.c_str(), &data, &len, timeout_ms);
    if (st == MNCL_OK) *out = Value(store_, data, len);
    return expected_or_throw(st);
  }
  static void check(mncl_status_t st) {
    if (st != MNCL_OK) throw kit::Error(st);  // the store callback has set the message
  }
  static mncl_status_t expected_or_throw(mncl_status_t st) {
    if (st != MNCL_OK && st != MNCL_ERR_TIMEOUT && st != MNCL_ERR_ABORTED) throw kit::Error(st);
    return st;
  }

  const mncl_store_v1_t *store_;
  size_t part_bytes_;
  // Keys of values held in parts that this client wrote or read, and their part counts (the
  // comm's lanes share the client).
  std::mutex mutex_;
  struct Parted {
    uint64_t parts;
    std::list<std::string>::iterator position;  // in order_
  };
  std::unordered_map<std::string, Parted> parted_;
  std::list<std::string> order_;  // parted_'s keys, oldest first
};

}  // namespace mncl::naive

// The bootstrap store (mncl_store_v1_t) as a small C++ class: std::string keys, values released
// automatically, and failures thrown as kit::Error.
//
// Only the calls whose failure callers want to explain (get and exists, which time out) report a
// status; everything else throws kit::Error(status) and keeps the message the core's store
// callback already set ("connection to the store lost", "aborted").
#pragma once

#include <mncl/mncl_plugin.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/host.h"

namespace mncl::naive {

// A value fetched from the store. Owns the copy the store made; releases it when destroyed.
class Value {
 public:
  Value() = default;
  Value(const mncl_store_v1_t *store, void *data, size_t size)
      : store_(store), data_(data), size_(size) {}
  Value(Value &&other) noexcept { *this = std::move(other); }
  Value &operator=(Value &&other) noexcept {
    if (this != &other) {
      reset();
      store_ = std::exchange(other.store_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
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
    if (data_ != nullptr) store_->release(store_->ctx, data_);
    data_ = nullptr;
    size_ = 0;
  }

  const mncl_store_v1_t *store_ = nullptr;
  void *data_ = nullptr;
  size_t size_ = 0;
};

class StoreClient {
 public:
  explicit StoreClient(const mncl_store_v1_t *store) : store_(store) {}

  void set(const std::string &key, const void *data, size_t len) {
    check(store_->set(store_->ctx, key.c_str(), data, len));
  }

  // Waits up to timeout_ms for key. Returns MNCL_ERR_TIMEOUT / MNCL_ERR_ABORTED for the caller
  // to explain; throws on any other failure.
  mncl_status_t get(const std::string &key, int64_t timeout_ms, Value *out) {
    void *data = nullptr;
    size_t len = 0;
    const mncl_status_t st = store_->get(store_->ctx, key.c_str(), &data, &len, timeout_ms);
    if (st == MNCL_OK) *out = Value(store_, data, len);
    return expected_or_throw(st);
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

  void del(const std::string &key) { check(store_->del(store_->ctx, key.c_str())); }

 private:
  static void check(mncl_status_t st) {
    if (st != MNCL_OK) throw kit::Error(st);  // the store callback has set the message
  }
  static mncl_status_t expected_or_throw(mncl_status_t st) {
    if (st != MNCL_OK && st != MNCL_ERR_TIMEOUT && st != MNCL_ERR_ABORTED) throw kit::Error(st);
    return st;
  }

  const mncl_store_v1_t *store_;
};

}  // namespace mncl::naive

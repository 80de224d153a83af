// The bootstrap store (mncl_store_v1_t) seen as a gloo::rendezvous::Store, so that Gloo's own
// connectFullMesh() rendezvous runs through whatever store the core set up (TCP, file, ...).
//
// Keys arrive here already namespaced per communicator by the core. The adapter remembers the
// keys it created so the communicator can delete them once every peer has read them.
#pragma once

#include <gloo/rendezvous/store.h>
#include <mncl/mncl_plugin.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/host.h"

namespace mncl::gloo_plugin {

class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(const mncl_store_v1_t *store, int64_t timeout_ms)
      : store_(store), timeout_ms_(timeout_ms) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    check(store_->set(store_->ctx, key.c_str(), data.data(), data.size()));
    created_.push_back(key);
  }

  std::vector<char> get(const std::string &key) override {
    void *value = nullptr;
    size_t len = 0;
    check(store_->get(store_->ctx, key.c_str(), &value, &len, timeout_ms_));
    std::vector<char> out(static_cast<const char *>(value), static_cast<const char *>(value) + len);
    store_->release(store_->ctx, value);
    return out;
  }

  void wait(const std::vector<std::string> &keys) override { wait_for(keys, timeout_ms_); }

  // Gloo passes its own context timeout (30 s by default); the communicator's bound wins.
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
    wait_for(keys, timeout_ms_);
  }

  // Deletes every key this adapter created. Call only once all peers have read them.
  void delete_created() {
    for (const auto &key : created_) check(store_->del(store_->ctx, key.c_str()));
    created_.clear();
  }

 private:
  void wait_for(const std::vector<std::string> &keys, int64_t timeout_ms) {
    std::vector<const char *> raw;
    raw.reserve(keys.size());
    for (const auto &k : keys) raw.push_back(k.c_str());
    check(store_->wait(store_->ctx, raw.data(), raw.size(), timeout_ms));
  }

  // The core's store callback has already set the message ("timed out waiting for key ...").
  static void check(mncl_status_t st) {
    if (st != MNCL_OK) throw kit::Error(st);
  }

  const mncl_store_v1_t *store_;
  int64_t timeout_ms_;
  std::vector<std::string> created_;
};

}  // namespace mncl::gloo_plugin

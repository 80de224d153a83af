// The C store table (mncl_store_v1_t) a plugin receives, backed by one communicator's prefixed
// view of the bootstrap store. Waits return MNCL_ERR_ABORTED once the communicator is aborted.
#pragma once

#include <mncl/mncl_plugin_v1.h>

#include <atomic>
#include <memory>

#include "bootstrap/store.h"

namespace mncl::core {

class StoreBridge {
 public:
  StoreBridge(std::shared_ptr<bootstrap::Store> store, const std::atomic<bool> *aborted);
  StoreBridge(const StoreBridge &) = delete;
  StoreBridge &operator=(const StoreBridge &) = delete;

  const mncl_store_v1_t *table() const { return &table_; }
  bootstrap::Store &store() { return *store_; }
  const std::atomic<bool> *aborted() const { return aborted_; }

 private:
  std::shared_ptr<bootstrap::Store> store_;
  const std::atomic<bool> *aborted_;
  mncl_store_v1_t table_;
};

}  // namespace mncl::core

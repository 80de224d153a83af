// The C store table (mncl_store_v1_t) a plugin receives, backed by one communicator's prefixed
// view of the bootstrap store. Waits return MNCL_ERR_ABORTED once the communicator is aborted
// here, and MNCL_ERR_REMOTE once its PeerWatch finds a rank gone (exited, or aborted) (checked
// every kPeerCheckMs of a wait: a wait that ends sooner costs nothing more).
#pragma once

#include <mncl/mncl_plugin_v1.h>

#include <atomic>
#include <memory>

#include "bootstrap/store.h"
#include "core/peer_watch.h"

namespace mncl::core {

class StoreBridge {
 public:
  static constexpr int64_t kPeerCheckMs = 200;

  // peers: may be null (no watch, a communicator of one rank).
  StoreBridge(std::shared_ptr<bootstrap::Store> store, const std::atomic<bool> *aborted,
              std::shared_ptr<PeerWatch> peers);
  StoreBridge(const StoreBridge &) = delete;
  StoreBridge &operator=(const StoreBridge &) = delete;

  const mncl_store_v1_t *table() const { return &table_; }
  bootstrap::Store &store() { return *store_; }
  const std::atomic<bool> *aborted() const { return aborted_; }
  PeerWatch *peers() const { return peers_.get(); }
  // Waits in progress that check the peers themselves: the watchdog's peer check leaves a
  // finding to them, which deliver what a rank wrote just before it exited.
  int watching() const { return watching_.load(); }
  std::atomic<int> &watching_count() { return watching_; }

 private:
  std::shared_ptr<bootstrap::Store> store_;
  const std::atomic<bool> *aborted_;
  std::shared_ptr<PeerWatch> peers_;
  std::atomic<int> watching_{0};
  mncl_store_v1_t table_;
};

}  // namespace mncl::core

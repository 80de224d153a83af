// The gloo plugin's tracked TCP transport (plugins/gloo/gloo_transport.cpp), white-box.
//
// A timeout or mncl_comm_abort poisons the transport context from the watchdog thread: every
// pair signals each buffer it lists as pending. A buffer waiting on several peers is listed by
// several pairs, so the first pair's signal can wake its operation, which then destroys the buffer
// while the second pair is still signalling it. Under ThreadSanitizer this test reported that
// race (pthread_cond_destroy against pthread_cond_broadcast) in every run before the
// registry's teardown lock; elsewhere it checks that the poisoned wait ends, and nothing hangs
// or crashes.
#include "gloo/gloo_transport.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/unbound_buffer.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace {

using mncl::gloo_plugin::AbortRegistry;
using mncl::gloo_plugin::TransportSettings;

constexpr int kRanks = 4;  // rank 0's buffer is listed by 3 pairs: 2 signals after the first
constexpr uint64_t kSlot = 7;

struct Rank {
  std::shared_ptr<AbortRegistry> registry = std::make_shared<AbortRegistry>();
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
};

// Connects kRanks contexts on loopback, one thread per rank (connectFullMesh blocks).
std::vector<Rank> connect_ranks() {
  std::vector<Rank> ranks(kRanks);
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      TransportSettings settings;
      settings.loopback = true;
      ranks[r].device = mncl::gloo_plugin::create_device(settings, ranks[r].registry);
      auto context = std::make_shared<gloo::rendezvous::Context>(r, kRanks);
      context->connectFullMesh(store, ranks[r].device);
      ranks[r].context = std::move(context);
    });
  }
  for (auto &t : threads) t.join();
  return ranks;
}

TEST(GlooTransport, BufferDestroyedByItsWokenWaitWhileTheContextIsPoisoned) {
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<Rank> ranks = connect_ranks();
    for (const Rank &r : ranks) ASSERT_TRUE(r.context) << "a rank failed to connect";

    // Rank 0 waits for a message from each peer on one buffer; none is ever sent.
    uint64_t value = 0;
    auto buffer = ranks[0].context->createUnboundBuffer(&value, sizeof value);
    for (int peer = 1; peer < kRanks; ++peer) buffer->recv(peer, kSlot, 0, sizeof value);

    std::atomic<bool> go{false};
    std::thread poisoner([&] {
      while (!go.load()) std::this_thread::yield();
      ranks[0].registry->poison("test: poisoned while a buffer waits on every pair");
    });
    go.store(true);
    bool woke_with_error = false;
    try {
      buffer->waitRecv(std::chrono::milliseconds(30000));
    } catch (const gloo::IoException &) {
      woke_with_error = true;
    }
    // Give the later pairs time to signal the buffer too, without synchronizing with them: a
    // Gloo collective unwinding from the wait destroys its buffer at once, and that race only
    // shows when the destruction lands after a later pair's signal (rare on idle cores). The
    // teardown lock makes it wait for the whole poison instead.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    buffer.reset();
    poisoner.join();
    EXPECT_TRUE(woke_with_error) << "the poisoned wait did not throw Gloo's IoException";
    // Wake the peers' pairs (rank 0 closed its sockets) before tearing everything down.
    for (int r = 1; r < kRanks; ++r) ranks[r].registry->poison("test: tear down");
  }
}

}  // namespace

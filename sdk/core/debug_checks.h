// MNCL_DEBUG_CHECKS=1: before each collective, every rank publishes a fingerprint of its call
// (kind, count, dtype, op, root, sequence number) in the communicator's store namespace and
// compares it with everyone else's, so mismatched calls (allreduce on one rank, bcast on
// another; different counts, dtypes or roots) fail on every rank with both fingerprints named,
// instead of hanging or producing garbage. The counts that differ by rank by design are
// published after the fingerprint and checked once the fingerprints agree: gatherv / scatterv
// (the root publishes its n counts, every other rank its own count: each rank's count must
// equal the root's counts[rank]) and alltoallv (each rank publishes its n sendcounts and n
// recvcounts: rank i's sendcounts[j] must equal rank j's recvcounts[i]); every rank reads them
// all, so every rank fails with the same message naming both ranks and both counts. Costs a
// few store round trips per collective (and, for alltoallv, reading every rank's 2n counts): a
// debugging aid, off by default.
#pragma once

#include <mncl/mncl_plugin_v1.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "bootstrap/store.h"

namespace mncl::core {

// "allreduce(count 20, float32, sum) #3"
std::string fingerprint(const mncl_coll_v1_t &coll);

// Exchanges fingerprints for coll (not for send/recv, which are not collective) and throws
// MNCL_ERR_REMOTE naming this rank's and the first differing rank's fingerprint, or, when they
// agree, the first count disagreement of a gatherv / scatterv / alltoallv ("count mismatch:
// rank 1 passes sendcount 10 but root 0's recvcounts[1] is 20"); a rank that never calls fails
// as MNCL_ERR_TIMEOUT naming it. coll is the plugin-level descriptor, with its counts (see
// kit::v_layout, kit::rooted_v_layout). Keys are removed by the last reader.
void check_fingerprints(bootstrap::Store &store, const mncl_coll_v1_t &coll, int rank, int size,
                        int64_t timeout_ms, const std::atomic<bool> *aborted);

}  // namespace mncl::core

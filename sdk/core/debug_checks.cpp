#include "core/debug_checks.h"

#include <chrono>
#include <thread>
#include <vector>

#include "common/dtype.h"  // the plugin kit's dtype/op tables
#include "common/env.h"
#include "common/error.h"
#include "core/validate.h"

namespace mncl::core {

namespace {

bool reduces(int kind) {
  return kind == MNCL_COLL_ALLREDUCE || kind == MNCL_COLL_REDUCE ||
         kind == MNCL_COLL_REDUCE_SCATTER || kind == MNCL_COLL_ALLREDUCE_COALESCED;
}
bool rooted(int kind) {
  return kind == MNCL_COLL_REDUCE || kind == MNCL_COLL_BCAST || kind == MNCL_COLL_SCATTER ||
         kind == MNCL_COLL_GATHER || kind == MNCL_COLL_GATHERV || kind == MNCL_COLL_SCATTERV;
}

}  // namespace

bool debug_checks_enabled() {
  return env::get_int("MNCL_DEBUG_CHECKS", 0, 1).value_or(0) == 1;
}

std::string fingerprint(const mncl_coll_v1_t &c) {
  std::string args;
  if (c.kind == MNCL_COLL_ALLREDUCE_COALESCED) {
    args = format("%zu buffers, counts", c.nbufs);
    for (size_t i = 0; c.counts && i < c.nbufs; ++i) args += format(" %zu", c.counts[i]);
  } else if (c.kind == MNCL_COLL_ALLGATHERV) {
    // Counts are per rank, the same everywhere; displacements are each rank's own layout.
    args = "recvcounts";
    for (size_t i = 0; c.counts && i < c.nbufs; ++i) args += format(" %zu", c.counts[i]);
  } else if (c.kind == MNCL_COLL_ALLTOALLV) {
    args = "per-pair counts";  // they differ by rank: the backend checks each pair
  } else if (c.kind == MNCL_COLL_GATHERV || c.kind == MNCL_COLL_SCATTERV) {
    args = "per-rank counts";  // only the root has them all; the backends check the blocks
  } else if (c.kind != MNCL_COLL_BARRIER) {
    args = format("count %zu", c.count);
  }
  if (c.kind != MNCL_COLL_BARRIER) {
    args += format(", %s", kit::dtype_name(static_cast<mncl_dtype_t>(c.dtype)));
  }
  if (reduces(c.kind)) args += format(", %s", kit::op_name(static_cast<mncl_op_t>(c.op)));
  if (rooted(c.kind)) args += format(", root %d", c.root);
  return format("%s(%s) #%llu", coll_kind_name(c.kind), args.c_str(),
                static_cast<unsigned long long>(c.seq));
}

void check_fingerprints(bootstrap::Store &store, const mncl_coll_v1_t &coll, int rank, int size,
                        int64_t timeout_ms, const std::atomic<bool> *aborted) {
  // Point to point is not collective: no other rank makes a matching call to compare with.
  if (size <= 1 || coll.kind == MNCL_COLL_SEND || coll.kind == MNCL_COLL_RECV ||
      coll.kind == MNCL_COLL_SENDRECV_BATCH) {
    return;
  }
  const char *fn = coll_function_name(coll.kind);
  const std::string prefix = format("dbg/%llu/", static_cast<unsigned long long>(coll.seq));
  const std::string mine = fingerprint(coll);
  store.set(prefix + std::to_string(rank), mine.data(), mine.size());

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  bootstrap::WaitOptions opts;
  opts.timeout = std::chrono::milliseconds(timeout_ms);
  opts.aborted = aborted;
  const auto absent = store.wait(keys, opts);
  if (!absent.empty()) {
    std::string ranks;
    for (const auto &k : absent) ranks += (ranks.empty() ? "" : ", ") + k.substr(prefix.size());
    throw Error(MNCL_ERR_TIMEOUT,
                format("%s: MNCL_DEBUG_CHECKS: rank %d calls %s but rank(s) %s made no "
                       "collective call #%llu within %.1f s",
                       fn, rank, mine.c_str(), ranks.c_str(),
                       static_cast<unsigned long long>(coll.seq), timeout_ms / 1000.0));
  }
  std::string mismatch;
  for (int r = 0; r < size && mismatch.empty(); ++r) {
    if (r == rank) continue;
    const auto bytes = store.get(keys[r], opts);
    const std::string theirs(bytes.begin(), bytes.end());
    if (theirs != mine) {
      mismatch = format(
          "%s: MNCL_DEBUG_CHECKS: collective mismatch: rank %d calls %s but rank "
          "%d calls %s",
          fn, rank, mine.c_str(), r, theirs.c_str());
    }
  }
  auto cleanup = [&] {
    // The last of the size readers removes the keys (it counts itself in after reading).
    int64_t n = store.add(prefix + "n", 1);
    if (n == size) {
      for (const auto &k : keys) store.erase(k);
      store.erase(prefix + "n");
    }
    if (mismatch.empty()) return;
    // Before failing, let every rank read the fingerprints: the rank hosting the TCP store may
    // exit right after its error. The counter reaches size, or vanishes (0) once the last
    // reader has removed it.
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    while (n > 0 && n < size && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      n = store.add(prefix + "n", 0);
    }
    if (n == 0) store.erase(prefix + "n");  // the add above re-created it
  };
  if (mismatch.empty()) return cleanup();
  try {
    cleanup();
  } catch (const Error &) {
    // Everyone has read by now, and the store's host may already be gone: the mismatch is
    // what this rank has to report.
  }
  throw Error(MNCL_ERR_REMOTE, mismatch);
}

}  // namespace mncl::core

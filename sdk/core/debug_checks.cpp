#include "core/debug_checks.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "common/coll.h"   // the plugin kit's v layouts
#include "common/dtype.h"  // the plugin kit's dtype/op tables
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
bool rooted_v(int kind) {
  return kind == MNCL_COLL_GATHERV || kind == MNCL_COLL_SCATTERV;
}
bool has_counts(int kind) {
  return rooted_v(kind) || kind == MNCL_COLL_ALLTOALLV;
}

// What a rank publishes after its fingerprint for the counts the fingerprint cannot compare
// (they differ by rank by design). gatherv / scatterv: the root its n counts, every other rank
// its own count. alltoallv: its n sendcounts, then its n recvcounts (every rank can then check
// every pair, so all of them fail on a disagreement, not only the two involved).
std::vector<size_t> published_counts(const mncl_coll_v1_t &c, int rank, int size) {
  const size_t n = static_cast<size_t>(size);
  if (rooted_v(c.kind)) {
    const kit::RootedVLayout v = kit::rooted_v_layout(c);
    if (rank != c.root) return {c.count};
    return v.counts ? std::vector<size_t>(v.counts, v.counts + n) : std::vector<size_t>{};
  }
  const kit::VLayout v = kit::v_layout(c);
  if (c.kind != MNCL_COLL_ALLTOALLV || !v.sendcounts) return {};
  std::vector<size_t> out(v.sendcounts, v.sendcounts + n);
  out.insert(out.end(), v.recvcounts, v.recvcounts + n);
  return out;
}

// "<fingerprint>" or "<fingerprint>\n<count> <count> ...": a fingerprint has no line break.
std::string encode(const std::string &fp, const std::vector<size_t> &counts, bool with_counts) {
  if (!with_counts) return fp;
  std::string out = fp + '\n';
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(counts[i]);
  }
  return out;
}

// Splits what encode made; false if the counts part is not a list of decimal numbers.
bool decode(const std::string &s, std::string *fp, std::vector<size_t> *counts) {
  counts->clear();
  const size_t nl = s.find('\n');
  *fp = s.substr(0, nl);
  if (nl == std::string::npos) return true;
  const char *p = s.c_str() + nl + 1;
  const char *end = s.c_str() + s.size();
  while (p < end) {
    if (*p < '0' || *p > '9') return false;
    errno = 0;
    char *next = nullptr;
    const unsigned long long v = std::strtoull(p, &next, 10);
    if (errno != 0 || next == p || v > std::numeric_limits<size_t>::max()) return false;
    counts->push_back(static_cast<size_t>(v));
    p = next;
    if (p < end && *p++ != ' ') return false;
  }
  return true;
}

// The first disagreement among the counts every rank published (counts[r]: rank r's), the same
// on every rank (ranks, then pairs, in increasing order); "" if they agree.
std::string count_mismatch(const char *fn, const mncl_coll_v1_t &c, const std::string &fp,
                           const std::vector<std::vector<size_t>> &counts) {
  const size_t n = counts.size();
  const std::string head = format("%s: MNCL_DEBUG_CHECKS: count mismatch in %s: ", fn, fp.c_str());
  const auto malformed = [&](size_t r, size_t want) {
    return head + format("rank %zu published %zu counts, not %zu", r, counts[r].size(), want);
  };
  if (rooted_v(c.kind)) {
    const size_t root = static_cast<size_t>(c.root);
    const bool gather = c.kind == MNCL_COLL_GATHERV;
    if (counts[root].size() != n) return malformed(root, n);
    for (size_t i = 0; i < n; ++i) {
      if (i == root) continue;  // the root's own count was checked locally
      if (counts[i].size() != 1) return malformed(i, 1);
      if (counts[i][0] == counts[root][i]) continue;
      return head + format("rank %zu passes %s %zu but root %zu's %s[%zu] is %zu", i,
                           gather ? "sendcount" : "recvcount", counts[i][0], root,
                           gather ? "recvcounts" : "sendcounts", i, counts[root][i]);
    }
    return "";
  }
  // alltoallv: rank i's sendcounts[j] (counts[i][j]) against rank j's recvcounts[i]
  // (counts[j][n + i]).
  for (size_t r = 0; r < n; ++r) {
    if (counts[r].size() != 2 * n) return malformed(r, 2 * n);
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const size_t sent = counts[i][j], expected = counts[j][n + i];
      if (sent == expected) continue;
      return head + format("rank %zu's sendcounts[%zu] is %zu ", i, j, sent) +
             format("but rank %zu's recvcounts[%zu] is %zu", j, i, expected);
    }
  }
  return "";
}

}  // namespace

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
    args = "per-pair counts";  // they differ by rank: compared apart (count_mismatch)
  } else if (c.kind == MNCL_COLL_GATHERV || c.kind == MNCL_COLL_SCATTERV) {
    args = "per-rank counts";  // only the root has them all: compared apart (count_mismatch)
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
  const bool with_counts = has_counts(coll.kind);
  // Each rank's published counts (what the fingerprint cannot compare), gathered as they are
  // read: O(n) for gatherv/scatterv, O(n^2) for alltoallv (every rank's 2n counts).
  std::vector<std::vector<size_t>> counts(with_counts ? static_cast<size_t>(size) : 0);
  const size_t me = static_cast<size_t>(rank);
  if (with_counts) counts[me] = published_counts(coll, rank, size);
  const std::string published =
      encode(mine, with_counts ? counts[me] : std::vector<size_t>{}, with_counts);
  store.set(prefix + std::to_string(rank), published.data(), published.size());

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
    std::string theirs;
    std::vector<size_t> their_counts;
    const bool parsed = decode(std::string(bytes.begin(), bytes.end()), &theirs, &their_counts);
    if (theirs != mine) {
      mismatch = format(
          "%s: MNCL_DEBUG_CHECKS: collective mismatch: rank %d calls %s but rank "
          "%d calls %s",
          fn, rank, mine.c_str(), r, theirs.c_str());
    } else if (!parsed) {
      mismatch = format(
          "%s: MNCL_DEBUG_CHECKS: rank %d calls %s but rank %d published malformed "
          "counts for it",
          fn, rank, mine.c_str(), r);
    } else if (with_counts) {
      counts[static_cast<size_t>(r)] = std::move(their_counts);
    }
  }
  // The same call everywhere: now the counts, which every rank checks in full (the same
  // verdict and message on every rank).
  if (mismatch.empty() && with_counts) mismatch = count_mismatch(fn, coll, mine, counts);
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

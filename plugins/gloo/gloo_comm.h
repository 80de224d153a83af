// The gloo backend's communicator: one gloo::Context per MNCL communicator, connected through
// the bootstrap store, and every mncl_coll_v1_t kind mapped to Gloo's collectives.
//
// Mapping (buffers are handled as bytes except in reductions):
//   allreduce       gloo::allreduce (ring or bcube), or the classic AllreduceRingChunked /
//                   AllreduceHalvingDoubling; see Algo below
//   reduce          gloo::reduce (non-roots need a full-size scratch output)
//   bcast, scatter, gather, allgather, alltoall, barrier   the gloo function of that name
//   reduce_scatter  a ring over unbound buffers (Gloo has no general one): size-1 steps, each
//                   sending one block to rank+1 and folding the block from rank-1
//   send / recv     unbound buffers, slot = (per-ordered-pair message number ^ digest of
//                   count and dtype), so messages between two ranks match in issue order
//   allreduce_coalesced  packed into one buffer, one allreduce, unpacked
// Collective tags are the low 32 bits of coll->seq xor a 32-bit digest of the call (kind,
// dtype, op, count, root), identical on every rank that makes the same call: ranks that make
// mismatched calls never match each other's messages and time out (MNCL_ERR_TIMEOUT naming
// the op) instead of exchanging wrong-sized or wrong-typed data (except the untagged classic
// algorithms, see allreduce_plain). p2p and the reduce_scatter ring use slot prefixes Gloo's
// own collectives do not (0x41, 0x40).
//
// Dtypes and ops: reductions use the plugin kit (kit::reduce_into) as Gloo's reduce function,
// so every dtype and op has the semantics of mncl.h (wrapping integers, NaN-propagating
// min/max). float16/bfloat16 are widened to float32 for the transfer and rounded once at the
// end, as the naive reference does (2x the bytes on the wire, but no error growth with the
// number of ranks). AVG is a SUM followed by one division by the size.
//
// Errors: Gloo throws. Every gloo::IoException / timeout / enforce failure is caught here and
// rethrown as kit::Error naming the op, its seq and the peer where one is known; after any
// failure the context is poisoned (peers see their connection drop and fail fast instead of
// waiting for their timeout) and the communicator refuses further work.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/device.h>
#include <mncl/mncl_plugin.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gloo/gloo_transport.h"

namespace mncl::gloo_plugin {

enum class Algo { kAuto, kRing, kRingChunked, kHalvingDoubling, kBcube };

// Below this many bytes (and with a power-of-two size > 2) auto picks bcube, whose log2(size)
// latency steps beat the ring's 2*(size-1); above it the ring's bandwidth wins.
inline constexpr size_t kSmallAllreduceBytes = 64 * 1024;

struct Settings {
  TransportSettings transport;
  Algo algo = Algo::kAuto;
};

// Parses MNCL_GLOO_ALGO ("auto", "ring", "ring_chunked", "halving_doubling", "bcube").
bool parse_algo(const char *text, Algo *algo);
const char *algo_name(Algo algo);

class Comm {
 public:
  // Collective: rendezvous and full-mesh connection. Throws kit::Error on failure.
  Comm(const mncl_bootstrap_v1_t &bs, const mncl_host_v1_t *host, const Settings &settings);
  ~Comm();

  // Runs one collective to completion. Throws kit::Error (status + message) on failure.
  void execute(const mncl_coll_v1_t &coll);
  // Any thread: wakes a blocked execute (which then fails with MNCL_ERR_ABORTED) and fails
  // every later one. Returns once the blocked call has left Gloo, or after the op timeout.
  void abort();

 private:
  struct Op;  // the collective being run: description, seq, timeout (gloo_comm.cpp)

  void run(Op &op, const mncl_coll_v1_t &c);
  void run_single_rank(const mncl_coll_v1_t &c);

  void allreduce(Op &op, const void *in, void *out, size_t count, int32_t dtype, int32_t mop);
  void allreduce_plain(Op &op, const void *in, void *out, size_t count, int32_t dtype, int32_t mop);
  void allreduce_coalesced(Op &op, const mncl_coll_v1_t &c);
  void reduce(Op &op, const mncl_coll_v1_t &c);
  void bcast(Op &op, const mncl_coll_v1_t &c);
  void scatter(Op &op, const mncl_coll_v1_t &c);
  void gather(Op &op, const mncl_coll_v1_t &c);
  void allgather(Op &op, const mncl_coll_v1_t &c);
  void reduce_scatter(Op &op, const mncl_coll_v1_t &c);
  void reduce_scatter_ring(Op &op, void *acc, size_t block_count, int32_t dtype, int32_t mop);
  void alltoall(Op &op, const mncl_coll_v1_t &c);
  void barrier(Op &op);
  void send(Op &op, const mncl_coll_v1_t &c);
  void recv(Op &op, const mncl_coll_v1_t &c);

  void quiesce();
  void wait_recv(Op &op, gloo::transport::UnboundBuffer &buf, int peer);
  void wait_send(Op &op, gloo::transport::UnboundBuffer &buf, int peer);

  const mncl_host_v1_t *host_;
  int rank_;
  int size_;
  int64_t default_timeout_ms_;
  Settings settings_;
  std::string comm_id_;
  std::shared_ptr<AbortRegistry> registry_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> in_flight_{false};
  std::string broken_;  // why the communicator is unusable ("" while healthy)
  // Point-to-point message numbers per peer (slots), so messages between a pair match in order.
  std::vector<uint32_t> sent_;
  std::vector<uint32_t> received_;
};

}  // namespace mncl::gloo_plugin

// libmncl-flat.so: collectives over MPI (Open MPI) for CPU clusters — one flat MPI
// communicator over all processes, many small allreduces packed into one (ChainerMN's "flat").
//
// Environment (read once at init through the core, which logs it):
//   MNCL_FLAT_BOUNDED  1 (default): blocking calls run on MPI's non-blocking collectives,
//                      polled, so the communicator's timeout and mncl_comm_abort end them, and
//                      every collective exchanges a fingerprint of the call next to its data,
//                      so mismatched calls fail (slower for small messages).
//                      0: blocking calls are MPI's blocking collectives, the fastest, but MPI
//                      has no timeout, cannot be interrupted by mncl_comm_abort, and returns
//                      wrong values for mismatched calls.
//   MNCL_FLAT_RING_MIN_BYTES  bounded mode: a blocking allreduce, reduce or allgather of at
//                      least this many bytes per rank (its bytes / the ranks, an allgather's
//                      block; default (auto) 2K on 2 ranks (a reduce 32K, an allgather 4K, a
//                      reduce-scatter 8K), and 128K on more;
//                      K/M/G accepted), or a reduce-scatter of a quarter of that per block, runs on
//                      flat's own ring over point-to-point messages when every rank's call
//                      would (MPI's non-blocking ones are slower than its blocking ones
//                      there); 0: never.
//   MNCL_FLAT_CHECK_EXCHANGE  bounded mode, how each call's check goes round the ranks: auto
//                      (default: direct up to 8 ranks, 64 where a rank has no progress thread;
//                      else doubling), direct (every rank's element to every other at once) or
//                      doubling (recursive doubling, stepped by flat's calls and its progress
//                      thread). Direct if any rank asks; doubling if every rank asks and has
//                      the thread (agreed when a communicator is made: create, split).
#include <mncl/mncl_plugin.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "common/dtype.h"
#include "common/host.h"
#include "common/tables.h"
#include "flat/flat_comm.h"
#include "flat/mpi_runtime.h"

namespace {

using mncl::flat::Comm;
using mncl::flat::Request;
namespace kit = mncl::kit;
namespace flat = mncl::flat;

const mncl_host_v1_t *g_host = nullptr;
flat::Options g_options;

// CUDA buffers only when Open MPI says it handles them. The core reads the capabilities when
// it loads the plugin, before init(), and Open MPI answers only once MPI is initialized: so
// this is asked at load time and is true only if the application initialized a CUDA-aware MPI
// before MNCL loaded flat.
uint64_t capabilities_at_load() {
  uint64_t caps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_NATIVE_ASYNC;
  if (flat::mpi_cuda_aware_now()) caps |= MNCL_CAP_CUDA_MEMORY;
  return caps;
}
// Every kind, the coalesced allreduce included (packed into one MPI_Allreduce), plugin ABI
// v3's allgatherv / alltoallv (MPI_Allgatherv / MPI_Alltoallv), v4's SENDRECV_BATCH (its
// sends and receives started together, so that a blocking batch can check each message's size
// before receiving it) and v5's gatherv / scatterv (point-to-point messages to / from the root).
constexpr uint32_t kCollectives =
    MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED) |
    MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV) |
    MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH) | MNCL_COLL_BIT(MNCL_COLL_GATHERV) |
    MNCL_COLL_BIT(MNCL_COLL_SCATTERV);

// Computed when the library is loaded (before the table below, which copies it).
const uint64_t g_caps = capabilities_at_load();

mncl_status_t flat_init(const mncl_host_v1_t *host) {
  if (!kit::host_is_usable(host)) return MNCL_ERR_PLUGIN;
  g_host = host;
  g_options = flat::Options{};
  g_options.cuda = (g_caps & MNCL_CAP_CUDA_MEMORY) != 0;
  for (auto [name, option] : {std::pair{"MNCL_FLAT_BOUNDED", &g_options.bounded},
                              std::pair{"MNCL_FLAT_PROGRESS_THREAD", &g_options.progress_thread}}) {
    const char *value = host->get_env ? host->get_env(name) : nullptr;
    if (value == nullptr) continue;
    if (std::strcmp(value, "0") != 0 && std::strcmp(value, "1") != 0) {
      return kit::report(host, MNCL_ERR_INVALID_ARGUMENT, "%s='%s' is neither 0 nor 1", name,
                         value);
    }
    *option = value[0] == '1';
  }
  const char *ring_min = host->get_env ? host->get_env("MNCL_FLAT_RING_MIN_BYTES") : nullptr;
  if (ring_min == nullptr || kit::lower(ring_min) != "auto") {  // auto: the default
    const mncl_status_t st = kit::read_size(host, "MNCL_FLAT_RING_MIN_BYTES", 0, SIZE_MAX / 2,
                                            &g_options.ring_min_bytes);
    if (st != MNCL_OK) return st;
  }
  if (const char *value = host->get_env ? host->get_env("MNCL_FLAT_CHECK_EXCHANGE") : nullptr) {
    const std::pair<const char *, flat::Options::Exchange> forms[] = {
        {"auto", flat::Options::Exchange::kAuto},
        {"direct", flat::Options::Exchange::kDirect},
        {"doubling", flat::Options::Exchange::kDoubling}};
    bool known = false;
    for (const auto &[name, form] : forms) {
      if (kit::lower(value) != name) continue;
      g_options.exchange = form;
      known = true;
    }
    if (!known) {
      return kit::report(host, MNCL_ERR_INVALID_ARGUMENT,
                         "MNCL_FLAT_CHECK_EXCHANGE='%s' is none of auto, direct, doubling", value);
    }
  }
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);  // callable before MPI_Init
  MNCL_KIT_LOG(host, MNCL_LOG_INFO, "flat 0.1.0 on MPI %d.%d%s", major, minor,
               g_options.bounded ? ""
                                 : ", unbounded blocking calls (MNCL_FLAT_BOUNDED=0): no "
                                   "timeout, no abort, no mismatch check");
  // MPI itself is initialized by the first comm_create: auto-selection loads every plugin,
  // and a job that picks another backend must not pay for (or be broken by) MPI_Init.
  return MNCL_OK;
}

// MPI stays initialized: it cannot be initialized again in this process, and a later
// communicator may load flat again. flat finalizes it at exit (see mpi_runtime.h).
void flat_finalize(void) {
  kit::release_live_comms();
  g_host = nullptr;
}

mncl_status_t flat_probe(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                         size_t reason_len) {
  if (info->launched_by_mpi == 1) {
    *score = 80;  // the launcher set MPI up: MPI's tuned collectives beat the store-based ones
    kit::copy_cstr(reason, reason_len, "");
  } else if (info->size <= 1) {
    // A single process works as an MPI singleton; usable when asked for, never chosen by auto
    // over a backend that needs no MPI_Init.
    *score = 1;
    kit::copy_cstr(reason, reason_len, "single process, not launched by mpirun: MPI singleton");
  } else {
    *score = 0;
    kit::copy_cstr(reason, reason_len, flat::not_launched_message(info->size).c_str());
  }
  return MNCL_OK;
}

// The store is not needed: MPI's launcher already wired the processes together.
mncl_status_t flat_comm_create(const mncl_bootstrap_v1_t *bs, void **comm) {
  return kit::create_comm(
      g_host, "flat", bs, comm, [&] { return Comm::enlist(Comm::create(*bs, g_host, g_options)); },
      false);
}

mncl_status_t flat_comm_destroy(void *comm) {
  auto *c = static_cast<Comm *>(comm);
  if (c->busy() > 0) {
    // Another thread is still blocked inside MPI on it (after an abort): freeing it under
    // that thread would crash, so it is left to the process's end.
    MNCL_KIT_LOG(g_host, MNCL_LOG_WARN,
                 "comm_destroy while another thread is blocked in MPI on it; the MPI "
                 "communicator is leaked");
    return MNCL_OK;
  }
  kit::untrack_comm(comm);  // waits for an abort in progress (kit::LiveComms)
  delete c;
  return MNCL_OK;
}

mncl_status_t flat_comm_abort(void *comm) {
  return kit::abort_comm<Comm>(g_host, "flat comm_abort", comm);
}

mncl_status_t flat_comm_split(void *comm, int32_t color, int32_t key, const mncl_bootstrap_v1_t *bs,
                              void **newcomm) {
  (void)key;  // the core already ordered the ranks by key; bs->rank carries the result
  *newcomm = nullptr;
  return kit::guard(g_host, "flat comm_split", [&] {
    *newcomm = Comm::enlist(static_cast<Comm *>(comm)->split(color, bs));
    kit::track_comm(*newcomm);  // reachable by comm_abort (kit::LiveComms)
    return MNCL_OK;
  });
}

mncl_status_t flat_execute(void *comm, const mncl_coll_v1_t *coll) {
  return kit::execute_on<Comm>(g_host, "flat execute", comm, coll);
}

mncl_status_t flat_post(void *comm, const mncl_coll_v1_t *coll, void **handle) {
  *handle = nullptr;
  return kit::guard(g_host, "flat post", [&] {
    *handle = static_cast<Comm *>(comm)->post(*coll).release();
    return MNCL_OK;
  });
}

mncl_status_t flat_test(void *comm, void *handle, int32_t *done) {
  auto *c = static_cast<Comm *>(comm);
  std::unique_ptr<Request> request(static_cast<Request *>(handle));
  *done = 0;
  const mncl_status_t status = kit::guard(g_host, "flat test", [&] {
    if (c->test(*request)) *done = 1;
    return MNCL_OK;
  });
  if (status != MNCL_OK) {
    *done = 1;  // the handle is released with the failure, as the ABI asks
    c->retire(std::move(request));
    return status;
  }
  if (!*done) request.release();  // still running: the core keeps the handle
  return MNCL_OK;
}

}  // namespace

// The v5 table, and the same functions as v4, v3, v2 and v1 for older cores (each copy drops
// the kinds its version does not define from coll_mask). Positional initializers: keep the
// field comments in sync with mncl_plugin_v5.h.
MNCL_PLUGIN_EXPORT const mncl_plugin_v5_t mncl_plugin_v5 = {
    sizeof(mncl_plugin_v5_t),  // struct_size
    MNCL_PLUGIN_MAGIC,         // magic
    MNCL_PLUGIN_ABI_V5,        // abi_version
    "flat",                    // name
    "0.1.0",                   // version
    g_caps,                    // caps: host (+ CUDA if MPI says so), native non-blocking
    kCollectives,              // coll_mask
    kit::kAllDtypesMask,       // dtype_mask
    kit::kAllOpsMask,          // op_mask
    0,                         // reserved0
    flat_init,                 // init
    flat_finalize,             // finalize
    flat_probe,                // probe
    flat_comm_create,          // comm_create
    flat_comm_destroy,         // comm_destroy
    flat_comm_abort,           // comm_abort
    flat_comm_split,           // comm_split: MPI_Comm_split, called on every parent rank
    flat_execute,              // execute
    flat_post,                 // post: MPI's non-blocking collectives
    flat_test,                 // test
};
MNCL_PLUGIN_EXPORT const mncl_plugin_v4_t mncl_plugin_v4 = kit::as_v4(mncl_plugin_v5);
MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = kit::as_v3(mncl_plugin_v4);
MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = kit::as_v2(mncl_plugin_v3);
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);

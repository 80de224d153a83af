// libmncl-naive.so: the reference backend, and the template for writing a plugin.
//
// A plugin is this file plus its algorithms: a handful of extern "C"-compatible functions with
// the signatures of mncl_plugin_v5_t, and the exported tables at the bottom (v5, plus v4, v3, v2
// and v1 copies for older cores). Each function turns C++ exceptions into a status with kit::guard,
// because nothing may be thrown across the ABI. Build with mncl_add_plugin(<name> SOURCES ...),
// which hides every other symbol.
#include <mncl/mncl_plugin.h>

#include <cstdint>

#include "common/dtype.h"
#include "common/host.h"
#include "common/tables.h"
#include "naive/naive_comm.h"

namespace {

using mncl::naive::Comm;
namespace kit = mncl::kit;

// The host services from init(); init/finalize are serialized, communicators come after init.
const mncl_host_v1_t *g_host = nullptr;

mncl_status_t naive_init(const mncl_host_v1_t *host) {
  if (!kit::host_is_usable(host)) return MNCL_ERR_PLUGIN;  // cannot even report why
  g_host = host;
  MNCL_KIT_LOG(g_host, MNCL_LOG_INFO, "naive 0.1.0: reference backend over the bootstrap store");
  // A bad setting of this plugin's own refuses it here, with MNCL_ERR_INVALID_ARGUMENT: the
  // core then fails the communicator's creation naming it (auto included), and mncl-info
  // shows it. Plugins should check every variable of theirs at init, as this one does.
  return kit::guard(host, "naive init", [&] {
    mncl::naive::part_bytes_from_env(host);
    return MNCL_OK;
  });
}

void naive_finalize(void) {
  kit::release_live_comms();
  g_host = nullptr;
}

// Always usable (it needs nothing but the store), but slow: every other backend should win.
mncl_status_t naive_probe(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                          size_t reason_len) {
  (void)info;
  *score = 10;
  kit::copy_cstr(reason, reason_len, "");
  return MNCL_OK;
}

// No rendezvous needed: the core has already brought the ranks together, and the store is all
// this backend ever talks through.
mncl_status_t naive_comm_create(const mncl_bootstrap_v1_t *bs, void **comm) {
  return kit::create_comm(g_host, "naive", bs, comm, [&] { return new Comm(*bs, g_host); });
}

// Local: each op's keys are deleted by its last reader, so there is nothing left to clean up.
mncl_status_t naive_comm_destroy(void *comm) {
  return kit::destroy_comm<Comm>(g_host, "naive comm_destroy", comm);
}

mncl_status_t naive_comm_abort(void *comm) {
  return kit::abort_comm<Comm>(g_host, "naive comm_abort", comm);
}

mncl_status_t naive_execute(void *comm, const mncl_coll_v1_t *coll) {
  return kit::execute_on<Comm>(g_host, "naive execute", comm, coll);
}

// Host buffers, blocking execute; safe on several threads at once as plugin ABI v2 allows
// (MNCL_CAP_CONCURRENT_P2P: send/recv per peer beside the collectives, see naive_comm.h).
constexpr uint64_t kCaps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P;

// Every kind, the coalesced allreduce, the v3 kinds with a count per rank and v5's gatherv and
// scatterv included; not v4's batch of sends and receives (the core runs it as sends and
// receives on the p2p lanes).
constexpr uint32_t kCollMask =
    MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED) |
    MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV) |
    MNCL_COLL_BIT(MNCL_COLL_GATHERV) | MNCL_COLL_BIT(MNCL_COLL_SCATTERV);

}  // namespace

// The exported tables: v5, and the same functions as v4, v3, v2 and v1 for older cores
// (kit::as_v4 drops gatherv and scatterv, kit::as_v2 the v3 kinds, kit::as_v1 also
// MNCL_CAP_CONCURRENT_P2P). Positional initializers (C++17 has no designated ones): keep the
// field comments in sync with mncl_plugin_v5.h.
MNCL_PLUGIN_EXPORT const mncl_plugin_v5_t mncl_plugin_v5 = {
    sizeof(mncl_plugin_v5_t),  // struct_size
    MNCL_PLUGIN_MAGIC,         // magic
    MNCL_PLUGIN_ABI_V5,        // abi_version
    "naive",                   // name
    "0.1.0",                   // version
    kCaps,                     // caps
    kCollMask,                 // coll_mask
    kit::kAllDtypesMask,       // dtype_mask
    kit::kAllOpsMask,          // op_mask
    0,                         // reserved0
    naive_init,                // init
    naive_finalize,            // finalize
    naive_probe,               // probe
    naive_comm_create,         // comm_create
    naive_comm_destroy,        // comm_destroy
    naive_comm_abort,          // comm_abort
    nullptr,                   // comm_split: the core's split + comm_create is all we need
    naive_execute,             // execute
    nullptr,                   // post: no native async (no MNCL_CAP_NATIVE_ASYNC)
    nullptr,                   // test
};
MNCL_PLUGIN_EXPORT const mncl_plugin_v4_t mncl_plugin_v4 = kit::as_v4(mncl_plugin_v5);
MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = kit::as_v3(mncl_plugin_v4);
MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = kit::as_v2(mncl_plugin_v3);
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);

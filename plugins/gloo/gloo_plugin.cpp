// libmncl-gloo.so: CPU collectives over Gloo's TCP transport.
//
// The ABI edge: each entry point turns exceptions (Gloo's included) into a status with
// kit::guard; the communicator (gloo_comm.h) does the work. Environment variables, read through
// the host (so the core logs them) at init, where a bad value refuses the plugin with
// MNCL_ERR_INVALID_ARGUMENT (the core then fails the communicator's creation, as the user
// wants gloo; mncl-info shows it), and again at each comm_create:
//   MNCL_GLOO_TRANSPORT  tcp (default, and the only one: ibverbs is refused, by the probe and
//                        by comm_create, see gloo_transport.h)
//   MNCL_GLOO_IFACE      network interface to bind (default: GLOO_SOCKET_IFNAME's first entry,
//                        as torch.distributed takes it; else this host's name; 127.0.0.1 when
//                        every rank is on this host)
//   MNCL_GLOO_ALGO       auto (default) | ring | ring_chunked | halving_doubling | bcube (any
//                        case)
#include <gloo/config.h>
#include <mncl/mncl_plugin.h>

#include <new>
#include <string>

#include "common/dtype.h"
#include "common/host.h"
#include "common/tables.h"
#include "gloo/gloo_comm.h"

namespace {

using mncl::gloo_plugin::Comm;
using mncl::gloo_plugin::Settings;
namespace kit = mncl::kit;

#define MNCL_GLOO_STR2(x) #x
#define MNCL_GLOO_STR(x) MNCL_GLOO_STR2(x)
#define MNCL_GLOO_VERSION_STRING                                      \
  "0.1.0 (gloo " MNCL_GLOO_STR(GLOO_VERSION_MAJOR) "." MNCL_GLOO_STR( \
      GLOO_VERSION_MINOR) "." MNCL_GLOO_STR(GLOO_VERSION_PATCH) ")"

const mncl_host_v1_t *g_host = nullptr;

std::string env(const char *name) {
  const char *value = g_host->get_env != nullptr ? g_host->get_env(name) : nullptr;
  return value != nullptr ? std::string(value) : std::string();  // copy: valid until next call
}

// The plugin's settings from the environment; throws kit::Error naming the variable at fault
// (MNCL_ERR_NOT_SUPPORTED for the ibverbs transport, MNCL_ERR_INVALID_ARGUMENT for a value
// that means nothing).
Settings read_settings() {
  Settings settings;
  std::string why;
  const mncl_status_t transport =
      mncl::gloo_plugin::check_transport(env("MNCL_GLOO_TRANSPORT"), &why);
  if (transport != MNCL_OK) throw kit::Error(transport, why);
  settings.transport.iface = env("MNCL_GLOO_IFACE");
  if (settings.transport.iface.empty()) {
    // torch.distributed's (and Gloo's own examples') variable, a comma list there: one
    // interface here, the first, as MNCL's gloo runs one device per communicator.
    const std::string list = env("GLOO_SOCKET_IFNAME");
    settings.transport.iface = list.substr(0, list.find(','));
    settings.transport.iface_origin = "GLOO_SOCKET_IFNAME";
    if (list.find(',') != std::string::npos) {
      MNCL_KIT_LOG(g_host, MNCL_LOG_INFO,
                   "gloo: GLOO_SOCKET_IFNAME='%s': binding its first interface, %s, only",
                   list.c_str(), settings.transport.iface.c_str());
    }
  }
  const std::string algo = env("MNCL_GLOO_ALGO");
  if (!mncl::gloo_plugin::parse_algo(algo.c_str(), &settings.algo)) {
    throw kit::Error(MNCL_ERR_INVALID_ARGUMENT,
                     kit::format("MNCL_GLOO_ALGO='%s' is not an algorithm (expected auto, ring, "
                                 "ring_chunked, halving_doubling or bcube)",
                                 algo.c_str()));
  }
  return settings;
}

mncl_status_t gloo_init(const mncl_host_v1_t *host) {
  if (!kit::host_is_usable(host)) return MNCL_ERR_PLUGIN;
  g_host = host;
  MNCL_KIT_LOG(g_host, MNCL_LOG_INFO, "gloo %s: CPU collectives over Gloo",
               MNCL_GLOO_VERSION_STRING);
  try {
    read_settings();
  } catch (const kit::Error &e) {
    // A value that means nothing refuses the plugin (the core reports it); ibverbs is left to
    // the probe, which scores it 0 with the reason, for auto to pass gloo over.
    if (e.status() == MNCL_ERR_INVALID_ARGUMENT) {
      return kit::report(host, MNCL_ERR_INVALID_ARGUMENT, "gloo: %s", e.what());
    }
  } catch (const std::exception &e) {
    return kit::report(host, MNCL_ERR_INTERNAL, "gloo: reading its settings: %s", e.what());
  }
  return MNCL_OK;
}

void gloo_finalize(void) {
  kit::release_live_comms();
  g_host = nullptr;
}

// Host memory, any job shape: preferred over naive (10), below device-native backends.
// Unusable with MNCL_GLOO_TRANSPORT=ibverbs; a value that is no transport at all is left to
// comm_create's MNCL_ERR_INVALID_ARGUMENT, so that a typo fails the job instead of passing gloo
// over.
mncl_status_t gloo_probe(const mncl_probe_v1_t * /*info*/, int32_t *score, char *reason,
                         size_t reason_len) {
  std::string why;
  if (mncl::gloo_plugin::check_transport(env("MNCL_GLOO_TRANSPORT"), &why) ==
      MNCL_ERR_NOT_SUPPORTED) {
    *score = 0;
    kit::copy_cstr(reason, reason_len, why.c_str());
    return MNCL_OK;
  }
  *score = 50;
  kit::copy_cstr(reason, reason_len, "");
  return MNCL_OK;
}

mncl_status_t gloo_comm_create(const mncl_bootstrap_v1_t *bs, void **comm) {
  return kit::create_comm(g_host, "gloo", bs, comm, [&] {
    Settings settings;
    try {
      settings = read_settings();
    } catch (const kit::Error &e) {
      throw kit::Error(e.status(), std::string("gloo comm_create: ") + e.what());
    }
    settings.transport.loopback = bs->num_hosts == 1;
    return new Comm(*bs, g_host, settings);
  });
}

mncl_status_t gloo_comm_destroy(void *comm) {
  return kit::destroy_comm<Comm>(g_host, "gloo comm_destroy", comm);
}

mncl_status_t gloo_comm_abort(void *comm) {
  return kit::abort_comm<Comm>(g_host, "gloo comm_abort", comm);
}

mncl_status_t gloo_execute(void *comm, const mncl_coll_v1_t *coll) {
  return kit::execute_on<Comm>(g_host, "gloo execute", comm, coll);
}

// Host buffers only (the core stages device memory), blocking execute; safe on several threads
// at once as plugin ABI v2 allows (MNCL_CAP_CONCURRENT_P2P: send/recv per peer beside the
// collectives, see "Threading" in gloo_comm.h).
constexpr uint64_t kCaps = MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P;

// Every kind, the coalesced allreduce included (packed into one allreduce), plugin ABI v3's
// allgatherv / alltoallv (gloo::allgatherv / gloo::alltoallv) and v5's gatherv / scatterv
// (unbound buffers between the root and each rank); not v4's batch of sends and receives (the
// core runs it as sends and receives on the p2p lanes).
constexpr uint32_t kCollMask =
    MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED) |
    MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV) |
    MNCL_COLL_BIT(MNCL_COLL_GATHERV) | MNCL_COLL_BIT(MNCL_COLL_SCATTERV);

}  // namespace

// The v5 table, and the same functions as v4, v3, v2 and v1 for older cores (kit::as_v4 drops
// gatherv and scatterv, kit::as_v2 the v3 kinds, kit::as_v1 also MNCL_CAP_CONCURRENT_P2P).
// Positional initializers: keep the field comments in sync with mncl_plugin_v5.h.
MNCL_PLUGIN_EXPORT const mncl_plugin_v5_t mncl_plugin_v5 = {
    sizeof(mncl_plugin_v5_t),  // struct_size
    MNCL_PLUGIN_MAGIC,         // magic
    MNCL_PLUGIN_ABI_V5,        // abi_version
    "gloo",                    // name
    MNCL_GLOO_VERSION_STRING,  // version
    kCaps,                     // caps
    kCollMask,                 // coll_mask
    kit::kAllDtypesMask,       // dtype_mask
    kit::kAllOpsMask,          // op_mask
    0,                         // reserved0
    gloo_init,                 // init
    gloo_finalize,             // finalize
    gloo_probe,                // probe
    gloo_comm_create,          // comm_create
    gloo_comm_destroy,         // comm_destroy
    gloo_comm_abort,           // comm_abort: from any thread, fails every running execute
    nullptr,                   // comm_split: the core's split + comm_create on a new bootstrap
    gloo_execute,              // execute
    nullptr,                   // post: no native async
    nullptr,                   // test
};
MNCL_PLUGIN_EXPORT const mncl_plugin_v4_t mncl_plugin_v4 = kit::as_v4(mncl_plugin_v5);
MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = kit::as_v3(mncl_plugin_v4);
MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = kit::as_v2(mncl_plugin_v3);
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);

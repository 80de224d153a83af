// libmncl-shm.so: collectives through one POSIX shared-memory segment per communicator, for
// ranks that share a host (shm_comm.h has the protocol and the algorithms).
//
// Configuration (read through the core at init; rank 0's values win, see shm_comm.h):
//   MNCL_SHM_CHUNK     bytes each rank stages per pipeline round (default 1M; >= 64K)
//   MNCL_SHM_SMALL     allreduce/reduce up to this size use the single-phase exchange (64K)
//   MNCL_SHM_NT_BYTES  messages from this size on are copied out with non-temporal stores (4M)
//   MNCL_SHM_SPIN      pause-loop iterations before yielding (default: 16 when ranks outnumber
//                      CPUs, else 20000)
//   MNCL_SHM_YIELD_US  microseconds of sched_yield() before a futex sleep (default: 30 when
//                      ranks outnumber CPUs, else 10)
//   MNCL_SHM_SINGLE_COPY  1 (default): point-to-point messages above 64 KiB are read straight
//                      from the sender's memory (process_vm_readv); 0: through the segment;
//                      decline: offer but never accept (tests the fallback). Per rank.
#include <mncl/mncl_plugin.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/dtype.h"
#include "common/host.h"
#include "common/tables.h"
#include "shm/shm_comm.h"

namespace {

using mncl::shm::Comm;
namespace kit = mncl::kit;

const mncl_host_v1_t *g_host = nullptr;
mncl::shm::Options g_options;

mncl_status_t read_size(const char *name, size_t lo, size_t hi, size_t *value) {
  return kit::read_size(g_host, name, lo, hi, value);
}

mncl_status_t shm_init(const mncl_host_v1_t *host) {
  if (!kit::host_is_usable(host)) return MNCL_ERR_PLUGIN;
  g_host = host;
  g_options = mncl::shm::Options{};
  mncl_status_t st = read_size("MNCL_SHM_CHUNK", 64u << 10, 1u << 30, &g_options.chunk);
  if (st == MNCL_OK) st = read_size("MNCL_SHM_SMALL", 0, 1u << 30, &g_options.small);
  if (st == MNCL_OK) st = read_size("MNCL_SHM_NT_BYTES", 0, SIZE_MAX / 2, &g_options.nt_bytes);
  size_t spin = 0;
  bool spin_set = false;
  if (st == MNCL_OK && host->get_env && host->get_env("MNCL_SHM_SPIN")) {
    spin_set = true;
    st = read_size("MNCL_SHM_SPIN", 0, 10000000, &spin);
  }
  size_t yield_us = 0;
  bool yield_set = false;
  if (st == MNCL_OK && host->get_env && host->get_env("MNCL_SHM_YIELD_US")) {
    yield_set = true;
    // At most 1 s: a peer's death shows only once a waiter sleeps (its liveness checks).
    st = read_size("MNCL_SHM_YIELD_US", 0, 1000000, &yield_us);
  }
  if (st != MNCL_OK) return st;
  if (const char *v = host->get_env ? host->get_env("MNCL_SHM_SINGLE_COPY") : nullptr) {
    const std::string value = kit::lower(v);
    if (value == "0" || value == "1") {
      g_options.single_copy = value == "1";
    } else if (value == "decline") {
      g_options.single_copy_declines = true;
    } else {
      return kit::report(host, MNCL_ERR_INVALID_ARGUMENT,
                         "shm: MNCL_SHM_SINGLE_COPY='%s' is not 0, 1 or decline", v);
    }
  }
  if (spin_set) g_options.spin = static_cast<int>(spin);
  if (yield_set) g_options.yield_us = static_cast<int>(yield_us);
  g_options.chunk = g_options.chunk / 64 * 64;  // slices start on cache lines
  // The single-phase exchange stages the whole message in one staging half.
  if (g_options.small > g_options.chunk) g_options.small = g_options.chunk;
  MNCL_KIT_LOG(host, MNCL_LOG_INFO, "shm 0.1.0: chunk %zu, single-phase up to %zu bytes",
               g_options.chunk, g_options.small);
  return MNCL_OK;
}

void shm_finalize(void) {
  kit::release_live_comms();
  g_host = nullptr;
}

// Why /dev/shm cannot hold the segment of a communicator of `ranks` ranks ("" when it can): it
// is reserved whole at creation (posix_fallocate), and a container's /dev/shm is often 64 MiB
// (Docker's default) or read-only. Judged at the probe, so that auto passes shm over, with the
// reason, for another backend, instead of failing the creation.
std::string shm_room_problem(int ranks) {
  if (ranks < 1) ranks = 1;
  const mncl::shm::Layout layout(ranks, g_options.chunk, g_options.p2p_slot);
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) != 0) {
    return kit::format("/dev/shm is not usable here (%s)", std::strerror(errno));
  }
  if ((vfs.f_flag & ST_RDONLY) != 0) return "/dev/shm is read-only here";
  if (access("/dev/shm", W_OK) != 0) return "/dev/shm is not writable by this user";
  if (vfs.f_blocks == 0) return "";  // no size limit (tmpfs size=0, ramfs): nothing to compare
  const double free_mib = static_cast<double>(vfs.f_bavail) * vfs.f_frsize / (1 << 20);
  const double need_mib = static_cast<double>(layout.total) / (1 << 20);
  if (free_mib < need_mib) {
    return kit::format(
        "its segment for %d ranks needs %.1f MiB of /dev/shm, which has %.1f MiB free (a "
        "container's default is 64 MiB: docker run --shm-size; or a smaller MNCL_SHM_CHUNK)",
        ranks, need_mib, free_mib);
  }
  return "";
}

// Host memory, every rank on this host: the fastest CPU path there is (above gloo's 50 and an
// MPI launch's flat 80, below nccl's 90, which is for device memory).
mncl_status_t shm_probe(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                        size_t reason_len) {
  int hosts = info != nullptr ? info->num_hosts : -1;
  if (hosts < 0 && info != nullptr && info->local_size > 0 && info->size > 0) {
    hosts = info->local_size == info->size ? 1 : 2;  // "at least 2"
  }
  if (info != nullptr && info->size <= 1) hosts = 1;
  if (hosts <= 1) {  // on one host, or not known: what /dev/shm holds decides
    if (const std::string why = shm_room_problem(info != nullptr ? info->size : 1); !why.empty()) {
      *score = 0;
      kit::copy_cstr(reason, reason_len, why.c_str());
      return MNCL_OK;
    }
  }
  if (hosts == 1) {
    *score = 85;
    kit::copy_cstr(reason, reason_len, "");
  } else if (hosts > 1) {
    *score = 0;
    const std::string why =
        info->num_hosts > 1
            ? kit::format("ranks span %d hosts", info->num_hosts)
            : kit::format("ranks span more than one host (%d of %d ranks on this host)",
                          info->local_size, info->size);
    kit::copy_cstr(reason, reason_len, why.c_str());
  } else {
    // Unknown layout: usable (comm_create checks the host), but not preferred.
    *score = 20;
    kit::copy_cstr(reason, reason_len, "cannot tell whether every rank is on this host");
  }
  return MNCL_OK;
}

mncl_status_t shm_comm_create(const mncl_bootstrap_v1_t *bs, void **comm) {
  return kit::create_comm(g_host, "shm", bs, comm,
                          [&] { return new Comm(*bs, g_host, g_options); });
}

// Local: unmapping is all there is (the name was unlinked at creation).
mncl_status_t shm_comm_destroy(void *comm) {
  return kit::destroy_comm<Comm>(g_host, "shm comm_destroy", comm);
}

mncl_status_t shm_comm_abort(void *comm) {
  return kit::abort_comm<Comm>(g_host, "shm comm_abort", comm);
}

mncl_status_t shm_execute(void *comm, const mncl_coll_v1_t *coll) {
  return kit::execute_on<Comm>(g_host, "shm execute", comm, coll);
}

// Every kind, the coalesced allreduce, the v3 kinds with a count per rank and the v5 rooted
// ones included (not v4's SENDRECV_BATCH: the core's one send/recv per op, each on its own lane,
// progress together here).
constexpr uint32_t kCollMask =
    MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED) |
    MNCL_COLL_BIT(MNCL_COLL_ALLGATHERV) | MNCL_COLL_BIT(MNCL_COLL_ALLTOALLV) |
    MNCL_COLL_BIT(MNCL_COLL_GATHERV) | MNCL_COLL_BIT(MNCL_COLL_SCATTERV);

}  // namespace

// Plugin ABI v5 (gatherv, scatterv; v3's allgatherv, alltoallv), with v2's threading:
// execute() may run a collective, a SEND per peer and a RECV per peer at once (shm_comm.h,
// "Threading"). The v4 copy drops the v5 kinds, the v3 copy nothing more (shm sets no v4 kind),
// the v2 copy the v3 kinds, the v1 copy, for cores that predate v2, also that capability.
MNCL_PLUGIN_EXPORT const mncl_plugin_v5_t mncl_plugin_v5 = {
    sizeof(mncl_plugin_v5_t),                        // struct_size
    MNCL_PLUGIN_MAGIC,                               // magic
    MNCL_PLUGIN_ABI_V5,                              // abi_version
    "shm",                                           // name
    "0.1.0",                                         // version
    MNCL_CAP_HOST_MEMORY | MNCL_CAP_CONCURRENT_P2P,  // caps: host buffers, blocking, lanes
    kCollMask,                                       // coll_mask
    kit::kAllDtypesMask,                             // dtype_mask
    kit::kAllOpsMask,                                // op_mask
    0,                                               // reserved0
    shm_init,                                        // init
    shm_finalize,                                    // finalize
    shm_probe,                                       // probe
    shm_comm_create,                                 // comm_create
    shm_comm_destroy,                                // comm_destroy
    shm_comm_abort,                                  // comm_abort: any thread, any time
    nullptr,                                         // comm_split: the core's split + comm_create
    shm_execute,                                     // execute: concurrent per the v2 rule
    nullptr,                                         // post
    nullptr,                                         // test
};
MNCL_PLUGIN_EXPORT const mncl_plugin_v4_t mncl_plugin_v4 = kit::as_v4(mncl_plugin_v5);
MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = kit::as_v3(mncl_plugin_v4);
MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = kit::as_v2(mncl_plugin_v3);
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);

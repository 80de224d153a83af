// libmncl-nccl.so: collectives on NVIDIA GPUs through NCCL, one rank per GPU.
//
// Links libcudart and libnccl (a plugin may; libmncl may not): on a machine without them the
// loader refuses this file with the dynamic linker's message, and without a GPU the plugin
// loads, reports its capabilities and refuses in probe with "no CUDA device".
#include <cuda_runtime_api.h>
#include <mncl/mncl_plugin.h>
#include <nccl.h>

#include <memory>

#include "common/dtype.h"
#include "common/host.h"
#include "common/tables.h"
#include "nccl/nccl_comm.h"

#define MNCL_NCCL_STR2(x) #x
#define MNCL_NCCL_STR(x) MNCL_NCCL_STR2(x)

namespace {

using mncl::nccl::Comm;
using mncl::nccl::Pending;
namespace kit = mncl::kit;

const mncl_host_v1_t *g_host = nullptr;

mncl_status_t nccl_init(const mncl_host_v1_t *host) {
  if (!kit::host_is_usable(host)) return MNCL_ERR_PLUGIN;
  g_host = host;
  // Nothing here needs a GPU: without one the plugin still loads and says why in probe.
  int nccl_version = 0, runtime_version = 0;
  ncclGetVersion(&nccl_version);
  cudaRuntimeGetVersion(&runtime_version);
  MNCL_KIT_LOG(g_host, MNCL_LOG_INFO, "nccl 0.1.0: NCCL %d.%d.%d, CUDA runtime %d.%d",
               nccl_version / 10000, nccl_version / 100 % 100, nccl_version % 100,
               runtime_version / 1000, runtime_version % 1000 / 10);
  return MNCL_OK;
}

void nccl_finalize(void) {
  kit::release_live_comms();
  g_host = nullptr;
}

// 0 without a GPU or with more ranks on this host than GPUs (NCCL takes one GPU per rank);
// otherwise 90: above the host backends, which stage CUDA buffers through host memory.
mncl_status_t nccl_probe(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                         size_t reason_len) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    *score = 0;
    kit::copy_cstr(reason, reason_len,
                   kit::format("no CUDA device (cudaGetDeviceCount: %s)",
                               e == cudaSuccess ? "0 devices" : cudaGetErrorString(e))
                       .c_str());
    return MNCL_OK;
  }
  // More ranks than visible GPUs is fine when the host has a GPU per rank and each process
  // sees its own subset (CUDA_VISIBLE_DEVICES per task); hwloc counts the host's GPUs.
  const bool per_process_gpus = info != nullptr && info->num_gpus >= info->local_size;
  if (info != nullptr && info->local_size > count && !per_process_gpus) {
    *score = 0;
    kit::copy_cstr(reason, reason_len,
                   kit::format("%d ranks on this host but only %d CUDA device%s (NCCL needs one "
                               "GPU per rank; gloo and naive stage CUDA buffers instead)",
                               info->local_size, count, count == 1 ? "" : "s")
                       .c_str());
    return MNCL_OK;
  }
  *score = 90;
  kit::copy_cstr(reason, reason_len,
                 kit::format("%d CUDA device%s", count, count == 1 ? "" : "s").c_str());
  return MNCL_OK;
}

mncl_status_t nccl_comm_create(const mncl_bootstrap_v1_t *bs, void **comm) {
  return kit::create_comm(g_host, "nccl", bs, comm, [&] { return new Comm(*bs, g_host); });
}

// Never throws: falls back to ncclCommAbort.
mncl_status_t nccl_comm_destroy(void *comm) {
  return kit::destroy_comm<Comm>(g_host, "nccl comm_destroy", comm);
}

mncl_status_t nccl_comm_abort(void *comm) {
  return kit::abort_comm<Comm>(g_host, "nccl comm_abort", comm);
}

mncl_status_t nccl_execute(void *comm, const mncl_coll_v1_t *coll) {
  return kit::execute_on<Comm>(g_host, "nccl execute", comm, coll);
}

// The handle is a heap-held shared_ptr: the watchdog holds the same operation.
mncl_status_t nccl_post(void *comm, const mncl_coll_v1_t *coll, void **handle) {
  return kit::guard(g_host, "nccl post", [&] {
    *handle = new std::shared_ptr<Pending>(static_cast<Comm *>(comm)->post(*coll));
    return MNCL_OK;
  });
}

mncl_status_t nccl_test(void *comm, void *handle, int32_t *done) {
  auto *op = static_cast<std::shared_ptr<Pending> *>(handle);
  const mncl_status_t status = kit::guard(g_host, "nccl test", [&] {
    *done = static_cast<Comm *>(comm)->test(**op) ? 1 : 0;
    return MNCL_OK;
  });
  if (status != MNCL_OK) *done = 1;  // a failed operation is finished too
  if (*done) delete op;
  return status;
}

// Every kind: the coalesced allreduce as one NCCL group, allgatherv and alltoallv as grouped
// ncclSend/ncclRecv with a count per rank, gatherv and scatterv as grouped ncclSend/ncclRecv
// to and from the root, a batch of sends and receives as one group.
constexpr uint32_t kCollMask = MNCL_COLL_MASK_ALL_V5;

}  // namespace

// The exported tables: v5, and the same functions as v4, v3, v2 and v1 for older cores
// (kit::as_v4, as_v3 and as_v2 drop the kinds those versions lack). Positional initializers
// (C++17 has no designated ones): keep the field comments in sync with mncl_plugin_v5.h.
MNCL_PLUGIN_EXPORT const mncl_plugin_v5_t mncl_plugin_v5 = {
    sizeof(mncl_plugin_v5_t),  // struct_size
    MNCL_PLUGIN_MAGIC,         // magic
    MNCL_PLUGIN_ABI_V5,        // abi_version
    "nccl",                    // name
    "0.1.0 (NCCL " MNCL_NCCL_STR(NCCL_MAJOR) "." MNCL_NCCL_STR(NCCL_MINOR) "." MNCL_NCCL_STR(
        NCCL_PATCH) ")",  // version: the NCCL it was built against
    // caps: device pointers as they are, host buffers through device scratch memory,
    // enqueued on the caller's stream, post/test on CUDA events
    MNCL_CAP_CUDA_MEMORY | MNCL_CAP_HOST_MEMORY | MNCL_CAP_STREAM_ORDERED | MNCL_CAP_NATIVE_ASYNC,
    kCollMask,            // coll_mask: every kind
    kit::kAllDtypesMask,  // dtype_mask: all ten are NCCL types
    kit::kAllOpsMask,     // op_mask: avg is ncclAvg
    0,                    // reserved0
    nccl_init,            // init
    nccl_finalize,        // finalize
    nccl_probe,           // probe
    nccl_comm_create,     // comm_create
    nccl_comm_destroy,    // comm_destroy
    nccl_comm_abort,      // comm_abort
    nullptr,              // comm_split: the core's split + comm_create (a fresh NCCL id)
    nccl_execute,         // execute
    nccl_post,            // post
    nccl_test,            // test
};
MNCL_PLUGIN_EXPORT const mncl_plugin_v4_t mncl_plugin_v4 = kit::as_v4(mncl_plugin_v5);
MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = kit::as_v3(mncl_plugin_v4);
MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = kit::as_v2(mncl_plugin_v3);
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);

// libmncl-kitdemo.so: the smallest plugin on the installed kit, as a vendor would start one.
// One rank only (a collective of one rank copies its input), every kind of mncl_plugin_v1.h;
// the kit turns exceptions into statuses and makes comm_abort safe beside comm_destroy.
#include <mncl/mncl_plugin.h>

#include <cstring>

#include "common/dtype.h"
#include "common/host.h"
#include "common/tables.h"

namespace {

namespace kit = mncl::kit;
const mncl_host_v1_t *g_host = nullptr;

struct Comm {
  explicit Comm(const mncl_bootstrap_v1_t &bs) {
    if (bs.size != 1) throw kit::Error(MNCL_ERR_NOT_SUPPORTED, "kitdemo: one rank only");
  }
  void execute(const mncl_coll_v1_t &c) {
    const size_t bytes = kit::dtype_size(c.dtype) * c.count;
    switch (c.kind) {
      case MNCL_COLL_BARRIER:
      case MNCL_COLL_BCAST:
        return;
      case MNCL_COLL_ALLREDUCE:
      case MNCL_COLL_REDUCE:
      case MNCL_COLL_ALLGATHER:
      case MNCL_COLL_REDUCE_SCATTER:
      case MNCL_COLL_SCATTER:
      case MNCL_COLL_GATHER:
      case MNCL_COLL_ALLTOALL:
        if (c.recvbuf != c.sendbuf && bytes > 0) std::memmove(c.recvbuf, c.sendbuf, bytes);
        return;
      default:
        throw kit::Error(MNCL_ERR_NOT_SUPPORTED, "kitdemo: no such collective here");
    }
  }
  void abort() {}  // nothing here ever waits for a peer
};

mncl_status_t demo_init(const mncl_host_v1_t *host) {
  if (!kit::host_is_usable(host)) return MNCL_ERR_PLUGIN;
  g_host = host;
  return MNCL_OK;
}
void demo_finalize(void) {
  kit::release_live_comms();
  g_host = nullptr;
}
mncl_status_t demo_probe(const mncl_probe_v1_t *info, int32_t *score, char *reason,
                         size_t reason_len) {
  *score = info->size == 1 ? 20 : 0;
  kit::copy_cstr(reason, reason_len, info->size == 1 ? "" : "one rank only");
  return MNCL_OK;
}
mncl_status_t demo_comm_create(const mncl_bootstrap_v1_t *bs, void **comm) {
  return kit::create_comm(g_host, "kitdemo", bs, comm, [&] { return new Comm(*bs); });
}
mncl_status_t demo_comm_destroy(void *comm) {
  return kit::destroy_comm<Comm>(g_host, "kitdemo comm_destroy", comm);
}
mncl_status_t demo_comm_abort(void *comm) {
  return kit::abort_comm<Comm>(g_host, "kitdemo comm_abort", comm);
}
mncl_status_t demo_execute(void *comm, const mncl_coll_v1_t *coll) {
  return kit::execute_on<Comm>(g_host, "kitdemo execute", comm, coll);
}

}  // namespace

MNCL_PLUGIN_EXPORT const mncl_plugin_v2_t mncl_plugin_v2 = {sizeof(mncl_plugin_v2_t),
                                                            MNCL_PLUGIN_MAGIC,
                                                            MNCL_PLUGIN_ABI_V2,
                                                            "kitdemo",
                                                            "0.1.0",
                                                            MNCL_CAP_HOST_MEMORY,
                                                            MNCL_COLL_MASK_ALL_V1,
                                                            kit::kAllDtypesMask,
                                                            kit::kAllOpsMask,
                                                            0,
                                                            demo_init,
                                                            demo_finalize,
                                                            demo_probe,
                                                            demo_comm_create,
                                                            demo_comm_destroy,
                                                            demo_comm_abort,
                                                            nullptr,
                                                            demo_execute,
                                                            nullptr,
                                                            nullptr};
MNCL_PLUGIN_EXPORT const mncl_plugin_v1_t mncl_plugin_v1 = kit::as_v1(mncl_plugin_v2);

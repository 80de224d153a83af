#include "topology/summary.h"

namespace mncl::topology {

const char *nic_kind_name(NicKind kind) {
  switch (kind) {
    case NicKind::kInfiniBand:
      return "InfiniBand";
    case NicKind::kRoCE:
      return "RoCE";
    case NicKind::kEthernet:
      return "Ethernet";
  }
  return "?";
}

bool Summary::has_infiniband() const {
  for (const Nic &nic : nics) {
    if (nic.kind != NicKind::kEthernet && nic.port_active) return true;
  }
  return false;
}

const Gpu *Summary::gpu(int ordinal) const {
  for (const Gpu &g : gpus) {
    if (g.ordinal == ordinal) return &g;
  }
  return nullptr;
}

}  // namespace mncl::topology

#include "topology/report.h"

#include "common/error.h"

namespace mncl::topology {

namespace {

std::string count(size_t n, const char *what) {
  return format("%zu %s%s", n, what, n == 1 ? "" : "s");
}

std::string gib(uint64_t bytes) {
  return format("%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

std::string where(const Locality &l) {
  std::string out = l.numa >= 0 ? format("NUMA node %d, ", l.numa) : "";
  return out + "CPUs " + (l.cpus.empty() ? "?" : l.cpus.to_string());
}

std::string joined(const std::vector<std::string> &items) {
  std::string out;
  for (const auto &s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace

std::string one_line(const Summary &s) {
  size_t verbs = 0;
  for (const auto &nic : s.nics) verbs += nic.kind != NicKind::kEthernet;
  return format(
      "%s: %s, %s, %s, %s, %s, %s", s.hostname.empty() ? "(unknown host)" : s.hostname.c_str(),
      count(s.packages, "package").c_str(), count(s.numa_nodes.size(), "NUMA node").c_str(),
      count(s.cores.size(), "core").c_str(), count(s.all_cpus.size(), "PU").c_str(),
      s.gpus.empty() ? "no NVIDIA GPU" : count(s.gpus.size(), "NVIDIA GPU").c_str(),
      s.has_infiniband() ? count(verbs, "InfiniBand/RoCE device").c_str()
      : verbs > 0        ? "InfiniBand/RoCE ports down"
                         : "no InfiniBand");
}

std::string describe(const Summary &s) {
  std::string out;
  out += format("  source       %s\n", s.source.c_str());
  out += format("  host         %s\n", s.hostname.empty() ? "(unknown)" : s.hostname.c_str());
  out += format("  CPU          %s%s%s, %s, %s (CPUs %s)\n", s.cpu_model.c_str(),
                s.cpu_model.empty() ? "" : ": ", count(s.packages, "package").c_str(),
                count(s.cores.size(), "core").c_str(), count(s.all_cpus.size(), "PU").c_str(),
                s.all_cpus.to_string().c_str());
  out += format("  NUMA nodes   %zu\n", s.numa_nodes.size());
  for (const auto &n : s.numa_nodes) {
    out += format("    node %-6d %s, CPUs %s\n", n.os_index, gib(n.memory_bytes).c_str(),
                  n.cpus.empty() ? "none" : n.cpus.to_string().c_str());
  }
  if (s.gpus.empty()) {
    out += "  GPUs         none (no NVIDIA GPU)\n";
  } else {
    out += format("  GPUs         %zu NVIDIA\n", s.gpus.size());
    for (const auto &g : s.gpus) {
      out += format("    GPU %-7d %s  %s [10de:%04x]  %s%s%s%s%s\n", g.ordinal,
                    g.pci_bus_id.c_str(), g.model.empty() ? "NVIDIA GPU" : g.model.c_str(),
                    g.device_id, where(g.locality).c_str(), g.os_devices.empty() ? "" : "  ",
                    joined(g.os_devices).c_str(), g.uuid.empty() ? "" : "  ", g.uuid.c_str());
    }
    if (!s.gpu_order_caveat.empty()) out += format("    note: %s\n", s.gpu_order_caveat.c_str());
  }
  if (s.nics.empty()) {
    out += "  NICs         none seen\n";
  } else {
    out += format("  NICs         %zu\n", s.nics.size());
    for (const auto &nic : s.nics) {
      std::string state = nic.kind == NicKind::kEthernet ? ""
                          : nic.port_active              ? " (active)"
                                                         : " (ports down)";
      out += format("    %-11s %s%s  %s  %s%s%s\n", nic.name.c_str(), nic_kind_name(nic.kind),
                    state.c_str(), nic.pci_bus_id.empty() ? "-" : nic.pci_bus_id.c_str(),
                    where(nic.locality).c_str(), nic.netdevs.empty() ? "" : "  netdev ",
                    joined(nic.netdevs).c_str());
    }
  }
  out += format("  InfiniBand   %s\n", s.has_infiniband() ? "yes (verbs usable)" : "no");
  return out;
}

}  // namespace mncl::topology

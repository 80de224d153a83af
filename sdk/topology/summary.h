// What MNCL knows about one host: the summary of its hwloc topology that the backend rules,
// the process-binding rules, the plugin probes and mncl-info use. Plain data (no hwloc types),
// so tests can build one by hand and the rules stay pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/cpuset.h"

namespace mncl::topology {

struct NumaNode {
  int os_index = -1;          // Linux node number (numactl -N)
  uint64_t memory_bytes = 0;  // local memory
  // PUs local to it. hwloc 2 gives a memory-only node (HBM, CXL) the PUs of the object it hangs
  // from: those of a node with CPUs of its own, or of several (binding.cpp tells them apart).
  CpuSet cpus;
};

struct Core {
  int os_index = -1;
  int package = -1;  // package (socket) logical index, 0..packages-1
  int numa = -1;     // os_index of its NUMA node (-1: several or none)
  CpuSet pus;        // its hardware threads
};

// Locality of a PCI device: the PUs of its closest non-I/O ancestor (a NUMA node, a group of
// them, a package or the whole machine) and its NUMA node when that is a single one.
struct Locality {
  CpuSet cpus;
  int numa = -1;  // os_index; -1 when the device is attached above several NUMA nodes
};

struct Gpu {
  // CUDA ordinal: hwloc's cudaN if present, else PCI order as CUDA_VISIBLE_DEVICES renumbers
  // it (only the devices it lists, by index or UUID); see gpu_inventory.h.
  int ordinal = -1;
  std::string pci_bus_id;  // "0000:07:00.0", the form nvidia-smi and NCCL print
  std::string uuid;        // "GPU-8f9e3c1a-...", "" when unknown
  uint16_t device_id = 0;  // PCI device id (vendor is always 0x10de)
  std::string model;       // "NVIDIA A100-SXM4-80GB" when hwloc knows it, else ""
  // "cuda0", "nvml0", "card1"... as hwloc named them; "nvidia3": its NVIDIA device node
  std::vector<std::string> os_devices;
  Locality locality;
};

enum class NicKind {
  // OpenFabrics (verbs) devices. The link layer comes from sysfs on the live machine; in an XML
  // topology (hwloc 2.9 does not record it) a port with a LID is InfiniBand, LID 0 is RoCE.
  kInfiniBand,
  kRoCE,      // RDMA over Converged Ethernet
  kEthernet,  // plain network device, sockets only (also Wi-Fi and IPoIB-less ports)
};
const char *nic_kind_name(NicKind kind);

struct Nic {
  std::string name;  // OpenFabrics device ("mlx5_0") or network interface ("eth0")
  NicKind kind = NicKind::kEthernet;
  std::string pci_bus_id;            // "" when not behind a PCI device hwloc saw
  std::vector<std::string> netdevs;  // network interfaces of the same device ("ib0")
  bool port_active = true;           // OpenFabrics: some port ACTIVE (or state unknown)
  Locality locality;
};

struct Summary {
  std::string source;           // "this machine" or "XML file <path>"
  bool is_this_system = false;  // false for an XML topology: never bind from it
  std::string hostname;         // host identity, the key ranks are grouped by
  std::string cpu_model;        // first package's CPUModel ("AMD EPYC 7742 64-Core Processor")
  int packages = 0;
  std::vector<NumaNode> numa_nodes;  // by os_index
  std::vector<Core> cores;           // in hwloc's logical order (package, then NUMA node)
  CpuSet all_cpus;                   // every PU this process may use
  // PUs the kernel keeps off the scheduler (isolcpus=): outside every process's default
  // affinity, used only by threads pinned there on purpose. Never in a binding MNCL makes.
  CpuSet isolated_cpus;
  std::vector<Gpu> gpus;         // NVIDIA GPUs, by ordinal
  std::string gpu_order_caveat;  // why the ordinals may not be CUDA's; "" when they are
  std::vector<Nic> nics;         // OpenFabrics devices first, then plain network devices

  int num_pus() const { return static_cast<int>(all_cpus.size()); }
  int num_cores() const { return static_cast<int>(cores.size()); }
  int num_gpus() const { return static_cast<int>(gpus.size()); }
  // An InfiniBand or RoCE device with an active (or unknown-state) port: verbs can be used.
  bool has_infiniband() const;
  const Gpu *gpu(int ordinal) const;  // nullptr when there is no GPU of that ordinal
};

}  // namespace mncl::topology

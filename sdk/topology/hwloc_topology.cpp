#include "topology/hwloc_topology.h"

#include <dirent.h>
#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "topology/gpu_inventory.h"

namespace mncl::topology {

struct Topology::Handle {
  hwloc_topology_t topo = nullptr;
  ~Handle() {
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }
};

namespace {

constexpr unsigned kNvidiaVendor = 0x10de;

CpuSet to_cpuset(hwloc_const_bitmap_t bitmap) {
  std::vector<int> pus;
  if (bitmap == nullptr || hwloc_bitmap_iszero(bitmap)) return CpuSet();
  if (hwloc_bitmap_weight(bitmap) < 0) return CpuSet();  // infinite: not a real set of PUs
  for (int pu = hwloc_bitmap_first(bitmap); pu >= 0; pu = hwloc_bitmap_next(bitmap, pu)) {
    pus.push_back(pu);
  }
  return CpuSet(std::move(pus));
}

// The NUMA node of an object whose nodeset holds exactly one node; -1 otherwise.
int single_numa(hwloc_obj_t obj) {
  if (obj == nullptr || obj->nodeset == nullptr || hwloc_bitmap_weight(obj->nodeset) != 1) {
    return -1;
  }
  return hwloc_bitmap_first(obj->nodeset);
}

std::string info(hwloc_obj_t obj, const char *name) {
  const char *value = obj ? hwloc_obj_get_info_by_name(obj, name) : nullptr;
  return value ? value : "";
}

std::string bus_id(hwloc_obj_t pci) {
  const auto &a = pci->attr->pcidev;
  return format("%04x:%02x:%02x.%x", static_cast<unsigned>(a.domain), a.bus, a.dev, a.func);
}

Locality locality_of(hwloc_topology_t topo, hwloc_obj_t io_obj) {
  Locality where;
  // I/O objects have no cpuset: their locality is their first non-I/O ancestor's.
  hwloc_obj_t anchor = hwloc_get_non_io_ancestor_obj(topo, io_obj);
  if (anchor != nullptr) {
    where.cpus = to_cpuset(anchor->cpuset);
    where.numa = single_numa(anchor);
  }
  return where;
}

// The PCI device an OS device hangs from, if any.
hwloc_obj_t pci_parent(hwloc_obj_t osdev) {
  hwloc_obj_t parent = osdev->parent;
  return parent != nullptr && parent->type == HWLOC_OBJ_PCI_DEVICE ? parent : nullptr;
}

std::vector<hwloc_obj_t> os_children(hwloc_obj_t obj) {
  std::vector<hwloc_obj_t> out;
  for (hwloc_obj_t c = obj ? obj->io_first_child : nullptr; c != nullptr; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_OS_DEVICE) out.push_back(c);
  }
  return out;
}

// hwloc's NVIDIA GPUs, with `ordinal` set to hwloc's cudaN index where its CUDA component
// named one, else -1; gpu_inventory.h turns them into this process's GPUs.
std::vector<Gpu> read_gpus(hwloc_topology_t topo) {
  std::vector<Gpu> gpus;
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci != nullptr;
       pci = hwloc_get_next_pcidev(topo, pci)) {
    const auto &a = pci->attr->pcidev;
    // Class 0x03xx: VGA / 3D controller. NVSwitches (0x0680) and audio functions are not GPUs.
    if (a.vendor_id != kNvidiaVendor || (a.class_id >> 8) != 0x03) continue;
    Gpu gpu;
    gpu.pci_bus_id = bus_id(pci);
    gpu.device_id = a.device_id;
    gpu.model = info(pci, "PCIDevice");
    gpu.locality = locality_of(topo, pci);
    for (hwloc_obj_t os : os_children(pci)) {
      gpu.os_devices.push_back(os->name ? os->name : "?");
      if (const std::string model = info(os, "GPUModel"); !model.empty()) gpu.model = model;
      // hwloc's NVML component (not in Debian's hwloc) records the UUID.
      if (const std::string uuid = info(os, "NVIDIAUUID"); !uuid.empty()) gpu.uuid = uuid;
      if (os->name && std::strncmp(os->name, "cuda", 4) == 0) gpu.ordinal = std::atoi(os->name + 4);
    }
    gpus.push_back(gpu);
  }
  return gpus;
}

// hwloc 2.9 records no link layer for OpenFabrics ports: ask sysfs on the live machine; in an
// XML topology, a port with a LID assigned by a subnet manager is InfiniBand (RoCE has LID 0).
NicKind verbs_kind(hwloc_obj_t os, bool live) {
  bool lid_seen = false, lid_nonzero = false;
  for (int port = 1; port <= 8; ++port) {
    if (live) {
      std::ifstream in(format("/sys/class/infiniband/%s/ports/%d/link_layer", os->name, port));
      std::string layer;
      if (in >> layer) return layer == "Ethernet" ? NicKind::kRoCE : NicKind::kInfiniBand;
    }
    const std::string lid = info(os, format("Port%dLID", port).c_str());
    if (lid.empty()) continue;
    lid_seen = true;
    lid_nonzero = lid_nonzero || std::strtoul(lid.c_str(), nullptr, 0) != 0;
  }
  return lid_seen && !lid_nonzero ? NicKind::kRoCE : NicKind::kInfiniBand;
}

// mlx5_2 before mlx5_10: shorter names first, then alphabetical.
void sort_by_name(std::vector<Nic>::iterator first, std::vector<Nic>::iterator last) {
  std::stable_sort(first, last, [](const Nic &a, const Nic &b) {
    return a.name.size() != b.name.size() ? a.name.size() < b.name.size() : a.name < b.name;
  });
}

void read_nics(hwloc_topology_t topo, Summary &s) {
  std::vector<hwloc_obj_t> verbs_parents;  // PCI devices already described by a verbs device
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os != nullptr;
       os = hwloc_get_next_osdev(topo, os)) {
    if (os->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || os->name == nullptr) continue;
    Nic nic;
    nic.name = os->name;
    nic.kind = verbs_kind(os, s.is_this_system);
    bool any_state = false, any_active = false;
    for (int port = 1; port <= 8; ++port) {
      const std::string state = info(os, format("Port%dState", port).c_str());
      if (!state.empty()) {
        any_state = true;
        any_active = any_active || state == "4";  // IB_PORT_ACTIVE
      }
    }
    nic.port_active = !any_state || any_active;
    hwloc_obj_t pci = pci_parent(os);
    if (pci != nullptr) {
      nic.pci_bus_id = bus_id(pci);
      verbs_parents.push_back(pci);
      for (hwloc_obj_t sib : os_children(pci)) {
        if (sib->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && sib->name) {
          nic.netdevs.push_back(sib->name);
        }
      }
    }
    nic.locality = locality_of(topo, pci ? pci : os);
    s.nics.push_back(nic);
  }
  sort_by_name(s.nics.begin(), s.nics.end());
  const size_t verbs = s.nics.size();
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os != nullptr;
       os = hwloc_get_next_osdev(topo, os)) {
    if (os->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK) continue;
    hwloc_obj_t pci = pci_parent(os);
    if (pci && std::count(verbs_parents.begin(), verbs_parents.end(), pci)) continue;
    Nic nic;
    nic.name = os->name ? os->name : "?";
    nic.kind = NicKind::kEthernet;
    if (pci != nullptr) nic.pci_bus_id = bus_id(pci);
    nic.locality = locality_of(topo, pci ? pci : os);
    s.nics.push_back(nic);
  }
  sort_by_name(s.nics.begin() + static_cast<long>(verbs), s.nics.end());
}

Summary summarize(hwloc_topology_t topo, const std::string &source) {
  Summary s;
  s.source = source;
  s.is_this_system = hwloc_topology_is_thissystem(topo) == 1;
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  s.hostname = info(root, "HostName");
  if (s.hostname.empty() && s.is_this_system) {
    char name[256] = "";
    if (::gethostname(name, sizeof name - 1) == 0) s.hostname = name;
  }
  s.all_cpus = to_cpuset(hwloc_topology_get_topology_cpuset(topo));
  if (s.is_this_system) {
    std::string isolated;
    std::getline(std::ifstream("/sys/devices/system/cpu/isolated"), isolated);
    try {
      s.isolated_cpus = CpuSet::parse(isolated) & s.all_cpus;
    } catch (const std::exception &) {
      s.isolated_cpus = CpuSet();  // unreadable: none known
    }
  }
  s.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  if (s.packages > 0) {
    s.cpu_model = info(hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0), "CPUModel");
  }
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) {
    NumaNode node;
    node.os_index = static_cast<int>(n->os_index);
    node.memory_bytes = n->attr ? n->attr->numanode.local_memory : 0;
    node.cpus = to_cpuset(n->cpuset);
    s.numa_nodes.push_back(node);
  }
  std::sort(s.numa_nodes.begin(), s.numa_nodes.end(),
            [](const NumaNode &a, const NumaNode &b) { return a.os_index < b.os_index; });
  // Platforms without Core objects get one core per PU.
  const hwloc_obj_type_t core_type =
      hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (hwloc_obj_t c = hwloc_get_next_obj_by_type(topo, core_type, nullptr); c != nullptr;
       c = hwloc_get_next_obj_by_type(topo, core_type, c)) {
    Core core;
    core.os_index = static_cast<int>(c->os_index);
    hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, c);
    core.package = package ? static_cast<int>(package->logical_index) : 0;
    core.numa = single_numa(c);
    core.pus = to_cpuset(c->cpuset);
    if (!core.pus.empty()) s.cores.push_back(core);
  }
  // Only on the live machine does the NVIDIA driver's view describe the topology's GPUs.
  std::vector<Gpu> seen = read_gpus(topo);
  const size_t seen_by_hwloc = seen.size();
  const auto driver = s.is_this_system ? read_driver_gpus() : std::nullopt;
  s.gpus = number_gpus(std::move(seen), driver, std::getenv("CUDA_VISIBLE_DEVICES"),
                       std::getenv("CUDA_DEVICE_ORDER"), &s.gpu_order_caveat);
  if (driver && driver->size() != seen_by_hwloc) {
    MNCL_INFO("hwloc sees %zu NVIDIA GPU(s), the NVIDIA driver %zu; this process can use %zu",
              seen_by_hwloc, driver->size(), s.gpus.size());
  }
  read_nics(topo, s);
  return s;
}

hwloc_topology_t new_topology() {
  hwloc_topology_t topo = nullptr;
  MNCL_CHECK(hwloc_topology_init(&topo) == 0, MNCL_ERR_SYSTEM, "hwloc_topology_init failed: %s",
             std::strerror(errno));
  // PCI GPUs and NICs and their OS devices; bridges only where they hold one of those.
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  return topo;
}

}  // namespace

Topology::Topology(std::unique_ptr<Handle> handle, const std::string &source)
    : handle_(std::move(handle)), summary_(summarize(handle_->topo, source)) {}

Topology::~Topology() = default;

std::unique_ptr<Topology> Topology::load_this_machine() {
  auto handle = std::make_unique<Handle>();
  handle->topo = new_topology();
  MNCL_CHECK(hwloc_topology_load(handle->topo) == 0, MNCL_ERR_SYSTEM,
             "hwloc could not read this machine's topology: %s", std::strerror(errno));
  // hwloc itself honours HWLOC_XMLFILE; say so, or the summary would pass for this machine.
  const auto xml = env::get("HWLOC_XMLFILE");
  const bool from_xml = xml && hwloc_topology_is_thissystem(handle->topo) != 1;
  // hwloc falls back to this machine, silently, when it cannot read the file.
  if (xml && !from_xml) {
    MNCL_WARN("HWLOC_XMLFILE=%s could not be loaded (hwloc read this machine instead)",
              xml->c_str());
  }
  const std::string source = from_xml ? "XML file " + *xml + " (HWLOC_XMLFILE)" : "this machine";
  return std::unique_ptr<Topology>(new Topology(std::move(handle), source));
}

std::unique_ptr<Topology> Topology::load_xml(const std::string &path) {
  // hwloc's own message for a missing file is a bare -1: check first, to name the file.
  MNCL_CHECK(std::ifstream(path).good(), MNCL_ERR_SYSTEM, "cannot read topology file '%s': %s",
             path.c_str(), std::strerror(errno));
  auto handle = std::make_unique<Handle>();
  handle->topo = new_topology();
  MNCL_CHECK(hwloc_topology_set_xml(handle->topo, path.c_str()) == 0 &&
                 hwloc_topology_load(handle->topo) == 0,
             MNCL_ERR_SYSTEM, "hwloc could not load the XML topology '%s' (is it hwloc XML?)",
             path.c_str());
  return std::unique_ptr<Topology>(new Topology(std::move(handle), "XML file " + path));
}

CpuSet Topology::current_binding() const {
  if (!summary_.is_this_system) return CpuSet();
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  CpuSet out;
  if (set != nullptr && hwloc_get_cpubind(handle_->topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
    out = to_cpuset(set);
  }
  hwloc_bitmap_free(set);
  return out;
}

bool Topology::threads_bound_apart() const {
  if (!summary_.is_this_system) return false;
  // OpenMP (OMP_PROC_BIND) binds the initial thread to its first place and the others to the
  // rest: the main thread holds fewer CPUs than its threads together. NCCL's init, which gives
  // its own threads the GPU's CPUs and restores the caller's, leaves the main thread alone.
  cpu_set_t main_thread, all;
  CPU_ZERO(&all);
  if (sched_getaffinity(::getpid(), sizeof main_thread, &main_thread) != 0) return false;
  DIR *tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return false;
  while (const dirent *entry = ::readdir(tasks)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(entry->d_name));
    cpu_set_t mask;
    if (tid <= 0 || sched_getaffinity(tid, sizeof mask, &mask) != 0) continue;  // gone since
    CPU_OR(&all, &all, &mask);
  }
  ::closedir(tasks);
  return !CPU_EQUAL(&main_thread, &all);
}

void Topology::bind(const CpuSet &cpus) const {
  MNCL_CHECK(summary_.is_this_system, MNCL_ERR_INVALID_ARGUMENT,
             "cannot bind from a topology that is not this machine's (%s)",
             summary_.source.c_str());
  MNCL_CHECK(!cpus.empty(), MNCL_ERR_INVALID_ARGUMENT, "cannot bind to an empty set of CPUs");
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  MNCL_CHECK(set != nullptr, MNCL_ERR_SYSTEM, "out of memory");
  for (int pu : cpus.pus()) hwloc_bitmap_set(set, static_cast<unsigned>(pu));
  const int rc = hwloc_set_cpubind(handle_->topo, set, HWLOC_CPUBIND_PROCESS);
  const int err = errno;
  hwloc_bitmap_free(set);
  MNCL_CHECK(rc == 0, MNCL_ERR_SYSTEM, "binding to CPUs %s failed: %s", cpus.to_string().c_str(),
             std::strerror(err));
}

const Topology *this_machine() {
  static std::once_flag once;
  static std::unique_ptr<Topology> topology;
  std::call_once(once, [] {
    try {
      topology = Topology::load_this_machine();
    } catch (const Error &e) {
      MNCL_WARN("%s; choosing the backend without topology information", e.what());
    }
  });
  return topology.get();
}

Binding bind_this_process(const Topology *machine, BindRequest request) {
  static std::mutex mutex;
  static bool done = false;
  static Binding first;
  std::lock_guard<std::mutex> lock(mutex);
  if (done) return first;
  done = true;
  if (machine == nullptr) {
    first.reason = "topology unknown: not bound";
  } else {
    request.current = machine->current_binding();
    request.threads_bound_apart = machine->threads_bound_apart();
    first = compute_binding(machine->summary(), request);
    if (!first.cpus.empty() && !machine->summary().is_this_system) {
      first.reason +=
          format(" [not applied: the topology is %s]", machine->summary().source.c_str());
      first.cpus = CpuSet();
    }
    if (!first.cpus.empty()) {
      try {
        machine->bind(first.cpus);
      } catch (const Error &e) {
        MNCL_WARN("process binding: %s: %s", first.reason.c_str(), e.what());
        first.reason += " [failed: " + std::string(e.what()) + "]";
        first.cpus = CpuSet();
        return first;
      }
    }
  }
  MNCL_INFO("process binding: %s", first.reason.c_str());
  return first;
}

}  // namespace mncl::topology

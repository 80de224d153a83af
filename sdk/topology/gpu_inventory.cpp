#include "topology/gpu_inventory.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "common/env.h"

namespace mncl::topology {

namespace {

std::string trimmed(std::string text) {
  text.erase(0, text.find_first_not_of(" \t\r\n"));
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  return text;
}

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Whether this process may open a device node for reading and writing; nothing is opened.
bool may_open(const std::string &path) {
  return ::access(path.c_str(), R_OK | W_OK) == 0;
}

// The first line of a small sysfs file, trimmed; "" when it cannot be read.
std::string first_line(const std::string &path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return trimmed(line);
}

// "Key:   value" lines of the driver's information file.
bool read_information(const std::string &path, DriverGpu &gpu) {
  std::ifstream in(path);
  if (!in) return false;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trimmed(line.substr(0, colon));
    const std::string value = trimmed(line.substr(colon + 1));
    if (key == "Model") {
      gpu.model = value;
    } else if (key == "GPU UUID") {
      gpu.uuid = value;
    } else if (key == "GPU Excluded") {
      gpu.excluded = value == "Yes";
    } else if (key == "Device Minor") {
      char *end = nullptr;
      const long minor = std::strtol(value.c_str(), &end, 10);
      if (end != value.c_str() && *end == '\0' && minor >= 0 && minor < 4096) {
        gpu.minor = static_cast<int>(minor);
      }
    }
  }
  return true;
}

// What sysfs says of the PCI function; the driver's file has no locality.
void read_sysfs(const std::string &folder, DriverGpu &gpu) {
  try {
    gpu.locality.cpus = CpuSet::parse(first_line(folder + "/local_cpulist"));
  } catch (const std::exception &) {
    gpu.locality.cpus = CpuSet();
  }
  const std::string numa = first_line(folder + "/numa_node");
  if (!numa.empty() && numa.find_first_not_of("0123456789") == std::string::npos) {
    gpu.locality.numa = std::atoi(numa.c_str());
  }
  const std::string device = first_line(folder + "/device");  // "0x20b0"
  if (device.size() > 2 && device.compare(0, 2, "0x") == 0) {
    gpu.device_id = static_cast<uint16_t>(std::strtoul(device.c_str() + 2, nullptr, 16));
  }
}

// The driver's record for a PCI address, or nullptr.
const DriverGpu *find_by_bus_id(const std::vector<DriverGpu> &gpus, const std::string &bus_id) {
  const std::string wanted = env::lower(bus_id);
  for (const DriverGpu &g : gpus) {
    if (g.pci_bus_id == wanted) return &g;
  }
  return nullptr;
}

// hwloc's view checked against the driver's: only reachable GPUs the driver manages remain,
// with what the driver adds (UUID, its model name, the device node), and the reachable GPUs
// hwloc did not see are added.
std::vector<Gpu> reconcile(std::vector<Gpu> seen, const std::vector<DriverGpu> &driver) {
  std::vector<Gpu> kept;
  for (Gpu &gpu : seen) {
    const DriverGpu *known = find_by_bus_id(driver, gpu.pci_bus_id);
    if (known == nullptr || !known->reachable || known->excluded) continue;
    if (!known->model.empty()) gpu.model = known->model;
    if (!known->uuid.empty()) gpu.uuid = known->uuid;
    if (known->minor >= 0) gpu.os_devices.push_back("nvidia" + std::to_string(known->minor));
    kept.push_back(std::move(gpu));
  }
  for (const DriverGpu &known : driver) {
    if (!known.reachable || known.excluded) continue;
    const bool seen_by_hwloc = std::any_of(kept.begin(), kept.end(), [&](const Gpu &g) {
      return env::lower(g.pci_bus_id) == known.pci_bus_id;
    });
    if (seen_by_hwloc) continue;
    Gpu gpu;
    gpu.pci_bus_id = known.pci_bus_id;
    gpu.uuid = known.uuid;
    gpu.model = known.model;
    gpu.device_id = known.device_id;
    gpu.locality = known.locality;
    if (known.minor >= 0) gpu.os_devices.push_back("nvidia" + std::to_string(known.minor));
    kept.push_back(std::move(gpu));  // ordinal -1: hwloc's CUDA numbering, if any, lacks it
  }
  return kept;
}

// The positions (into `gpus`, in PCI order) CUDA_VISIBLE_DEVICES selects, in its order, read as
// CUDA reads it (PyTorch's parser mirrors it): the first entry decides whether the list holds
// indices or UUIDs; an index is the number its entry starts with ("1gpu" is 1); the list ends
// at an entry of the other kind, a negative or out-of-range index, or a UUID prefix naming no
// device or several; a device listed twice hides every device. nullopt when the list cannot
// be mapped here: MIG-..., or UUIDs while the GPUs' UUIDs are unknown.
std::optional<std::vector<size_t>> visible_positions(const std::string &value,
                                                     const std::vector<Gpu> &gpus) {
  std::vector<std::string> entries;
  std::stringstream in(value);
  for (std::string item; std::getline(in, item, ',');) entries.push_back(trimmed(item));
  const bool by_uuid = !entries.empty() && entries.front().compare(0, 4, "GPU-") == 0;
  if (!entries.empty() && entries.front().compare(0, 4, "MIG-") == 0) return std::nullopt;
  if (by_uuid &&
      !std::all_of(gpus.begin(), gpus.end(), [](const Gpu &g) { return !g.uuid.empty(); })) {
    return std::nullopt;
  }
  std::vector<size_t> positions;
  for (const std::string &entry : entries) {
    size_t position = gpus.size();
    if (by_uuid) {
      if (entry.compare(0, 4, "GPU-") != 0) break;
      size_t matches = 0;
      for (size_t i = 0; i < gpus.size(); ++i) {
        if (env::lower(gpus[i].uuid).compare(0, entry.size(), env::lower(entry)) == 0) {
          position = i;
          ++matches;
        }
      }
      if (matches != 1) break;
    } else {
      const size_t digits = entry.find_first_not_of("0123456789");
      if (digits == 0 || entry.empty()) break;  // "-1", "", "GPU-...": the list ends
      position = std::strtoul(entry.c_str(), nullptr, 10);
      if (position >= gpus.size()) break;
    }
    if (std::find(positions.begin(), positions.end(), position) != positions.end())
      return std::vector<size_t>{};
    positions.push_back(position);
  }
  return positions;
}

}  // namespace

std::optional<std::vector<DriverGpu>> read_driver_gpus(const DriverPaths &paths) {
  DIR *folder = ::opendir(paths.gpus.c_str());
  if (folder == nullptr) return std::nullopt;
  std::vector<DriverGpu> gpus;
  while (const dirent *entry = ::readdir(folder)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.') continue;
    DriverGpu gpu;
    gpu.pci_bus_id = env::lower(name);
    if (!read_information(paths.gpus + "/" + name + "/information", gpu)) continue;
    read_sysfs(paths.pci_devices + "/" + name, gpu);
    gpus.push_back(std::move(gpu));
  }
  ::closedir(folder);
  // The driver's nodes are made once it is in use (udev, nvidia-modprobe, or a container
  // runtime that passes some through): from then on a GPU without its node is not ours.
  const bool nodes_made = exists(paths.dev + "/nvidiactl");
  for (DriverGpu &gpu : gpus) {
    gpu.reachable = !nodes_made ||
                    (gpu.minor >= 0 && may_open(paths.dev + "/nvidia" + std::to_string(gpu.minor)));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const DriverGpu &a, const DriverGpu &b) { return a.pci_bus_id < b.pci_bus_id; });
  return gpus;
}

std::vector<Gpu> number_gpus(std::vector<Gpu> seen,
                             const std::optional<std::vector<DriverGpu>> &driver,
                             const char *cuda_visible_devices, const char *cuda_device_order,
                             std::string *order_caveat) {
  if (order_caveat != nullptr) order_caveat->clear();
  if (driver) seen = reconcile(std::move(seen), *driver);
  const bool hwloc_numbered =
      std::any_of(seen.begin(), seen.end(), [](const Gpu &g) { return g.ordinal >= 0; });
  std::vector<Gpu> numbered;
  if (hwloc_numbered) {
    // hwloc's CUDA component asked the CUDA runtime of this process, which numbers only the
    // devices CUDA_VISIBLE_DEVICES lets it see: the others are not this process's GPUs.
    for (const Gpu &g : seen) {
      if (g.ordinal >= 0) numbered.push_back(g);
    }
  } else {
    std::sort(seen.begin(), seen.end(), [](const Gpu &x, const Gpu &y) {
      return env::lower(x.pci_bus_id) < env::lower(y.pci_bus_id);
    });
    const auto visible = cuda_visible_devices != nullptr
                             ? visible_positions(cuda_visible_devices, seen)
                             : std::nullopt;
    // UUIDs name devices whatever CUDA's order; indices and the unfiltered list follow it.
    const bool by_uuid = visible && trimmed(cuda_visible_devices).compare(0, 4, "GPU-") == 0;
    // Device id 0: unknown (sysfs unreadable), which says nothing of the model.
    std::vector<uint16_t> models;
    for (const Gpu &g : seen) {
      if (g.device_id != 0) models.push_back(g.device_id);
    }
    const bool mixed = std::any_of(models.begin(), models.end(),
                                   [&](uint16_t id) { return id != models.front(); });
    const bool pci_order =
        cuda_device_order != nullptr && std::string(cuda_device_order) == "PCI_BUS_ID";
    if (order_caveat != nullptr && mixed && !pci_order && !by_uuid) {
      *order_caveat =
          "CUDA numbers GPUs of different models fastest first unless CUDA_DEVICE_ORDER="
          "PCI_BUS_ID, an order not known here: these ordinals are PCI order and may not be "
          "CUDA's";
    }
    if (visible) {
      for (size_t position : *visible) numbered.push_back(seen[position]);
    } else {
      numbered = std::move(seen);
    }
    for (size_t i = 0; i < numbered.size(); ++i) numbered[i].ordinal = static_cast<int>(i);
  }
  std::sort(numbered.begin(), numbered.end(),
            [](const Gpu &x, const Gpu &y) { return x.ordinal < y.ordinal; });
  return numbered;
}

}  // namespace mncl::topology

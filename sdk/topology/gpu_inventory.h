// Which NVIDIA GPUs this process can use, and their CUDA ordinals: hwloc's PCI view, corrected
// by what the NVIDIA kernel driver says in procfs and by CUDA_VISIBLE_DEVICES.
//
// hwloc alone gets it wrong in three common cases, each of which misplaces ranks (binding next
// to the wrong GPU) or picks the wrong memory type for MNCL_MEMORY=auto:
//  - hwloc sees no GPU at all (its PCI component disabled, HWLOC_COMPONENTS=-pci, or no
//    /sys/bus/pci in a sandbox) while the driver has some;
//  - in a container, hwloc reads the host's sysfs and sees every GPU of the host, though only
//    the ones given to the container (their /dev/nvidiaN nodes) can be used; GPUs bound to
//    another driver (vfio for a VM, nouveau) are not CUDA devices either;
//  - CUDA_VISIBLE_DEVICES=GPU-<uuid>,... (Slurm and Kubernetes set UUIDs) needs each GPU's UUID,
//    which only the driver knows (or hwloc's NVML component, absent from Debian's hwloc).
// The driver's procfs view needs no library: nothing is loaded into a process that never uses
// CUDA. Everything but read_driver_gpus is a pure function, tested without a GPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topology/summary.h"

namespace mncl::topology {

// One GPU as /proc/driver/nvidia/gpus/<bus id>/information describes it.
struct DriverGpu {
  std::string pci_bus_id;  // the folder's name: "0000:07:00.0" (lower-case hex)
  std::string model;       // "Model:" ("NVIDIA H100 80GB HBM3"), "" if absent
  std::string uuid;        // "GPU UUID:" ("GPU-8f9e3c1a-..."), "" if absent
  int minor = -1;          // "Device Minor:": the GPU's device node is /dev/nvidia<minor>
  // "GPU Excluded: Yes" (NVreg_ExcludedGpus): the driver keeps it from CUDA altogether.
  bool excluded = false;
  // Whether this process may open the GPU: its /dev/nvidia<minor> is there and readable and
  // writable for it (access(), which a device cgroup's rules answer too: Slurm's
  // ConstrainDevices), or the driver's nodes are not made yet (no /dev/nvidiactl: they are
  // made on first use, as on a host without udev rules, and then /dev tells nothing).
  bool reachable = true;
  uint16_t device_id = 0;  // PCI device id from sysfs, 0 if unreadable
  Locality locality;       // from sysfs (local_cpulist, numa_node); empty if unreadable
};

// Where read_driver_gpus looks; tests point it at folders of their own.
struct DriverPaths {
  std::string gpus = "/proc/driver/nvidia/gpus";
  std::string dev = "/dev";
  std::string pci_devices = "/sys/bus/pci/devices";
};

// The GPUs the NVIDIA kernel driver manages, in PCI order; nullopt when its procfs folder is
// absent or unreadable (no NVIDIA driver, or a container that hides it): then hwloc's view
// stands. Never throws; a GPU whose information file cannot be read is left out.
std::optional<std::vector<DriverGpu>> read_driver_gpus(const DriverPaths &paths = {});

// The process's GPUs, ordered and numbered by CUDA ordinal.
//  seen: hwloc's NVIDIA GPUs, with `ordinal` set to hwloc's cudaN index where its CUDA
//        component named one (it asked the CUDA runtime, so those numbers stand), else -1.
//  driver: read_driver_gpus() on the live machine; nullopt for an XML topology (another
//        machine's) or when the driver's view is unavailable.
//  cuda_visible_devices: the variable's value; nullptr when unset.
// With the driver's view, a GPU hwloc saw but the driver does not manage, excludes or this
// process cannot reach is left out, and a reachable GPU hwloc missed is added. Without hwloc's
// cudaN names the GPUs are numbered in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID), then as
// CUDA_VISIBLE_DEVICES renumbers them: by index, or by UUID (a unique prefix, as CUDA takes it)
// when the UUIDs are known. As in CUDA, the list ends at its first entry that names no device.
// A MIG-... entry, or a UUID without known UUIDs, cannot be mapped: every GPU, PCI order.
// PCI order is CUDA's own with CUDA_DEVICE_ORDER=PCI_BUS_ID, or among GPUs of one model; CUDA's
// default (FASTEST_FIRST) puts the fastest of mixed models first, which cannot be told from
// here: then *order_caveat (may be null) says so, and the ordinals are PCI order regardless.
std::vector<Gpu> number_gpus(std::vector<Gpu> seen,
                             const std::optional<std::vector<DriverGpu>> &driver,
                             const char *cuda_visible_devices,
                             const char *cuda_device_order = nullptr,
                             std::string *order_caveat = nullptr);

}  // namespace mncl::topology

// Topology-aware backend choice and process binding, driven by the hwloc XML topologies of
// this folder: each machine must yield the documented backend and binding (backend_rules.h,
// binding.h), and the ranks' agreement must follow agreement.h.
#include <gtest/gtest.h>
#include <mncl/mncl_plugin.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "topology/agreement.h"
#include "topology/backend_rules.h"
#include "topology/binding.h"
#include "topology/cpuset.h"
#include "topology/gpu_inventory.h"
#include "topology/hwloc_topology.h"
#include "topology/report.h"

namespace topo = mncl::topology;
using topo::BindMode;
using topo::Candidate;
using topo::CpuSet;
using topo::JobFacts;
using topo::MemoryType;
using topo::Rule;

namespace {

std::string xml(const char *name) {
  return std::string(MNCL_TOPOLOGY_DIR) + "/" + name;
}

// Each XML file is parsed once for the whole suite, as a process that sees every GPU (a
// CUDA_VISIBLE_DEVICES of the machine running the tests would hide some).
const topo::Summary &machine(const char *name) {
  static std::map<std::string, std::unique_ptr<topo::Topology>> loaded;
  auto &slot = loaded[name];
  if (!slot) {
    unsetenv("CUDA_VISIBLE_DEVICES");
    slot = topo::Topology::load_xml(xml(name));
  }
  return slot->summary();
}
const topo::Summary &dgx() {
  return machine("dgx_a100.xml");
}
const topo::Summary &cpu2() {
  return machine("cpu_2socket_ib.xml");
}
const topo::Summary &laptop() {
  return machine("laptop.xml");
}
const topo::Summary &workstation() {
  return machine("gpu_workstation.xml");
}
const topo::Summary &ib_down() {
  return machine("ib_down.xml");
}

constexpr uint64_t kHost = MNCL_CAP_HOST_MEMORY;
constexpr uint64_t kCuda = MNCL_CAP_CUDA_MEMORY;

// What the real plugins' probes answer (plugins/*/plugin.cpp), for a job under MPI or not.
std::vector<Candidate> installed(bool mpi, std::vector<std::string> names = {"nccl", "flat", "gloo",
                                                                             "naive"}) {
  std::vector<Candidate> out;
  for (const auto &n : names) {
    if (n == "nccl") out.push_back({"nccl", kCuda, 100, ""});
    if (n == "flat") {
      out.push_back(mpi ? Candidate{"flat", kHost, 80, ""}
                        : Candidate{"flat", kHost, 0, "not launched by mpirun"});
    }
    if (n == "gloo") out.push_back({"gloo", kHost, 50, ""});
    if (n == "shm") out.push_back({"shm", kHost, 60, ""});
    if (n == "naive") out.push_back({"naive", kHost, 10, ""});
  }
  return out;
}

JobFacts job(int size, int hosts, bool mpi, MemoryType memory) {
  JobFacts f;
  f.size = size;
  f.num_hosts = hosts;
  f.local_size = size / hosts;
  f.launched_by_mpi = mpi;
  f.memory = memory;
  return f;
}

topo::Decision decide(const topo::Summary &t, const JobFacts &f, const std::vector<Candidate> &c,
                      topo::Overrides o = {}) {
  return topo::decide_backend(t, f, c, o);
}

topo::Binding bind(const topo::Summary &t, BindMode mode, int local_rank, int local_size,
                   int gpu = -1, CpuSet current = {}) {
  topo::BindRequest r;
  r.mode = mode;
  r.local_rank = local_rank;
  r.local_size = local_size;
  r.gpu = gpu;
  r.current = current;
  return topo::compute_binding(t, r);
}

// Two packages of 4 PUs, each with its DDR node; `extra` adds memory-only nodes, whose PUs
// hwloc 2 reports as those of the object they hang from.
topo::Summary two_packages(const std::vector<std::string> &extra = {}) {
  topo::Summary s;
  s.is_this_system = false;
  s.all_cpus = CpuSet::parse("0-7");
  s.numa_nodes = {{0, 1u << 30, CpuSet::parse("0-3")}, {1, 1u << 30, CpuSet::parse("4-7")}};
  int os_index = 2;
  for (const std::string &cpus : extra)
    s.numa_nodes.push_back({os_index++, 1u << 30, CpuSet::parse(cpus)});
  return s;
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}
#define EXPECT_CONTAINS(text, part) \
  EXPECT_TRUE(contains((text), (part))) << "expected '" << (part) << "' in: " << (text)

}  // namespace

// ---------------------------------------------------------------------------------------------
// CpuSet
// ---------------------------------------------------------------------------------------------

TEST(CpuSet, FormatsRangesLikeTaskset) {
  EXPECT_EQ(CpuSet({3, 0, 1, 2, 8, 10, 11, 1}).to_string(), "0-3,8,10-11");
  EXPECT_EQ(CpuSet().to_string(), "");
  EXPECT_EQ(CpuSet({5}).to_string(), "5");
  EXPECT_EQ(CpuSet::parse("0-3,8,10-11"), CpuSet({0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(CpuSet::parse(""), CpuSet());
  EXPECT_THROW(CpuSet::parse("3-1"), std::invalid_argument);
  EXPECT_THROW(CpuSet::parse("1;2"), std::invalid_argument);
  EXPECT_THROW(CpuSet::parse("x"), std::invalid_argument);
}

TEST(CpuSet, SetOperations) {
  const CpuSet a = CpuSet::parse("0-7"), b = CpuSet::parse("4-5"), c = CpuSet::parse("8-9");
  EXPECT_TRUE(a.includes(b));
  EXPECT_FALSE(b.includes(a));
  EXPECT_TRUE(a.intersects(b));
  EXPECT_FALSE(a.intersects(c));
  EXPECT_EQ((a | c).to_string(), "0-9");
  EXPECT_EQ((a & CpuSet::parse("6-9")).to_string(), "6-7");
  EXPECT_EQ((a - CpuSet::parse("2-5")).to_string(), "0-1,6-7");
  EXPECT_TRUE((a & c).empty());
  EXPECT_TRUE(a.contains(7));
  EXPECT_FALSE(a.contains(8));
}

// ---------------------------------------------------------------------------------------------
// Reading topologies
// ---------------------------------------------------------------------------------------------

TEST(Load, DgxA100) {
  const auto &t = dgx();
  EXPECT_EQ(t.hostname, "dgx-a100-01");
  EXPECT_FALSE(t.is_this_system);
  EXPECT_CONTAINS(t.source, "dgx_a100.xml");
  EXPECT_EQ(t.cpu_model, "AMD EPYC 7742 64-Core Processor");
  EXPECT_EQ(t.packages, 2);
  ASSERT_EQ(t.numa_nodes.size(), 8u);
  EXPECT_EQ(t.num_cores(), 128);
  EXPECT_EQ(t.num_pus(), 256);
  EXPECT_EQ(t.numa_nodes[3].cpus.to_string(), "48-63,176-191");
  EXPECT_EQ(t.numa_nodes[3].memory_bytes, 128ull << 30);
  EXPECT_EQ(t.cores[0].pus.to_string(), "0,128");
  EXPECT_EQ(t.cores[127].package, 1);
  EXPECT_EQ(t.cores[127].numa, 7);
  // 8 GPUs; the 6 NVSwitches are NVIDIA devices too, but not GPUs.
  ASSERT_EQ(t.num_gpus(), 8);
  const int want_numa[8] = {3, 3, 1, 1, 7, 7, 5, 5};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t.gpus[i].ordinal, i);
    EXPECT_EQ(t.gpus[i].locality.numa, want_numa[i]) << "GPU " << i;
    EXPECT_EQ(t.gpus[i].locality.cpus, t.numa_nodes[want_numa[i]].cpus) << "GPU " << i;
    EXPECT_EQ(t.gpus[i].model, "NVIDIA A100-SXM4-80GB");
    EXPECT_EQ(t.gpus[i].device_id, 0x20b0);
  }
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(t.gpus[7].pci_bus_id, "0000:bd:00.0");
  EXPECT_EQ(t.gpu(3)->pci_bus_id, "0000:4e:00.0");
  EXPECT_EQ(t.gpu(8), nullptr);
  // 8 InfiniBand HCAs, 2 RoCE storage NICs, 1 plain Ethernet port.
  int ib = 0, roce = 0, eth = 0;
  for (const auto &nic : t.nics) {
    ib += nic.kind == topo::NicKind::kInfiniBand;
    roce += nic.kind == topo::NicKind::kRoCE;
    eth += nic.kind == topo::NicKind::kEthernet;
  }
  EXPECT_EQ(ib, 8);
  EXPECT_EQ(roce, 2);
  EXPECT_EQ(eth, 1);
  EXPECT_TRUE(t.has_infiniband());
  const topo::Nic *mlx5_0 = nullptr;
  for (const auto &nic : t.nics) {
    if (nic.name == "mlx5_0") mlx5_0 = &nic;
  }
  ASSERT_NE(mlx5_0, nullptr);
  EXPECT_EQ(mlx5_0->pci_bus_id, "0000:0c:00.0");
  EXPECT_EQ(mlx5_0->locality.numa, 3);  // next to GPU 0 and 1
  EXPECT_TRUE(mlx5_0->port_active);
  EXPECT_EQ(mlx5_0->netdevs, std::vector<std::string>{"ibp12s0"});
}

TEST(Load, TwoSocketCpuNodeWithInfiniBand) {
  const auto &t = cpu2();
  EXPECT_EQ(t.hostname, "cpu-node-17");
  EXPECT_EQ(t.packages, 2);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.num_cores(), 32);
  EXPECT_EQ(t.num_pus(), 64);
  EXPECT_EQ(t.numa_nodes[1].cpus.to_string(), "16-31,48-63");
  EXPECT_EQ(t.num_gpus(), 0);
  ASSERT_EQ(t.nics.size(), 2u);
  EXPECT_EQ(t.nics[0].name, "mlx5_0");
  EXPECT_EQ(t.nics[0].kind, topo::NicKind::kInfiniBand);
  EXPECT_EQ(t.nics[0].locality.numa, 0);
  EXPECT_EQ(t.nics[1].name, "eno1");
  EXPECT_EQ(t.nics[1].kind, topo::NicKind::kEthernet);
  EXPECT_EQ(t.nics[1].locality.numa, 1);
  EXPECT_TRUE(t.has_infiniband());
}

TEST(Load, LaptopHasNoAcceleratorAndNoInfiniBand) {
  const auto &t = laptop();
  EXPECT_EQ(t.packages, 1);
  EXPECT_EQ(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.num_cores(), 4);
  EXPECT_EQ(t.num_pus(), 8);
  EXPECT_EQ(t.num_gpus(), 0);  // the Intel iGPU is not an NVIDIA GPU
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].name, "wlp0s20f3");
  EXPECT_FALSE(t.has_infiniband());
}

TEST(Load, GpusWithoutCudaDevicesAreNumberedInPciOrder) {
  const auto &t = workstation();
  ASSERT_EQ(t.num_gpus(), 2);  // the GPU's audio function is not a GPU
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0000:0b:00.0");
  EXPECT_EQ(t.gpus[1].pci_bus_id, "0000:2d:00.0");
  EXPECT_EQ(t.gpus[1].ordinal, 1);
  EXPECT_EQ(t.gpus[0].os_devices, std::vector<std::string>{"card0"});
  EXPECT_EQ(t.gpus[0].locality.cpus, t.all_cpus);
}

// Without hwloc's CUDA component, CUDA ordinals follow CUDA_VISIBLE_DEVICES: ordinal k is the
// k-th device it lists (in PCI order), and the devices it hides are not this process's GPUs.
// A list by UUID cannot be mapped without the UUIDs (an XML topology without hwloc's NVML
// component has none): PCI order, every GPU.
TEST(Load, CudaVisibleDevicesRenumbersGpusWithoutCudaDevices) {
  struct Restore {
    ~Restore() { unsetenv("CUDA_VISIBLE_DEVICES"); }
  } restore;
  const auto load = [](const char *visible) {
    setenv("CUDA_VISIBLE_DEVICES", visible, 1);
    return topo::Topology::load_xml(xml("gpu_workstation.xml"));
  };
  auto t = load("1");
  ASSERT_EQ(t->summary().num_gpus(), 1);
  EXPECT_EQ(t->summary().gpu(0)->pci_bus_id, "0000:2d:00.0");
  t = load("1,0");
  ASSERT_EQ(t->summary().num_gpus(), 2);
  EXPECT_EQ(t->summary().gpu(0)->pci_bus_id, "0000:2d:00.0");
  EXPECT_EQ(t->summary().gpu(1)->pci_bus_id, "0000:0b:00.0");
  EXPECT_EQ(load("")->summary().num_gpus(), 0);
  EXPECT_EQ(load("-1")->summary().num_gpus(), 0);
  EXPECT_EQ(load("0,-1,1")->summary().num_gpus(), 1);  // CUDA stops at the first invalid entry
  EXPECT_EQ(load("0,7")->summary().num_gpus(), 1);
  t = load("GPU-8f9e3c1a-0000-0000-0000-000000000000");
  ASSERT_EQ(t->summary().num_gpus(), 2);
  EXPECT_EQ(t->summary().gpu(0)->pci_bus_id, "0000:0b:00.0");
  // hwloc's CUDA component numbered the DGX's GPUs itself: the variable changes nothing there.
  setenv("CUDA_VISIBLE_DEVICES", "3", 1);
  EXPECT_EQ(topo::Topology::load_xml(xml("dgx_a100.xml"))->summary().num_gpus(), 8);
}

// The NVIDIA driver's procfs view, in a folder laid out as /proc/driver/nvidia/gpus, /dev and
// /sys/bus/pci/devices are on a live machine.
class DriverView : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("mncl-driver-view-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    paths_.gpus = (root_ / "gpus").string();
    paths_.dev = (root_ / "dev").string();
    paths_.pci_devices = (root_ / "pci").string();
    std::filesystem::create_directories(paths_.gpus);
    std::filesystem::create_directories(paths_.dev);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  static void write(const std::filesystem::path &path, const std::string &text) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  // A GPU as the driver lists it; cpus and numa go to sysfs ("" / -1: no such file).
  void add_gpu(const std::string &bus_id, int minor, const std::string &uuid,
               const std::string &cpus = "", int numa = -1, bool excluded = false) {
    write(root_ / "gpus" / bus_id / "information",
          "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 123\nGPU UUID: \t " + uuid +
              "\nVideo BIOS: \t 96.00.30.00.01\nBus Type: \t PCIe\nBus Location: \t " + bus_id +
              "\nDevice Minor: \t " + std::to_string(minor) + "\nGPU Excluded:\t " +
              (excluded ? "Yes" : "No") + "\n");
    write(root_ / "pci" / bus_id / "device", "0x2330\n");
    if (!cpus.empty()) write(root_ / "pci" / bus_id / "local_cpulist", cpus + "\n");
    if (numa >= 0) write(root_ / "pci" / bus_id / "numa_node", std::to_string(numa) + "\n");
  }
  void make_node(const std::string &name) { write(root_ / "dev" / name, ""); }

  std::filesystem::path root_;
  topo::DriverPaths paths_;
};

// A GPU as hwloc would report it (no cudaN: Debian's hwloc).
topo::Gpu hwloc_gpu(const std::string &bus_id) {
  topo::Gpu g;
  g.pci_bus_id = bus_id;
  g.model = "GH100 [H100 SXM5 80GB]";
  g.os_devices = {"card0"};
  return g;
}

std::vector<std::string> bus_ids(const std::vector<topo::Gpu> &gpus) {
  std::vector<std::string> ids;
  for (const auto &g : gpus) ids.push_back(g.pci_bus_id);
  return ids;
}

TEST_F(DriverView, ReadsEachGpusInformationAndSysfsLocality) {
  add_gpu("0000:4e:00.0", 1, "GPU-bbbb2222-0000-0000-0000-000000000000", "16-31", 1);
  add_gpu("0000:07:00.0", 0, "GPU-aaaa1111-0000-0000-0000-000000000000", "0-15", 0);
  write(root_ / "gpus" / "0000:99:00.0" / "not-information", "");  // unreadable: left out
  const auto gpus = topo::read_driver_gpus(paths_);
  ASSERT_TRUE(gpus);
  ASSERT_EQ(gpus->size(), 2u);
  const topo::DriverGpu &first = gpus->front();  // PCI order
  EXPECT_EQ(first.pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(first.model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(first.uuid, "GPU-aaaa1111-0000-0000-0000-000000000000");
  EXPECT_EQ(first.minor, 0);
  EXPECT_EQ(first.device_id, 0x2330);
  EXPECT_EQ(first.locality.cpus, CpuSet::parse("0-15"));
  EXPECT_EQ(first.locality.numa, 0);
  EXPECT_EQ((*gpus)[1].minor, 1);
  // No /dev/nvidiactl: the driver's nodes are not made yet, so /dev tells nothing.
  EXPECT_TRUE(first.reachable);
  EXPECT_TRUE((*gpus)[1].reachable);
}

TEST_F(DriverView, OnceTheDriversNodesExistAGpuWithoutItsNodeIsNotReachable) {
  add_gpu("0000:07:00.0", 0, "GPU-aaaa");
  add_gpu("0000:4e:00.0", 1, "GPU-bbbb");
  make_node("nvidiactl");
  make_node("nvidia1");  // a container given the second GPU only
  const auto gpus = topo::read_driver_gpus(paths_);
  ASSERT_TRUE(gpus);
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_FALSE((*gpus)[0].reachable);
  EXPECT_TRUE((*gpus)[1].reachable);
}

TEST_F(DriverView, NoDriverFolderLeavesHwlocsView) {
  paths_.gpus = (root_ / "absent").string();
  EXPECT_FALSE(topo::read_driver_gpus(paths_));
  const auto gpus = topo::number_gpus({hwloc_gpu("0000:0b:00.0")}, std::nullopt, nullptr);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].ordinal, 0);
  EXPECT_EQ(gpus[0].model, "GH100 [H100 SXM5 80GB]");
}

// hwloc without its PCI component sees no GPU; the driver's GPUs stand in, with sysfs's
// locality, so MNCL_MEMORY=auto is cuda and each rank binds near its GPU.
TEST_F(DriverView, GpusHwlocMissedAreAddedFromTheDriver) {
  add_gpu("0000:4e:00.0", 1, "GPU-bbbb", "16-31", 1);
  add_gpu("0000:07:00.0", 0, "GPU-aaaa", "0-15", 0);
  const auto gpus = topo::number_gpus({}, topo::read_driver_gpus(paths_), nullptr);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].ordinal, 0);
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(gpus[0].model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpus[0].uuid, "GPU-aaaa");
  EXPECT_EQ(gpus[0].device_id, 0x2330);
  EXPECT_EQ(gpus[0].os_devices, std::vector<std::string>{"nvidia0"});
  EXPECT_EQ(gpus[1].locality.cpus, CpuSet::parse("16-31"));
  EXPECT_EQ(gpus[1].locality.numa, 1);
  topo::Summary s;
  s.gpus = gpus;
  EXPECT_EQ(topo::resolve_memory("auto", s), MemoryType::kCuda);
}

// In a container hwloc reads the host's sysfs: every GPU of the host. Only those whose device
// node the container has, and that the NVIDIA driver manages, are the process's.
TEST_F(DriverView, OnlyReachableGpusTheDriverManagesRemain) {
  add_gpu("0000:07:00.0", 0, "GPU-aaaa");
  add_gpu("0000:4e:00.0", 1, "GPU-bbbb");
  add_gpu("0000:87:00.0", 2, "GPU-cccc");
  make_node("nvidiactl");
  make_node("nvidia1");
  make_node("nvidia2");
  // 0000:bd:00.0 is bound to vfio-pci (passed to a VM): not in the driver's list.
  auto gpus = topo::number_gpus({hwloc_gpu("0000:BD:00.0"), hwloc_gpu("0000:87:00.0"),
                                 hwloc_gpu("0000:4e:00.0"), hwloc_gpu("0000:07:00.0")},
                                topo::read_driver_gpus(paths_), nullptr);
  EXPECT_EQ(bus_ids(gpus), (std::vector<std::string>{"0000:4e:00.0", "0000:87:00.0"}));
  EXPECT_EQ(gpus[1].ordinal, 1);
  EXPECT_EQ(gpus[1].uuid, "GPU-cccc");
  EXPECT_EQ(gpus[1].os_devices, (std::vector<std::string>{"card0", "nvidia2"}));
  // No GPU given to the container: host memory for MNCL_MEMORY=auto.
  std::filesystem::remove(root_ / "dev" / "nvidia1");
  std::filesystem::remove(root_ / "dev" / "nvidia2");
  gpus = topo::number_gpus({hwloc_gpu("0000:07:00.0")}, topo::read_driver_gpus(paths_), nullptr);
  EXPECT_TRUE(gpus.empty());
}

// A GPU the driver excludes (NVreg_ExcludedGpus) is no CUDA device: it neither counts nor
// shifts the ordinals of the others.
TEST_F(DriverView, ExcludedGpusAreNotCudaDevices) {
  add_gpu("0000:07:00.0", 0, "GPU-aaaa", "0-15", 0, /*excluded=*/true);
  add_gpu("0000:87:00.0", 1, "GPU-bbbb", "16-31", 1);
  const auto driver = topo::read_driver_gpus(paths_);
  ASSERT_TRUE(driver);
  EXPECT_TRUE(driver->front().excluded);
  EXPECT_FALSE(driver->back().excluded);
  for (const auto &seen :
       {std::vector<topo::Gpu>{},
        std::vector<topo::Gpu>{hwloc_gpu("0000:07:00.0"), hwloc_gpu("0000:87:00.0")}}) {
    const auto gpus = topo::number_gpus(seen, driver, "0");
    ASSERT_EQ(gpus.size(), 1u);
    EXPECT_EQ(gpus[0].pci_bus_id, "0000:87:00.0");
    EXPECT_EQ(gpus[0].ordinal, 0);
  }
}

// Slurm and Kubernetes set CUDA_VISIBLE_DEVICES to UUIDs; the driver's UUIDs map them.
TEST_F(DriverView, CudaVisibleDevicesByUuidIsMapped) {
  add_gpu("0000:07:00.0", 0, "GPU-aaaa1111-0000-0000-0000-000000000000");
  add_gpu("0000:4e:00.0", 1, "GPU-bbbb2222-0000-0000-0000-000000000000");
  add_gpu("0000:87:00.0", 2, "GPU-bbbb3333-0000-0000-0000-000000000000");
  const auto driver = topo::read_driver_gpus(paths_);
  const auto visible = [&](const char *value) {
    return bus_ids(topo::number_gpus({}, driver, value));
  };
  EXPECT_EQ(visible("GPU-bbbb3333-0000-0000-0000-000000000000,GPU-aaaa1111"),
            (std::vector<std::string>{"0000:87:00.0", "0000:07:00.0"}));
  // A prefix naming two devices, or none, ends the list, as an invalid index does.
  EXPECT_EQ(visible("GPU-aaaa,GPU-bbbb,GPU-bbbb2"), std::vector<std::string>{"0000:07:00.0"});
  EXPECT_EQ(visible("GPU-ffff,GPU-aaaa"), std::vector<std::string>{});
  // The first entry decides the kind: an index among UUIDs ends it, and the other way round.
  EXPECT_EQ(visible("GPU-bbbb2,1"), std::vector<std::string>{"0000:4e:00.0"});
  EXPECT_EQ(visible("2,GPU-aaaa"), std::vector<std::string>{"0000:87:00.0"});
  // A device listed twice hides every device; an index is the number an entry starts with.
  EXPECT_EQ(visible("GPU-aaaa,GPU-aaaa1111"), std::vector<std::string>{});
  EXPECT_EQ(visible("1,1"), std::vector<std::string>{});
  EXPECT_EQ(visible("1gpu,0"), (std::vector<std::string>{"0000:4e:00.0", "0000:07:00.0"}));
  // MIG instances cannot be mapped to a GPU here: every GPU, PCI order.
  EXPECT_EQ(visible("MIG-4a1b9d4e-0000-0000-0000-000000000000").size(), 3u);
  // Without the driver's view the UUIDs are unknown: every GPU, PCI order.
  EXPECT_EQ(topo::number_gpus({hwloc_gpu("0000:4e:00.0"), hwloc_gpu("0000:07:00.0")}, std::nullopt,
                              "GPU-bbbb2222")
                .size(),
            2u);
}

// CUDA's default order puts the fastest of mixed GPU models first: PCI order is CUDA's only
// with CUDA_DEVICE_ORDER=PCI_BUS_ID or one model, or where UUIDs name the devices. Otherwise the
// summary says so, and no rank binds near a GPU that may be another's.
TEST_F(DriverView, MixedGpuModelsHaveNoKnownOrderWithoutPciBusIdOrder) {
  add_gpu("0000:07:00.0", 0, "GPU-aaaa", "0-15", 0);
  add_gpu("0000:87:00.0", 1, "GPU-bbbb", "16-31", 1);
  topo::Gpu display = hwloc_gpu("0000:07:00.0"), compute = hwloc_gpu("0000:87:00.0");
  display.device_id = 0x2204;
  compute.device_id = 0x20b0;
  std::string caveat;
  const auto number = [&](const std::vector<topo::Gpu> &seen, const char *visible,
                          const char *order) {
    return topo::number_gpus(seen, std::nullopt, visible, order, &caveat);
  };
  EXPECT_EQ(number({display, compute}, nullptr, nullptr).size(), 2u);
  EXPECT_NE(caveat.find("CUDA_DEVICE_ORDER=PCI_BUS_ID"), std::string::npos) << caveat;
  number({display, compute}, "1", nullptr);  // which one "1" is depends on CUDA's order too
  EXPECT_FALSE(caveat.empty());
  number({display, compute}, nullptr, "PCI_BUS_ID");
  EXPECT_TRUE(caveat.empty()) << caveat;
  number({compute, compute}, nullptr, nullptr);
  EXPECT_TRUE(caveat.empty()) << caveat;
  topo::Gpu unknown = hwloc_gpu("0000:c0:00.0");  // device id 0: sysfs could not say
  number({compute, unknown}, nullptr, nullptr);
  EXPECT_TRUE(caveat.empty()) << caveat;
  display.uuid = "GPU-aaaa";
  compute.uuid = "GPU-bbbb";
  EXPECT_EQ(bus_ids(number({display, compute}, "GPU-bbbb", nullptr)),
            std::vector<std::string>{"0000:87:00.0"});
  EXPECT_TRUE(caveat.empty()) << caveat;

  topo::Summary t = two_packages();
  t.gpus = number({display, compute}, nullptr, nullptr);
  t.gpus[1].locality = {CpuSet::parse("4-7"), 1};
  t.gpu_order_caveat = caveat;
  const auto b = bind(t, BindMode::kAuto, 1, 2, 1);
  EXPECT_EQ(b.cpus, CpuSet::parse("4-7")) << b.reason;  // spread by local rank instead
  EXPECT_CONTAINS(b.reason, "GPU 1 unknown (CUDA numbers GPUs of different models fastest first");
  EXPECT_CONTAINS(topo::describe(t), "note: CUDA numbers GPUs of different models");
}

// hwloc's own CUDA numbering (its CUDA component asked the runtime) is kept; the driver's
// view still removes a GPU the process cannot reach.
TEST_F(DriverView, HwlocsCudaNumberingStands) {
  add_gpu("0000:07:00.0", 0, "GPU-aaaa");
  add_gpu("0000:4e:00.0", 1, "GPU-bbbb");
  topo::Gpu first = hwloc_gpu("0000:07:00.0"), second = hwloc_gpu("0000:4e:00.0");
  first.ordinal = 1;
  second.ordinal = 0;
  auto gpus = topo::number_gpus({first, second}, topo::read_driver_gpus(paths_), "0");
  EXPECT_EQ(bus_ids(gpus), (std::vector<std::string>{"0000:4e:00.0", "0000:07:00.0"}));
  make_node("nvidiactl");
  make_node("nvidia0");
  gpus = topo::number_gpus({first, second}, topo::read_driver_gpus(paths_), nullptr);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].ordinal, 1);
}

TEST(Load, InfiniBandWithEveryPortDownIsNotUsable) {
  const auto &t = ib_down();
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_FALSE(t.nics[0].port_active);
  EXPECT_FALSE(t.has_infiniband());
}

TEST(Load, MissingOrBadFilesAreErrorsNamingTheFile) {
  try {
    topo::Topology::load_xml("/nonexistent/topo.xml");
    FAIL() << "no error";
  } catch (const mncl::Error &e) {
    EXPECT_EQ(e.status(), MNCL_ERR_SYSTEM);
    EXPECT_CONTAINS(e.what(), "/nonexistent/topo.xml");
  }
  try {
    topo::Topology::load_xml(xml("make_topologies.py"));
    FAIL() << "no error";
  } catch (const mncl::Error &e) {
    EXPECT_CONTAINS(e.what(), "make_topologies.py");
  }
}

TEST(Load, ThisMachine) {
  const auto t = topo::Topology::load_this_machine();
  const auto &s = t->summary();
  EXPECT_TRUE(s.is_this_system);
  EXPECT_EQ(s.source, "this machine");
  EXPECT_GE(s.num_cores(), 1);
  EXPECT_GE(s.num_pus(), s.num_cores());
  EXPECT_GE(s.numa_nodes.size(), 1u);
  EXPECT_FALSE(s.hostname.empty());
  EXPECT_LE(s.num_pus(), sysconf(_SC_NPROCESSORS_ONLN));
}

TEST(Load, HwlocXmlFileReplacesThisMachine) {
  ASSERT_EQ(setenv("HWLOC_XMLFILE", xml("cpu_2socket_ib.xml").c_str(), 1), 0);
  std::unique_ptr<topo::Topology> t;
  try {
    t = topo::Topology::load_this_machine();
  } catch (...) {
    unsetenv("HWLOC_XMLFILE");
    throw;
  }
  unsetenv("HWLOC_XMLFILE");
  EXPECT_EQ(t->summary().hostname, "cpu-node-17");
  EXPECT_FALSE(t->summary().is_this_system);
  EXPECT_CONTAINS(t->summary().source, "HWLOC_XMLFILE");
  EXPECT_TRUE(t->current_binding().empty());  // not this machine: nothing to ask
  EXPECT_THROW(t->bind(CpuSet({0})), mncl::Error);
}

TEST(Load, BindingOnThisMachineRestrictsAffinity) {
  // In a child, so the test process keeps its CPUs.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    try {
      const auto t = topo::Topology::load_this_machine();
      const int pu = t->summary().all_cpus.pus().back();
      t->bind(CpuSet({pu}));
      cpu_set_t set;
      CPU_ZERO(&set);
      if (sched_getaffinity(0, sizeof set, &set) != 0)
        code = 2;
      else if (CPU_COUNT(&set) != 1 || !CPU_ISSET(pu, &set))
        code = 3;
      else if (t->current_binding() != CpuSet({pu}))
        code = 4;
    } catch (...) {
      code = 5;
    }
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// ---------------------------------------------------------------------------------------------
// The backend rules, one test per rule and machine
// ---------------------------------------------------------------------------------------------

TEST(Memory, AutoMeansCudaOnNvidiaHosts) {
  EXPECT_EQ(topo::resolve_memory("auto", dgx()), MemoryType::kCuda);
  EXPECT_EQ(topo::resolve_memory("", workstation()), MemoryType::kCuda);
  EXPECT_EQ(topo::resolve_memory("auto", cpu2()), MemoryType::kHost);
  EXPECT_EQ(topo::resolve_memory("auto", laptop()), MemoryType::kHost);  // Intel iGPU only
  EXPECT_EQ(topo::resolve_memory("host", dgx()), MemoryType::kHost);
  EXPECT_EQ(topo::resolve_memory("cuda", laptop()), MemoryType::kCuda);
  try {
    topo::resolve_memory("gpu", dgx());
    FAIL() << "no error";
  } catch (const mncl::Error &e) {
    EXPECT_EQ(e.status(), MNCL_ERR_INVALID_ARGUMENT);
    EXPECT_CONTAINS(e.what(), "MNCL_MEMORY='gpu'");
  }
}

TEST(Rules, SingleHostFacts) {
  EXPECT_TRUE(topo::single_host(job(1, 1, false, MemoryType::kHost)));
  JobFacts f;
  f.size = 4;
  EXPECT_FALSE(topo::single_host(f));  // nothing known: not assumed
  f.local_size = 4;
  EXPECT_TRUE(topo::single_host(f));  // the launcher says all 4 are here
  f.num_hosts = 2;
  EXPECT_FALSE(topo::single_host(f));
  f.size = 1;
  EXPECT_TRUE(topo::single_host(f));
}

TEST(Rules, DgxCudaMemoryChoosesNccl) {
  for (bool mpi : {false, true}) {
    const auto d = decide(dgx(), job(16, 2, mpi, MemoryType::kCuda), installed(mpi));
    EXPECT_EQ(d.backend, "nccl");
    EXPECT_EQ(d.rule, Rule::kCudaNccl);
    EXPECT_CONTAINS(d.reason, "8 NVIDIA GPUs: nccl");
    EXPECT_EQ(d.ranked.front(), "nccl");
    EXPECT_EQ(d.ranked.back(), "naive");
  }
}

TEST(Rules, SingleHostGpuJobChoosesNcclToo) {
  const auto d = decide(workstation(), job(2, 1, false, MemoryType::kCuda),
                        installed(false, {"nccl", "gloo", "shm", "naive"}));
  EXPECT_EQ(d.backend, "nccl");
  EXPECT_EQ(d.ranked, (std::vector<std::string>{"nccl", "shm", "gloo", "naive"}));
}

TEST(Rules, CudaMemoryWithoutNcclPrefersACudaCapablePlugin) {
  auto c = installed(true, {"flat", "gloo", "naive"});
  c[0].caps |= kCuda;  // CUDA-aware MPI
  const auto d = decide(dgx(), job(16, 2, true, MemoryType::kCuda), c);
  EXPECT_EQ(d.backend, "flat");
  EXPECT_EQ(d.rule, Rule::kCudaCapable);
  EXPECT_CONTAINS(d.reason, "flat handles CUDA buffers");
  EXPECT_CONTAINS(d.reason, "passed over: nccl not installed");
}

TEST(Rules, CudaMemoryWithNothingCudaCapableStagesThroughHost) {
  const auto d = decide(dgx(), job(16, 2, false, MemoryType::kCuda),
                        installed(false, {"flat", "gloo", "naive"}));
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_EQ(d.rule, Rule::kGloo);
  EXPECT_CONTAINS(d.reason, "gloo over TCP (IPoIB");
  EXPECT_CONTAINS(d.reason, "staged through host memory");
  EXPECT_CONTAINS(d.reason, "nccl not installed");
}

TEST(Rules, NcclProbeRefusalIsReported) {
  auto c = installed(false);
  c[0].score = 0;
  c[0].reason = "no CUDA driver";
  const auto d = decide(dgx(), job(16, 2, false, MemoryType::kCuda), c);
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_CONTAINS(d.reason, "nccl unusable: no CUDA driver");
  EXPECT_EQ(d.ranked, (std::vector<std::string>{"gloo", "naive"}));
}

TEST(Rules, HostMemoryAcrossInfiniBandHostsUnderMpiChoosesFlat) {
  const auto d = decide(cpu2(), job(64, 4, true, MemoryType::kHost), installed(true));
  EXPECT_EQ(d.backend, "flat");
  EXPECT_EQ(d.rule, Rule::kMpiFlat);
  EXPECT_CONTAINS(d.reason, "host memory, 64 ranks on 4 hosts, launched by MPI");
  EXPECT_CONTAINS(d.reason, "MPI drives the InfiniBand fabric");
  // nccl handles no host memory: never a candidate for host buffers.
  EXPECT_EQ(d.ranked, (std::vector<std::string>{"flat", "gloo", "naive"}));
}

// Gloo's ibverbs transport has no unbound buffers (the gloo plugin refuses it): TCP, over IPoIB
// where the hosts' addresses are on InfiniBand.
TEST(Rules, HostMemoryAcrossInfiniBandHostsWithoutMpiChoosesGlooOverTcp) {
  const auto d = decide(cpu2(), job(64, 4, false, MemoryType::kHost), installed(false));
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_EQ(d.rule, Rule::kGloo);
  EXPECT_CONTAINS(d.reason,
                  "not launched by MPI, gloo over TCP (IPoIB where the hosts' "
                  "addresses are on InfiniBand)");
  EXPECT_EQ(d.reason.find("ibverbs"), std::string::npos) << d.reason;
}

// MNCL_GLOO_TRANSPORT=ibverbs makes the gloo probe say no: passed over, with its reason.
TEST(Rules, GlooRefusedByItsProbeIsPassedOverWithTheReason) {
  auto c = installed(false);
  for (auto &candidate : c) {
    if (candidate.name != "gloo") continue;
    candidate.score = 0;
    candidate.reason = "MNCL_GLOO_TRANSPORT=ibverbs is not supported: no unbound buffers";
  }
  const auto d = decide(cpu2(), job(64, 4, false, MemoryType::kHost), c);
  EXPECT_EQ(d.backend, "naive");
  EXPECT_CONTAINS(d.reason,
                  "passed over: gloo unusable: MNCL_GLOO_TRANSPORT=ibverbs is not "
                  "supported");
}

TEST(Rules, DgxWithHostMemoryUnderMpiChoosesFlat) {
  const auto d = decide(dgx(), job(16, 2, true, MemoryType::kHost), installed(true));
  EXPECT_EQ(d.backend, "flat");
  EXPECT_CONTAINS(d.reason, "InfiniBand fabric");
}

TEST(Rules, HostMemoryOverTcpUnderMpiChoosesFlat) {
  const auto d = decide(laptop(), job(8, 2, true, MemoryType::kHost), installed(true));
  EXPECT_EQ(d.backend, "flat");
  EXPECT_CONTAINS(d.reason, "MPI drives the network (TCP, no InfiniBand)");
}

TEST(Rules, HostMemoryOverTcpWithoutMpiChoosesGlooOverTcp) {
  const auto d = decide(laptop(), job(8, 2, false, MemoryType::kHost), installed(false));
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_CONTAINS(d.reason, "no InfiniBand: gloo over TCP");
  // A down InfiniBand port is no InfiniBand.
  const auto down = decide(ib_down(), job(8, 2, false, MemoryType::kHost), installed(false));
  EXPECT_CONTAINS(down.reason, "no InfiniBand: gloo over TCP");
}

TEST(Rules, MpiWithFlatUnusableFallsBackToGlooAndSaysWhy) {
  auto c = installed(true);
  c[1].score = 0;
  c[1].reason = "MPI_Init failed";
  const auto d = decide(cpu2(), job(64, 4, true, MemoryType::kHost), c);
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_CONTAINS(d.reason, "passed over: flat unusable: MPI_Init failed");
}

TEST(Rules, SingleHostPrefersShmWhenInstalled) {
  const auto all = std::vector<std::string>{"nccl", "flat", "gloo", "shm", "naive"};
  for (bool mpi : {false, true}) {
    const auto d = decide(laptop(), job(4, 1, mpi, MemoryType::kHost), installed(mpi, all));
    EXPECT_EQ(d.backend, "shm");
    EXPECT_EQ(d.rule, Rule::kSingleHostShm);
  }
  // Known to be one host from the launcher's local size, before the rendezvous.
  JobFacts f;
  f.size = 4;
  f.local_size = 4;
  EXPECT_EQ(decide(laptop(), f, installed(false, all)).backend, "shm");
  // Across hosts shm is no use: ordered after gloo by its score, before naive.
  const auto d = decide(laptop(), job(8, 2, false, MemoryType::kHost), installed(false, all));
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_EQ(d.ranked, (std::vector<std::string>{"gloo", "shm", "naive"}));
}

TEST(Rules, SingleHostWithoutShmFollowsTheOtherRules) {
  const auto plain = decide(laptop(), job(4, 1, false, MemoryType::kHost), installed(false));
  EXPECT_EQ(plain.backend, "gloo");
  EXPECT_CONTAINS(plain.reason, "gloo over TCP loopback");
  EXPECT_CONTAINS(plain.reason, "shm not installed");
  // One host with InfiniBand: still loopback.
  EXPECT_CONTAINS(decide(cpu2(), job(4, 1, false, MemoryType::kHost), installed(false)).reason,
                  "one host: gloo over TCP loopback");
  const auto mpi = decide(laptop(), job(4, 1, true, MemoryType::kHost), installed(true));
  EXPECT_EQ(mpi.backend, "flat");
}

TEST(Rules, NaiveOnlyWhenNothingElseLoads) {
  const auto d = decide(laptop(), job(2, 1, false, MemoryType::kHost), installed(false, {"naive"}));
  EXPECT_EQ(d.backend, "naive");
  EXPECT_EQ(d.rule, Rule::kNaive);
  EXPECT_CONTAINS(d.reason, "nothing else is usable");
  EXPECT_CONTAINS(d.reason, "gloo not installed");
  // Even a CUDA job on a GPU node ends there when nothing else loads.
  EXPECT_EQ(decide(dgx(), job(8, 1, false, MemoryType::kCuda), installed(false, {"naive"})).backend,
            "naive");
}

TEST(Rules, UnnamedPluginsAreOrderedByProbeScore) {
  std::vector<Candidate> c = {{"naive", kHost, 10, ""},
                              {"mock", kHost, 5, ""},
                              {"other", kHost, 30, ""},
                              {"alpha", kHost, 30, ""}};
  const auto d = decide(laptop(), job(2, 2, false, MemoryType::kHost), c);
  EXPECT_EQ(d.backend, "alpha");  // ties broken by name, identically on every rank
  EXPECT_EQ(d.rule, Rule::kBestScore);
  EXPECT_EQ(d.ranked, (std::vector<std::string>{"alpha", "other", "mock", "naive"}));
}

TEST(Rules, NothingUsableSaysWhyForEachPlugin) {
  std::vector<Candidate> c = {{"flat", kHost, 0, "not launched by mpirun"},
                              {"nccl", kCuda, 100, ""}};
  const auto d = decide(laptop(), job(2, 2, false, MemoryType::kHost), c);
  EXPECT_EQ(d.backend, "");
  EXPECT_EQ(d.rule, Rule::kNone);
  EXPECT_CONTAINS(d.reason, "flat unusable: not launched by mpirun");
  EXPECT_CONTAINS(d.reason, "nccl does not handle host memory");
  EXPECT_CONTAINS(decide(laptop(), job(2, 2, false, MemoryType::kHost), {}).reason, "none loaded");
}

TEST(Rules, PerMemoryOverridesReplaceTheRules) {
  topo::Overrides o;
  o.host = "flat,gloo";
  // flat unusable without MPI: the next in the user's list, with the reason.
  const auto d = decide(cpu2(), job(8, 2, false, MemoryType::kHost), installed(false), o);
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_EQ(d.rule, Rule::kOverride);
  EXPECT_CONTAINS(d.reason, "MNCL_BACKEND_HOST=flat,gloo: gloo; flat unusable");
  EXPECT_EQ(d.ranked, std::vector<std::string>{"gloo"});
  // The host override does not touch CUDA jobs, and the CUDA one not host jobs.
  EXPECT_EQ(decide(dgx(), job(8, 1, false, MemoryType::kCuda), installed(false), o).backend,
            "nccl");
  o.cuda = "gloo";
  EXPECT_EQ(decide(dgx(), job(8, 1, false, MemoryType::kCuda), installed(false), o).backend,
            "gloo");
  // Nothing usable in an override is an error, never a silent fallback to the rules.
  o.host = "shm";
  const auto none = decide(laptop(), job(2, 1, false, MemoryType::kHost), installed(false), o);
  EXPECT_EQ(none.backend, "");
  EXPECT_CONTAINS(none.reason, "MNCL_BACKEND_HOST=shm: nothing in it is usable here");
  EXPECT_CONTAINS(none.reason, "shm not installed");
}

// ---------------------------------------------------------------------------------------------
// Process binding
// ---------------------------------------------------------------------------------------------

TEST(Binding, ParsesModes) {
  EXPECT_EQ(topo::parse_bind_mode("none"), BindMode::kNone);
  EXPECT_EQ(topo::parse_bind_mode("numa"), BindMode::kNuma);
  EXPECT_EQ(topo::parse_bind_mode("core"), BindMode::kCore);
  EXPECT_EQ(topo::parse_bind_mode("auto"), BindMode::kAuto);
  EXPECT_EQ(topo::parse_bind_mode(""), BindMode::kAuto);
  try {
    topo::parse_bind_mode("socket");
    FAIL() << "no error";
  } catch (const mncl::Error &e) {
    EXPECT_EQ(e.status(), MNCL_ERR_INVALID_ARGUMENT);
    EXPECT_CONTAINS(e.what(), "MNCL_BIND='socket'");
  }
}

TEST(Binding, DgxAutoBindsEachRankNearItsGpu) {
  const auto &t = dgx();
  for (int r = 0; r < 8; ++r) {
    const auto b = bind(t, BindMode::kAuto, r, 8, r);
    EXPECT_EQ(b.cpus, t.gpus[r].locality.cpus) << b.reason;
    EXPECT_CONTAINS(b.reason, "near GPU " + std::to_string(r));
  }
  const auto b0 = bind(t, BindMode::kAuto, 0, 8, 0);
  EXPECT_EQ(b0.cpus.to_string(), "48-63,176-191");  // GPU 0 is on NUMA node 3, not 0
  EXPECT_CONTAINS(b0.reason, "GPU 0 (0000:07:00.0, NUMA node 3)");
  // A GPU the topology does not have: spread over NUMA nodes instead.
  EXPECT_EQ(bind(t, BindMode::kAuto, 1, 8, 42).cpus, t.numa_nodes[1].cpus);
}

TEST(Binding, DgxHostJobSpreadsOverNumaNodes) {
  const auto &t = dgx();
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(bind(t, BindMode::kAuto, r, 8).cpus, t.numa_nodes[r].cpus);
    EXPECT_EQ(bind(t, BindMode::kNuma, r, 8, r).cpus, t.numa_nodes[r].cpus);  // numa ignores GPUs
  }
  // 2 ranks: a package's 4 nodes each; 16 ranks: 2 per node.
  const auto half = bind(t, BindMode::kNuma, 1, 2);
  EXPECT_EQ(half.cpus.to_string(), "64-127,192-255");
  EXPECT_CONTAINS(half.reason, "NUMA nodes 4-7");
  EXPECT_EQ(bind(t, BindMode::kNuma, 15, 16).cpus, t.numa_nodes[7].cpus);
  EXPECT_EQ(bind(t, BindMode::kNuma, 14, 16).cpus, t.numa_nodes[7].cpus);
  EXPECT_EQ(bind(t, BindMode::kNuma, 13, 16).cpus, t.numa_nodes[6].cpus);
}

TEST(Binding, DgxCoreModeGivesBlocksOfWholeCores) {
  const auto &t = dgx();
  const auto b = bind(t, BindMode::kCore, 0, 8);
  EXPECT_EQ(b.cpus.to_string(), "0-15,128-143");  // 16 cores with both hyperthreads
  EXPECT_CONTAINS(b.reason, "cores 0-15 of 128");
  EXPECT_EQ(bind(t, BindMode::kCore, 7, 8).cpus.to_string(), "112-127,240-255");
}

TEST(Binding, TwoSocketNodeSpreadsRanksOverSockets) {
  const auto &t = cpu2();
  EXPECT_EQ(bind(t, BindMode::kAuto, 0, 2).cpus.to_string(), "0-15,32-47");
  EXPECT_EQ(bind(t, BindMode::kAuto, 1, 2).cpus.to_string(), "16-31,48-63");
  EXPECT_EQ(bind(t, BindMode::kAuto, 1, 4).cpus, t.numa_nodes[0].cpus);
  EXPECT_EQ(bind(t, BindMode::kAuto, 2, 4).cpus, t.numa_nodes[1].cpus);
  // One rank per host: its share is the whole machine, so it is left alone.
  const auto one = bind(t, BindMode::kAuto, 0, 1);
  EXPECT_TRUE(one.cpus.empty());
  EXPECT_CONTAINS(one.reason, "the whole machine: not bound");
}

TEST(Binding, LaptopAutoDoesNotBindButCoreModeDoes) {
  const auto &t = laptop();
  const auto a = bind(t, BindMode::kAuto, 1, 4);
  EXPECT_TRUE(a.cpus.empty());
  EXPECT_CONTAINS(a.reason, "NUMA node 0");
  EXPECT_CONTAINS(a.reason, "not bound");
  EXPECT_EQ(bind(t, BindMode::kCore, 1, 4).cpus.to_string(), "1,5");  // core 1 and its sibling
  EXPECT_EQ(bind(t, BindMode::kCore, 1, 2).cpus.to_string(), "2-3,6-7");
  const auto shared = bind(t, BindMode::kCore, 7, 8);
  EXPECT_EQ(shared.cpus.to_string(), "3,7");
  EXPECT_CONTAINS(shared.reason, "more ranks than cores");
}

// HBM beside each DDR node (Xeon Max, flat mode), a CXL expander behind a package or the whole
// machine: memory-only nodes are not CPU domains of their own. Counted as such, they gave both
// ranks the whole machine (not bound), or one rank a package and the other everything.
TEST(Binding, MemoryOnlyNumaNodesAreNotCpuDomains) {
  for (const auto &extra : std::vector<std::vector<std::string>>{
           {}, {"0-3", "4-7"}, {"0-3"}, {"0-7"}, {"0-7", "4-7"}}) {
    const topo::Summary t = two_packages(extra);
    SCOPED_TRACE(std::to_string(t.numa_nodes.size()) + " NUMA nodes");
    EXPECT_EQ(bind(t, BindMode::kAuto, 0, 2).cpus, CpuSet::parse("0-3"));
    EXPECT_EQ(bind(t, BindMode::kAuto, 1, 2).cpus, CpuSet::parse("4-7"));
    EXPECT_EQ(bind(t, BindMode::kNuma, 1, 4).cpus, CpuSet::parse("0-3"));
    EXPECT_EQ(bind(t, BindMode::kNuma, 3, 4).cpus, CpuSet::parse("4-7"));
  }
}

// One GPU per process (CUDA_VISIBLE_DEVICES per task): local rank 1 drives device 1 % 1 = 0,
// as the nccl plugin takes it, and binds near that GPU instead of spreading by local rank.
TEST(Binding, APerProcessGpuSetBindsNearTheProcesssGpu) {
  topo::Summary t = two_packages();
  topo::Gpu gpu;
  gpu.ordinal = 0;
  gpu.pci_bus_id = "0000:90:00.0";
  gpu.locality = {CpuSet::parse("0-3"), 0};
  t.gpus = {gpu};
  auto b = bind(t, BindMode::kAuto, 1, 2, 1);
  EXPECT_EQ(b.cpus, CpuSet::parse("0-3")) << b.reason;
  EXPECT_CONTAINS(b.reason, "device 1 of 1 visible: near GPU 0 (0000:90:00.0, NUMA node 0)");
  // As many GPUs as local ranks: device 1 is a GPU the process does not have.
  b = bind(t, BindMode::kAuto, 0, 1, 1);
  EXPECT_CONTAINS(b.reason, "GPU 1 not in the topology");
  // A GPU whose CPUs this process may not use all of (sysfs ignores its cpuset): said so.
  t.gpus[0].locality.cpus = CpuSet::parse("4-11");
  b = bind(t, BindMode::kAuto, 0, 2, 0);
  EXPECT_CONTAINS(b.reason, "GPU 0's CPUs 4-11 not all allowed here");
}

// isolcpus=6-7: the kernel's default affinity is CPUs 0-5, which is no launcher's binding; and
// no binding MNCL makes includes an isolated CPU.
TEST(Binding, IsolatedCpusAreNeitherALauncherBindingNorBoundTo) {
  topo::Summary t = two_packages();
  t.isolated_cpus = CpuSet::parse("6-7");
  auto b = bind(t, BindMode::kAuto, 1, 2, -1, CpuSet::parse("0-5"));
  EXPECT_EQ(b.cpus, CpuSet::parse("4-5")) << b.reason;
  EXPECT_CONTAINS(b.reason, "NUMA node 1 (CPUs 4-7) (without the isolated CPUs 6-7)");
  EXPECT_EQ(bind(t, BindMode::kAuto, 0, 2, -1, CpuSet::parse("0-5")).cpus, CpuSet::parse("0-3"));
  // A launcher's binding is still left alone.
  EXPECT_TRUE(bind(t, BindMode::kAuto, 1, 2, -1, CpuSet::parse("4-5")).cpus.empty());
  t.isolated_cpus = CpuSet::parse("4-7");
  b = bind(t, BindMode::kAuto, 1, 2, -1, CpuSet::parse("0-3"));
  EXPECT_TRUE(b.cpus.empty());
  EXPECT_CONTAINS(b.reason, "all of them isolated (isolcpus): not bound");
}

// Threads a runtime pinned one by one (OpenMP's OMP_PROC_BIND) look unbound as a process (the
// union of their CPUs): binding the process would undo their placement.
TEST(Binding, ThreadsBoundApartAreLeftAlone) {
  topo::BindRequest r;
  r.local_rank = 1;
  r.local_size = 2;
  r.threads_bound_apart = true;
  auto b = topo::compute_binding(two_packages(), r);
  EXPECT_TRUE(b.cpus.empty()) << b.reason;
  EXPECT_CONTAINS(b.reason, "threads are bound to different CPUs");
  r.mode = BindMode::kNuma;  // asked for: done
  EXPECT_EQ(topo::compute_binding(two_packages(), r).cpus, CpuSet::parse("4-7"));
}

// The main thread on one CPU while another thread keeps them all, as OpenMP places them; not a
// thread of its own on fewer CPUs (NCCL's proxy threads on the GPU's node).
TEST(Load, ThreadsBoundApartAreSeenOnThisMachine) {
  const auto machine = topo::Topology::load_this_machine();
  if (machine->summary().num_pus() < 2) GTEST_SKIP() << "needs 2 CPUs";
  EXPECT_FALSE(machine->threads_bound_apart());
  cpu_set_t everything, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof everything, &everything), 0);
  CPU_ZERO(&one);
  CPU_SET(machine->summary().all_cpus.pus().front(), &one);
  std::mutex mutex;
  std::condition_variable cv;
  bool started = false, done = false;
  std::thread other([&] {  // keeps every CPU; pins itself only when asked (step 2)
    std::unique_lock<std::mutex> lock(mutex);
    started = true;
    cv.notify_all();
    cv.wait(lock, [&] { return done; });
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return started; });
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // the main thread only
  EXPECT_TRUE(machine->threads_bound_apart());
  ASSERT_EQ(sched_setaffinity(0, sizeof everything, &everything), 0);
  EXPECT_FALSE(machine->threads_bound_apart());
  ASSERT_EQ(pthread_setaffinity_np(other.native_handle(), sizeof one, &one), 0);
  EXPECT_FALSE(machine->threads_bound_apart()) << "a thread of its own on fewer CPUs";
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  cv.notify_all();
  other.join();
}

TEST(Binding, GpuAttachedToTheWholeMachineGivesNoPreference) {
  const auto b = bind(workstation(), BindMode::kAuto, 0, 2, 0);
  EXPECT_TRUE(b.cpus.empty());
  EXPECT_CONTAINS(b.reason, "not bound");
}

TEST(Binding, NoneUnknownRankAndLauncherBindingLeaveTheProcessAlone) {
  const auto &t = cpu2();
  EXPECT_TRUE(bind(t, BindMode::kNone, 0, 2).cpus.empty());
  const auto unknown = bind(t, BindMode::kNuma, -1, -1);
  EXPECT_TRUE(unknown.cpus.empty());
  EXPECT_CONTAINS(unknown.reason, "local rank unknown");
  // mpirun --bind-to core put us on CPUs 0-3: auto keeps that, an explicit mode does not.
  const auto kept = bind(t, BindMode::kAuto, 1, 2, -1, CpuSet::parse("0-3"));
  EXPECT_TRUE(kept.cpus.empty());
  EXPECT_CONTAINS(kept.reason, "already bound to CPUs 0-3");
  EXPECT_EQ(bind(t, BindMode::kNuma, 1, 2, -1, CpuSet::parse("0-3")).cpus, t.numa_nodes[1].cpus);
  // Ranks that are threads of one process: no placement suits them all.
  topo::BindRequest threads;
  threads.mode = BindMode::kCore;
  threads.local_rank = 0;
  threads.local_size = 4;
  threads.ranks_in_process = 4;
  const auto shared = topo::compute_binding(t, threads);
  EXPECT_TRUE(shared.cpus.empty());
  EXPECT_CONTAINS(shared.reason, "4 ranks share this process");
  // Bound to everything is not bound.
  EXPECT_EQ(bind(t, BindMode::kAuto, 1, 2, -1, t.all_cpus).cpus, t.numa_nodes[1].cpus);
}

TEST(Binding, NeverAppliedFromAForeignTopology) {
  const auto t = topo::Topology::load_xml(xml("cpu_2socket_ib.xml"));
  topo::BindRequest r;
  r.local_rank = 0;
  r.local_size = 2;
  // bind_this_process acts once per process: this is the only test that calls it.
  const auto b = topo::bind_this_process(t.get(), r);
  EXPECT_TRUE(b.cpus.empty());
  EXPECT_CONTAINS(b.reason, "not applied");
  EXPECT_EQ(topo::bind_this_process(nullptr, r).reason, b.reason);  // the first outcome stays
}

// ---------------------------------------------------------------------------------------------
// Agreement across ranks
// ---------------------------------------------------------------------------------------------

namespace {
topo::RankChoice auto_choice(std::vector<std::string> ranked) {
  return topo::RankChoice{ranked.front(), false, "auto", ranked, {}};
}
topo::RankChoice forced(const std::string &backend, const std::string &how) {
  return topo::RankChoice{backend, true, how, {backend}, {}};
}
topo::RankChoice with_builds(topo::RankChoice c, std::map<std::string, std::string> builds) {
  c.builds = std::move(builds);
  return c;
}
}  // namespace

TEST(Agreement, RecordsRoundTrip) {
  const auto c = auto_choice({"nccl", "gloo", "naive"});
  const auto back = topo::parse_choice(topo::serialize(c));
  EXPECT_EQ(back.backend, "nccl");
  EXPECT_FALSE(back.forced);
  EXPECT_EQ(back.how, "auto");
  EXPECT_EQ(back.ranked, c.ranked);
  const auto f = topo::parse_choice(topo::serialize(forced("naive", "MNCL_BACKEND=naive")));
  EXPECT_TRUE(f.forced);
  EXPECT_EQ(f.how, "MNCL_BACKEND=naive");
  EXPECT_THROW(topo::parse_choice("ok\ngloo\n"), mncl::Error);
  const auto b = topo::parse_choice(topo::serialize(
      with_builds(c, {{"nccl", "plugin ABI v5, collectives 0x3fff"}, {"@g", "v4 x"}})));
  EXPECT_EQ(b.ranked, c.ranked);
  EXPECT_EQ(b.builds.size(), 2u);
  EXPECT_EQ(b.builds.at("nccl"), "plugin ABI v5, collectives 0x3fff");
  EXPECT_EQ(b.builds.at("@g"), "v4 x");  // any name (libmncl-@g.so is a plugin too)
}

// A rank that loaded another build of the agreed backend (an older .so on one host,
// MNCL_PLUGIN_ABI_MAX on one rank) would run some calls natively where the others run the
// core's fallback, and both sides would wait for messages that never come.
TEST(Agreement, DifferentBuildsOfTheAgreedBackendFailEveryRankNamingEach) {
  const std::map<std::string, std::string> v5 = {{"gloo", "plugin ABI v5"}, {"naive", "n1"}};
  const auto gloo = auto_choice({"gloo", "naive"});
  const auto a = topo::agree({with_builds(gloo, v5), with_builds(gloo, v5),
                              with_builds(gloo, {{"gloo", "plugin ABI v4"}, {"naive", "n1"}})});
  EXPECT_EQ(a.backend, "");
  EXPECT_CONTAINS(a.error, "different builds of the gloo plugin");
  EXPECT_CONTAINS(a.error, "plugin ABI v5: ranks 0 and 1");
  EXPECT_CONTAINS(a.error, "plugin ABI v4: rank 2");
  // Another backend's builds may differ: it is not the one that runs.
  const auto b = topo::agree(
      {with_builds(gloo, v5), with_builds(gloo, {{"gloo", "plugin ABI v5"}, {"naive", "n2"}})});
  EXPECT_EQ(b.backend, "gloo");
  EXPECT_TRUE(b.error.empty()) << b.error;
}

TEST(Agreement, UnanimousChoiceStands) {
  const auto a = topo::agree({auto_choice({"gloo", "naive"}), auto_choice({"gloo", "naive"})});
  EXPECT_EQ(a.backend, "gloo");
  EXPECT_TRUE(a.error.empty());
}

TEST(Agreement, ForcedChoiceOnOneRankFailsEveryRankNamingEachChoice) {
  const auto a = topo::agree({auto_choice({"gloo", "naive"}), forced("naive", "MNCL_BACKEND=naive"),
                              auto_choice({"gloo", "naive"}), auto_choice({"gloo", "naive"})});
  EXPECT_EQ(a.backend, "");
  EXPECT_CONTAINS(a.error, "ranks disagree on the backend");
  EXPECT_CONTAINS(a.error, "gloo (auto): ranks 0, 2 and 3");
  EXPECT_CONTAINS(a.error, "naive (MNCL_BACKEND=naive): rank 1");
  // Same with a per-memory override on one rank.
  const auto b =
      topo::agree({auto_choice({"flat", "gloo"}), forced("gloo", "MNCL_BACKEND_HOST=gloo")});
  EXPECT_CONTAINS(b.error, "gloo (MNCL_BACKEND_HOST=gloo): rank 1");
  EXPECT_CONTAINS(b.error, "flat (auto): rank 0");
}

TEST(Agreement, RanksOnDifferentMachinesPickTheBestCommonBackend) {
  // Ranks 0-2 on GPU nodes, rank 3 on a CPU node: nccl is not usable there.
  const auto a =
      topo::agree({auto_choice({"nccl", "gloo", "naive"}), auto_choice({"nccl", "gloo", "naive"}),
                   auto_choice({"nccl", "gloo", "naive"}), auto_choice({"gloo", "naive"})});
  EXPECT_EQ(a.backend, "gloo");
  EXPECT_CONTAINS(a.why, "nccl (auto): ranks 0-2");
  // The worst rank's view decides, then the sum: b (positions 1,1) beats a (0,2).
  const auto b = topo::agree({auto_choice({"a", "b", "c"}), auto_choice({"c", "b", "a"})});
  EXPECT_EQ(b.backend, "b");
  const auto none = topo::agree({auto_choice({"nccl"}), auto_choice({"gloo"})});
  EXPECT_EQ(none.backend, "");
  EXPECT_CONTAINS(none.error, "no backend is usable on every rank");
  EXPECT_CONTAINS(none.error, "rank 1: gloo");
}

// ---------------------------------------------------------------------------------------------
// What mncl-info --topology prints
// ---------------------------------------------------------------------------------------------

TEST(Report, DescribesEachMachine) {
  const std::string l = topo::describe(laptop());
  EXPECT_CONTAINS(l, "1 package, 4 cores, 8 PUs (CPUs 0-7)");
  EXPECT_CONTAINS(l, "none (no NVIDIA GPU)");
  EXPECT_CONTAINS(l, "InfiniBand   no");
  const std::string d = topo::describe(dgx());
  EXPECT_CONTAINS(d, "GPUs         8 NVIDIA");
  EXPECT_CONTAINS(d, "GPU 0       0000:07:00.0  NVIDIA A100-SXM4-80GB [10de:20b0]  NUMA node 3");
  EXPECT_CONTAINS(d, "mlx5_0      InfiniBand (active)  0000:0c:00.0  NUMA node 3");
  EXPECT_CONTAINS(d, "mlx5_8      RoCE (active)");
  EXPECT_CONTAINS(topo::one_line(cpu2()),
                  "cpu-node-17: 2 packages, 2 NUMA nodes, 32 cores, 64 PUs, no NVIDIA GPU, "
                  "1 InfiniBand/RoCE device");
  EXPECT_CONTAINS(topo::one_line(ib_down()), "InfiniBand/RoCE ports down");
  // A GPU's UUID, when known (the NVIDIA driver's list), for CUDA_VISIBLE_DEVICES=GPU-...
  topo::Summary one = laptop();
  topo::Gpu gpu;
  gpu.ordinal = 0;
  gpu.pci_bus_id = "0000:01:00.0";
  gpu.device_id = 0x2330;
  gpu.os_devices = {"nvidia0"};
  gpu.uuid = "GPU-8f9e3c1a-0000-0000-0000-000000000000";
  one.gpus = {gpu};
  EXPECT_CONTAINS(topo::describe(one),
                  "GPU 0       0000:01:00.0  NVIDIA GPU [10de:2330]  CPUs ?  nvidia0  "
                  "GPU-8f9e3c1a-0000-0000-0000-000000000000\n");
}

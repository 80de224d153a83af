#!/usr/bin/env python3
"""Writes the hwloc XML (v2) topologies the topology tests read, next to this script.

The XML files are checked in; this script documents how they were made and regenerates them
(python3 make_topologies.py). Check a result with `lstopo-no-graphics -i <file>.xml`.

  dgx_a100.xml        DGX-A100-like: 2 AMD EPYC packages, 8 NUMA nodes (NPS4), 128 cores,
                      256 PUs; 8 NVIDIA A100 GPUs (with hwloc's cudaN devices) and 8 ConnectX-6
                      InfiniBand HCAs, one per GPU on its NUMA node, with the real DGX
                      GPU-to-NUMA mapping (GPU0,1 -> node 3; 2,3 -> 1; 4,5 -> 7; 6,7 -> 5);
                      6 NVSwitches (NVIDIA, but not GPUs); 2 storage NICs in RoCE mode (LID 0);
                      one on-board Ethernet port.
  gpu_workstation.xml 1 package, 1 NUMA node, 8 cores, 16 PUs, 2 NVIDIA RTX GPUs seen only as
                      PCI devices (no CUDA component: numbered in PCI order), 1 Ethernet port.
  cpu_2socket_ib.xml  2 Intel packages, 2 NUMA nodes, 32 cores, 64 PUs, one ConnectX-5 HCA
                      (InfiniBand, port active) on package 0, an Ethernet port on package 1.
  laptop.xml          1 package, 1 NUMA node, 4 cores, 8 PUs, an Intel iGPU (vendor 8086, not
                      NVIDIA), a Wi-Fi adapter; no InfiniBand.
  ib_down.xml         1 package, 4 cores, an InfiniBand HCA whose port is DOWN.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def mask(bits):
    """hwloc's bitmap text: 32-bit words, most significant first ("0xffffffff,0x00000003")."""
    bits = sorted(set(bits))
    if not bits:
        return "0x0"
    words = [0] * (bits[-1] // 32 + 1)
    for b in bits:
        words[b // 32] |= 1 << (b % 32)
    return ",".join("0x%08x" % w for w in reversed(words))


class Writer:
    def __init__(self):
        self.lines = []
        self.gp = 0

    def next_gp(self):
        self.gp += 1
        return self.gp

    def open(self, depth, kind, attrs):
        text = " ".join('%s="%s"' % kv for kv in attrs)
        self.lines.append("%s<object type=\"%s\" gp_index=\"%d\" %s>" %
                          ("  " * depth, kind, self.next_gp(), text))

    def close(self, depth):
        self.lines.append("%s</object>" % ("  " * depth))

    def leaf(self, depth, kind, attrs, infos=()):
        text = " ".join('%s="%s"' % kv for kv in attrs)
        head = "%s<object type=\"%s\" gp_index=\"%d\" %s" % ("  " * depth, kind, self.next_gp(), text)
        if not infos:
            self.lines.append(head + "/>")
            return
        self.lines.append(head + ">")
        for name, value in infos:
            self.lines.append('%s  <info name="%s" value="%s"/>' % ("  " * depth, name, value))
        self.lines.append("%s</object>" % ("  " * depth))

    def info(self, depth, name, value):
        self.lines.append('%s<info name="%s" value="%s"/>' % ("  " * depth, name, value))


def sets(cpus, nodes):
    return [("cpuset", mask(cpus)), ("complete_cpuset", mask(cpus)),
            ("nodeset", mask(nodes)), ("complete_nodeset", mask(nodes))]


def pci_attrs(busid, cls, vendor, device, speed="15.75"):
    return [("pci_busid", busid), ("pci_type", "%04x [%04x:%04x] [%04x:%04x] 01" %
                                   (cls, vendor, device, vendor, device)),
            ("pci_link_speed", speed)]


def write_pci_tree(w, depth, host_bridge_bus, devices):
    """devices: list of (busid, class, vendor, device, [osdevs], behind_switch)
    osdevs: (name, osdev_type, [(info, value)...])"""
    lo, hi = host_bridge_bus
    w.open(depth, "Bridge", [("bridge_type", "0-1"), ("depth", "0"),
                             ("bridge_pci", "0000:[%02x-%02x]" % (lo, hi))])
    for busid, cls, vendor, device, osdevs, switch in devices:
        d = depth + 1
        if switch:
            bus = int(busid.split(":")[1], 16)
            w.open(d, "Bridge", [("bridge_type", "1-1"), ("depth", "1"),
                                 ("bridge_pci", "0000:[%02x-%02x]" % (bus, bus))] +
                   pci_attrs("0000:%02x:00.0" % (bus - 1), 0x0604, 0x1000, 0xc010))
            d += 1
        w.open(d, "PCIDev", pci_attrs(busid, cls, vendor, device))
        for name, ostype, infos in osdevs:
            w.leaf(d + 1, "OSDev", [("name", name), ("osdev_type", str(ostype))], infos)
        w.close(d)
        if switch:
            w.close(depth + 1)
    w.close(depth)


def numa(w, depth, node, cpus, gib):
    w.leaf(depth, "NUMANode", [("os_index", str(node))] + sets(cpus, [node]) +
           [("local_memory", str(gib * 1024 ** 3))])


def cores(w, depth, first_core, ncores, smt_offset, node):
    """Cores first_core.. with PUs c and c+smt_offset (Linux numbering of SMT siblings)."""
    for c in range(first_core, first_core + ncores):
        pus = [c] + ([c + smt_offset] if smt_offset else [])
        w.open(depth, "Core", [("os_index", str(c))] + sets(pus, [node]))
        for pu in pus:
            w.leaf(depth + 1, "PU", [("os_index", str(pu))] + sets([pu], [node]))
        w.close(depth)


def document(w, all_cpus, all_nodes, host, body):
    head = ['<?xml version="1.0" encoding="UTF-8"?>',
            '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
            '<topology version="2.0">']
    w.lines = []
    w.open(1, "Machine", [("os_index", "0")] + sets(all_cpus, all_nodes) +
           [("allowed_cpuset", mask(all_cpus)), ("allowed_nodeset", mask(all_nodes))])
    for name, value in [("Backend", "Linux"), ("OSName", "Linux"), ("HostName", host),
                        ("Architecture", "x86_64")]:
        w.info(2, name, value)
    body(w)
    w.close(1)
    return "\n".join(head + w.lines + ["</topology>", ""])


def ib_osdevs(name, netdev, lid, state="4", guid="0c42:a103:0000:%04x"):
    port = [("Port1State", state), ("Port1LID", lid), ("Port1LMC", "0"),
            ("Port1GID0", "fe80:0000:0000:0000:0c42:a103:0000:0001")]
    return [(name, 3, [("NodeGUID", guid % 1), ("SysImageGUID", guid % 1)] + port),
            (netdev, 2, [("Address", "00:00:10:29:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:00:00:01")])]


def dgx():
    # 8 NUMA nodes of 16 cores; core k has PUs k and k+128.
    gpu_numa = {0: 3, 1: 3, 2: 1, 3: 1, 4: 7, 5: 7, 6: 5, 7: 5}
    gpu_bus = {0: 0x07, 1: 0x0f, 2: 0x47, 3: 0x4e, 4: 0x87, 5: 0x90, 6: 0xb7, 7: 0xbd}
    nic_bus = {0: 0x0c, 1: 0x12, 2: 0x4b, 3: 0x54, 4: 0x8d, 5: 0x94, 6: 0xba, 7: 0xcc}

    def node_cpus(n):
        return [c for c in range(16 * n, 16 * n + 16)] + [c + 128 for c in range(16 * n, 16 * n + 16)]

    def body(w):
        for pkg in range(2):
            pkg_nodes = list(range(4 * pkg, 4 * pkg + 4))
            pkg_cpus = sum((node_cpus(n) for n in pkg_nodes), [])
            w.open(2, "Package", [("os_index", str(pkg))] + sets(pkg_cpus, pkg_nodes))
            w.info(3, "CPUVendor", "AuthenticAMD")
            w.info(3, "CPUModel", "AMD EPYC 7742 64-Core Processor")
            for n in pkg_nodes:
                w.open(3, "Group", sets(node_cpus(n), [n]))
                numa(w, 4, n, node_cpus(n), 128)
                cores(w, 4, 16 * n, 16, 128, n)
                devices = []
                for g in sorted(k for k, v in gpu_numa.items() if v == n):
                    # As hwloc shows them with its CUDA component: cudaN gives the ordinal.
                    devices.append(("0000:%02x:00.0" % gpu_bus[g], 0x0302, 0x10de, 0x20b0,
                                    [("card%d" % (g + 1), 1, []),
                                     ("cuda%d" % g, 5, [("CoProcType", "CUDA"),
                                                        ("GPUVendor", "NVIDIA Corporation"),
                                                        ("GPUModel", "NVIDIA A100-SXM4-80GB")])],
                                    True))
                for g in sorted(k for k, v in gpu_numa.items() if v == n):
                    devices.append(("0000:%02x:00.0" % nic_bus[g], 0x0207, 0x15b3, 0x101b,
                                    ib_osdevs("mlx5_%d" % g, "ibp%ds0" % nic_bus[g],
                                              "0x%x" % (0x10 + g)), True))
                if n == 2:  # storage NICs in RoCE mode (Ethernet link layer: LID 0)
                    for i, bus in enumerate([0x61, 0x62]):
                        devices.append(("0000:%02x:00.0" % bus, 0x0200, 0x15b3, 0x101d,
                                        ib_osdevs("mlx5_%d" % (8 + i), "enp%ds0f%d" % (bus, i),
                                                  "0x0"), False))
                if n == 0:  # NVSwitches (bridge class, not GPUs) and the on-board port
                    for i in range(6):
                        devices.append(("0000:%02x:00.0" % (0xc4 + i), 0x0680, 0x10de, 0x1af1,
                                        [], False))
                    devices.append(("0000:e1:00.0", 0x0200, 0x8086, 0x1533,
                                    [("enp225s0", 2, [("Address", "3c:ec:ef:00:00:01")])],
                                    False))
                if devices:
                    buses = [int(d[0].split(":")[1], 16) for d in devices]
                    write_pci_tree(w, 4, (min(buses) - 1, max(buses)), devices)
                w.close(3)
            w.close(2)

    return document(Writer(), list(range(256)), list(range(8)), "dgx-a100-01", body)


def cpu2():
    # 2 packages of 16 cores; core k has PUs k and k+32.
    def node_cpus(n):
        return list(range(16 * n, 16 * n + 16)) + list(range(16 * n + 32, 16 * n + 48))

    def body(w):
        for pkg in range(2):
            w.open(2, "Package", [("os_index", str(pkg))] + sets(node_cpus(pkg), [pkg]))
            w.info(3, "CPUVendor", "GenuineIntel")
            w.info(3, "CPUModel", "Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz")
            numa(w, 3, pkg, node_cpus(pkg), 96)
            cores(w, 3, 16 * pkg, 16, 32, pkg)
            if pkg == 0:
                write_pci_tree(w, 3, (0x17, 0x18), [
                    ("0000:18:00.0", 0x0207, 0x15b3, 0x1017,
                     ib_osdevs("mlx5_0", "ib0", "0x2a"), False)])
            else:
                write_pci_tree(w, 3, (0x85, 0x86), [
                    ("0000:86:00.0", 0x0200, 0x8086, 0x1572,
                     [("eno1", 2, [("Address", "a0:36:9f:00:00:01")])], False)])
            w.close(2)

    return document(Writer(), list(range(64)), [0, 1], "cpu-node-17", body)


def laptop():
    cpus = list(range(8))

    def body(w):
        w.open(2, "Package", [("os_index", "0")] + sets(cpus, [0]))
        w.info(3, "CPUVendor", "GenuineIntel")
        w.info(3, "CPUModel", "11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz")
        numa(w, 3, 0, cpus, 16)
        cores(w, 3, 0, 4, 4, 0)
        w.close(2)
        write_pci_tree(w, 2, (0x00, 0x00), [
            ("0000:00:02.0", 0x0300, 0x8086, 0x9a49, [("card0", 1, [])], False),
            ("0000:00:14.3", 0x0280, 0x8086, 0xa0f0,
             [("wlp0s20f3", 2, [("Address", "f4:a4:75:00:00:01")])], False)])

    return document(Writer(), cpus, [0], "laptop", body)


def workstation():
    cpus = list(range(16))

    def body(w):
        w.open(2, "Package", [("os_index", "0")] + sets(cpus, [0]))
        w.info(3, "CPUVendor", "AuthenticAMD")
        w.info(3, "CPUModel", "AMD Ryzen 7 5800X 8-Core Processor")
        numa(w, 3, 0, cpus, 64)
        cores(w, 3, 0, 8, 8, 0)
        write_pci_tree(w, 3, (0x00, 0x2f), [
            ("0000:2d:00.0", 0x0300, 0x10de, 0x2204, [("card1", 1, [])], False),
            ("0000:2e:00.1", 0x0403, 0x10de, 0x1aef, [], False),  # the GPU's audio function
            ("0000:0b:00.0", 0x0300, 0x10de, 0x2204, [("card0", 1, [])], False),
            ("0000:05:00.0", 0x0200, 0x10ec, 0x8125,
             [("enp5s0", 2, [("Address", "00:d8:61:00:00:01")])], False)])
        w.close(2)

    return document(Writer(), cpus, [0], "workstation", body)


def ib_down():
    cpus = list(range(4))

    def body(w):
        w.open(2, "Package", [("os_index", "0")] + sets(cpus, [0]))
        numa(w, 3, 0, cpus, 8)
        cores(w, 3, 0, 4, 0, 0)
        w.close(2)
        write_pci_tree(w, 2, (0x00, 0x03), [
            ("0000:03:00.0", 0x0207, 0x15b3, 0x1017,
             ib_osdevs("mlx5_0", "ib0", "0x0", state="1"), False)])

    return document(Writer(), cpus, [0], "ib-down", body)


if __name__ == "__main__":
    for name, make in [("dgx_a100", dgx), ("cpu_2socket_ib", cpu2), ("laptop", laptop),
                       ("gpu_workstation", workstation),
                       ("ib_down", ib_down)]:
        with open(os.path.join(HERE, name + ".xml"), "w") as f:
            f.write(make())

#include "topology/binding.h"

#include <algorithm>

#include "common/error.h"

namespace mncl::topology {

namespace {

// Items [first, last) of n given to `rank` of `ranks` in contiguous blocks; at least one item,
// so with more ranks than items neighbouring ranks share one.
std::pair<int, int> block(int rank, int ranks, int n) {
  const int first = static_cast<int>(static_cast<long long>(rank) * n / ranks);
  const int last = static_cast<int>(static_cast<long long>(rank + 1) * n / ranks);
  return {first, std::max(last, first + 1)};
}

std::string range_text(const std::vector<int> &ids) {
  return CpuSet(ids).to_string();
}

Binding unbound(const std::string &reason) {
  return Binding{CpuSet(), reason};
}

// The NUMA nodes that are CPU domains of their own: a memory-only node (HBM beside each DDR
// node, a CXL expander behind a package or the machine) carries the PUs of the object it hangs
// from in hwloc 2, the same as a node's or the union of several, and counting it would give a
// rank the whole machine or pile two ranks on one node. Kept: the nodes with CPUs that hold no
// other node's CPUs as a strict subset, the first of several with the same CPUs.
std::vector<const NumaNode *> cpu_domains(const Summary &t) {
  std::vector<const NumaNode *> nodes;
  for (const auto &n : t.numa_nodes) {
    if (n.cpus.empty()) continue;
    const bool covers_another =
        std::any_of(t.numa_nodes.begin(), t.numa_nodes.end(), [&](const NumaNode &m) {
          return !m.cpus.empty() && m.cpus != n.cpus && n.cpus.includes(m.cpus);
        });
    const bool same_as_kept = std::any_of(nodes.begin(), nodes.end(),
                                          [&](const NumaNode *m) { return m->cpus == n.cpus; });
    if (!covers_another && !same_as_kept) nodes.push_back(&n);
  }
  return nodes;
}

Binding spread_over_numa(const Summary &t, const BindRequest &r, const std::string &prefix) {
  const std::vector<const NumaNode *> nodes = cpu_domains(t);
  if (nodes.empty()) return unbound(prefix + "no NUMA node with CPUs is known: not bound");
  const auto [first, last] = block(r.local_rank, r.local_size, static_cast<int>(nodes.size()));
  CpuSet cpus;
  std::vector<int> ids;
  for (int i = first; i < last; ++i) {
    cpus = cpus | nodes[i]->cpus;
    ids.push_back(nodes[i]->os_index);
  }
  const std::string where =
      format("%s%s %s (CPUs %s)", prefix.c_str(), ids.size() == 1 ? "NUMA node" : "NUMA nodes",
             range_text(ids).c_str(), cpus.to_string().c_str());
  if (cpus == t.all_cpus) return unbound(where + ", the whole machine: not bound");
  return Binding{cpus, where};
}

Binding spread_over_cores(const Summary &t, const BindRequest &r, const std::string &prefix) {
  if (t.cores.empty()) return unbound(prefix + "no cores are known: not bound");
  const int n = t.num_cores();
  const auto [first, last] = block(r.local_rank, r.local_size, n);
  CpuSet cpus;
  for (int i = first; i < last; ++i) cpus = cpus | t.cores[i].pus;
  const std::string shared = r.local_size > n ? ", shared: more ranks than cores" : "";
  const std::string which =
      last - first == 1 ? format("core %d", first) : format("cores %d-%d", first, last - 1);
  return Binding{cpus, format("%s%s of %d (CPUs %s%s)", prefix.c_str(), which.c_str(), n,
                              cpus.to_string().c_str(), shared.c_str())};
}

}  // namespace

const char *bind_mode_name(BindMode mode) {
  switch (mode) {
    case BindMode::kNone:
      return "none";
    case BindMode::kNuma:
      return "numa";
    case BindMode::kCore:
      return "core";
    case BindMode::kAuto:
      return "auto";
  }
  return "?";
}

BindMode parse_bind_mode(const std::string &text) {
  for (BindMode mode : {BindMode::kNone, BindMode::kNuma, BindMode::kCore, BindMode::kAuto}) {
    if (text == bind_mode_name(mode)) return mode;
  }
  MNCL_CHECK(text.empty(), MNCL_ERR_INVALID_ARGUMENT,
             "MNCL_BIND='%s' is not none, numa, core or auto", text.c_str());
  return BindMode::kAuto;
}

namespace {

Binding compute_binding_with_isolated(const Summary &t, const BindRequest &r);

}  // namespace

// The binding without the isolated CPUs (isolcpus=): the scheduler does not balance threads
// onto them, so a thread that lands there stays, beside the work they were set aside for.
Binding compute_binding(const Summary &t, const BindRequest &r) {
  Binding b = compute_binding_with_isolated(t, r);
  if (!b.cpus.empty() && !t.isolated_cpus.empty() && b.cpus.intersects(t.isolated_cpus)) {
    const CpuSet kept = b.cpus - t.isolated_cpus;
    if (kept.empty()) return unbound(b.reason + ", all of them isolated (isolcpus): not bound");
    b.reason +=
        format(" (without the isolated CPUs %s)", (b.cpus & t.isolated_cpus).to_string().c_str());
    b.cpus = kept;
  }
  return b;
}

namespace {

Binding compute_binding_with_isolated(const Summary &t, const BindRequest &r) {
  const std::string mode = format("MNCL_BIND=%s: ", bind_mode_name(r.mode));
  if (r.mode == BindMode::kNone) return unbound(mode + "not bound");
  if (r.ranks_in_process > 1) {
    return unbound(mode + format("%d ranks share this process: not bound", r.ranks_in_process));
  }
  if (r.local_rank < 0 || r.local_size < 1 || r.local_rank >= r.local_size) {
    return unbound(mode + "local rank unknown: not bound");
  }
  std::string prefix = mode + format("local rank %d of %d: ", r.local_rank, r.local_size);
  if (r.mode == BindMode::kNuma) return spread_over_numa(t, r, prefix);
  if (r.mode == BindMode::kCore) return spread_over_cores(t, r, prefix);

  // auto: the launcher's binding wins; it knows the whole job's placement. Every CPU but the
  // isolated ones (isolcpus=) is the kernel's default affinity, not a launcher's choice.
  if (!r.current.empty() && r.current != t.all_cpus && r.current != t.all_cpus - t.isolated_cpus &&
      t.all_cpus.includes(r.current)) {
    return unbound(mode + format("already bound to CPUs %s (by the launcher?): left alone",
                                 r.current.to_string().c_str()));
  }
  if (r.threads_bound_apart) {
    return unbound(mode +
                   "the process's threads are bound to different CPUs (by OpenMP or "
                   "another runtime?): left alone");
  }
  if (r.gpu >= 0 && !t.gpu_order_caveat.empty()) {
    // Binding near the wrong GPU is worse than spreading: another rank's GPU, its node shared.
    prefix += format("GPU %d unknown (%s), ", r.gpu, t.gpu_order_caveat.c_str());
  } else if (r.gpu >= 0) {
    const Gpu *gpu = t.gpu(r.gpu);
    if (gpu == nullptr && t.num_gpus() > 0 && r.local_size > t.num_gpus()) {
      // Fewer GPUs visible than ranks on the host: each process was given its own subset
      // (CUDA_VISIBLE_DEVICES per task: Slurm's --gpus-per-task), and the nccl plugin takes
      // device gpu % count of it in turn; so does the placement.
      gpu = t.gpu(r.gpu % t.num_gpus());
      prefix += format("device %d of %d visible: ", r.gpu, t.num_gpus());
    }
    if (gpu != nullptr && !gpu->locality.cpus.empty() && gpu->locality.cpus != t.all_cpus &&
        t.all_cpus.includes(gpu->locality.cpus)) {
      const std::string numa =
          gpu->locality.numa >= 0 ? format(", NUMA node %d", gpu->locality.numa) : "";
      return Binding{gpu->locality.cpus, format("%snear GPU %d (%s%s): CPUs %s", prefix.c_str(),
                                                gpu->ordinal, gpu->pci_bus_id.c_str(), numa.c_str(),
                                                gpu->locality.cpus.to_string().c_str())};
    }
    const int ordinal = gpu != nullptr ? gpu->ordinal : r.gpu;
    prefix += gpu == nullptr               ? format("GPU %d not in the topology, ", ordinal)
              : gpu->locality.cpus.empty() ? format("GPU %d's CPUs unknown, ", ordinal)
              : !t.all_cpus.includes(gpu->locality.cpus)
                  ? format("GPU %d's CPUs %s not all allowed here, ", ordinal,
                           gpu->locality.cpus.to_string().c_str())
                  : format("GPU %d is near every CPU, ", ordinal);
  }
  return spread_over_numa(t, r, prefix);
}

}  // namespace

}  // namespace mncl::topology

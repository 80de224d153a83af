// Where each rank's threads should run (MNCL_BIND), as a pure function of the topology and
// the rank's place on its host; the core applies the result with Topology::bind and logs it.
//
//   none  leave the process where the launcher put it.
//   numa  spread the host's ranks over its NUMA nodes (those with CPUs), in blocks by local
//         rank: 2 ranks on 8 nodes get 4 nodes each; 16 ranks on 8 nodes share a node by pairs.
//   core  spread the host's ranks over its cores, in blocks by local rank, with all hardware
//         threads of each core (more ranks than cores: neighbours share a core).
//   auto  (default) a rank using a GPU: the CPUs near that GPU (its NUMA node), when they are
//         not the whole machine; otherwise as numa, unless that gives the whole machine
//         (one NUMA node, or one rank per host). A process the launcher already bound to a
//         subset of the machine (mpirun --bind-to, srun --cpu-bind, taskset) is left alone.
//
// A rank whose local rank is unknown is never bound: spreading needs it. Nor is a process
// that hosts several ranks (threads as ranks, in tests): one placement cannot suit them all.
#pragma once

#include <string>

#include "topology/cpuset.h"
#include "topology/summary.h"

namespace mncl::topology {

enum class BindMode { kNone, kNuma, kCore, kAuto };
const char *bind_mode_name(BindMode mode);
// MNCL_BIND's value ("" means auto); throws mncl::Error(MNCL_ERR_INVALID_ARGUMENT) naming the
// variable and the bad value.
BindMode parse_bind_mode(const std::string &text);

struct BindRequest {
  BindMode mode = BindMode::kAuto;
  int local_rank = -1;  // -1: unknown
  int local_size = -1;
  int gpu = -1;    // CUDA ordinal this rank drives; -1: none (host-memory job)
  CpuSet current;  // the process's binding now; empty: unknown
  // A runtime placed the process's threads one by one (OpenMP's OMP_PROC_BIND: the main thread
  // on fewer CPUs than the threads together), which a process binding would undo.
  bool threads_bound_apart = false;
  int ranks_in_process = 1;  // ranks of the communicator living in this very process
};

struct Binding {
  CpuSet cpus;         // empty: leave the process alone
  std::string reason;  // "local rank 1 of 2: NUMA nodes 4-7 (CPUs 64-127,192-255)"
};

Binding compute_binding(const Summary &topology, const BindRequest &request);

}  // namespace mncl::topology

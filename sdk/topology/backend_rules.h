// Which backend a careful engineer would pick for this job on this machine: a pure function of
// the topology summary, the job's facts and the plugins that loaded (with their probe results).
// Every rank runs it; ranks that see the same facts reach the same answer, and agreement.h
// settles the rest.
//
// The rules, most preferred first, among the plugins that loaded and whose probe returned a
// score > 0 (and that handle host memory, when the buffers are in host memory):
//
//   per-memory override  MNCL_BACKEND_HOST / MNCL_BACKEND_CUDA (a name or a comma list, tried
//                        in order) replaces the rules below for that memory type; nothing
//                        usable in it is an error, never a silent fallback.
//   CUDA memory          nccl, then any other plugin with MNCL_CAP_CUDA_MEMORY (highest probe
//                        score first), then the host rules below: the core stages device
//                        buffers through host memory.
//   host, one host       shm, when that plugin is installed (all ranks share memory).
//   host, under MPI      flat: mpirun/srun already wired the ranks together and MPI drives the
//                        fabric (InfiniBand or TCP) itself.
//   host, otherwise      gloo, over TCP (loopback on one host; between hosts IPoIB where
//                        their addresses are on InfiniBand: Gloo's ibverbs transport has no
//                        unbound buffers, which the gloo plugin needs).
//   anything else        the remaining plugins by probe score (third-party backends);
//   last                 naive, the store-based reference: only when nothing else loads.
//
// Probe scores decide usability and order the plugins these rules do not name; the rules,
// not raw scores, order the ones they name, because independently written plugins cannot know
// each other's scores. A plugin the loader refused (Candidate::refused) is a candidate too,
// never usable, so that an override naming it, or a rule preferring it, reports why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/summary.h"

namespace mncl::topology {

enum class MemoryType { kHost, kCuda };
const char *memory_name(MemoryType memory);  // "host", "cuda"
// MNCL_MEMORY: "host", "cuda", or "auto" (cuda when this host has an NVIDIA GPU). Throws
// mncl::Error(MNCL_ERR_INVALID_ARGUMENT) naming the variable and the bad value.
MemoryType resolve_memory(const std::string &setting, const Summary &topology);

struct JobFacts {
  int size = 1;
  int local_size = -1;  // ranks on this host; -1 unknown
  int num_hosts = -1;   // -1 unknown (before the rendezvous)
  bool launched_by_mpi = false;
  MemoryType memory = MemoryType::kHost;
};
// True when every rank is known to run on this host.
bool single_host(const JobFacts &facts);

struct Candidate {
  std::string name;    // "gloo"
  uint64_t caps = 0;   // MNCL_CAP_* of its table
  int score = 0;       // its probe's score; 0: unusable
  std::string reason;  // its probe's reason (why unusable, or a remark)
  // Why the loader refused the file (dlopen failed, init() refused, ...): a plugin that is
  // installed but unusable, never "not installed". "" for a plugin that loaded (the
  // initializer lets {name, caps, score, reason} leave it out without a warning).
  std::string refused{};
};

struct Overrides {
  std::string host;  // MNCL_BACKEND_HOST: "" (rules), "gloo", "flat,gloo"
  std::string cuda;  // MNCL_BACKEND_CUDA
};

enum class Rule {
  kOverride,       // MNCL_BACKEND_HOST / MNCL_BACKEND_CUDA
  kCudaNccl,       // CUDA memory -> nccl
  kCudaCapable,    // CUDA memory -> another plugin handling device pointers
  kSingleHostShm,  // host memory, one host -> shm
  kMpiFlat,        // host memory, launched by MPI -> flat
  kGloo,           // host memory -> gloo (over TCP)
  kBestScore,      // a plugin the rules do not name, by probe score
  kNaive,          // nothing else usable
  kNone,           // nothing usable at all
};
const char *rule_name(Rule rule);

struct Decision {
  std::string backend;  // "" when nothing is usable (reason says why)
  Rule rule = Rule::kNone;
  std::string reason;  // one line for the log and mncl-info
  // Every usable candidate, most preferred first (backend is ranked[0]): what a rank publishes
  // so that ranks seeing different machines can still agree (agreement.h).
  std::vector<std::string> ranked;
};

Decision decide_backend(const Summary &topology, const JobFacts &facts,
                        const std::vector<Candidate> &candidates, const Overrides &overrides);

}  // namespace mncl::topology

#include "topology/backend_rules.h"

#include <mncl/mncl_plugin.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "common/error.h"

namespace mncl::topology {

namespace {

std::vector<std::string> split_list(const std::string &spec) {
  std::vector<std::string> items;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

std::string plural(int n, const char *what) {
  return format("%d %s%s", n, what, n == 1 ? "" : "s");
}

std::string job_text(const JobFacts &f) {
  std::string hosts = single_host(f)    ? "one host"
                      : f.num_hosts > 0 ? plural(f.num_hosts, "host")
                                        : "an unknown number of hosts";
  return format("%s memory, %s on %s%s", memory_name(f.memory), plural(f.size, "rank").c_str(),
                hosts.c_str(), f.launched_by_mpi ? ", launched by MPI" : "");
}

const Candidate *find(const std::vector<Candidate> &candidates, const std::string &name) {
  for (const auto &c : candidates) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// Why a candidate cannot serve this job; "" when it can.
std::string unusable_because(const Candidate *c, MemoryType memory) {
  if (c == nullptr) return "not installed";
  if (!c->refused.empty()) return "refused: " + c->refused;
  if (c->score <= 0) return "unusable: " + (c->reason.empty() ? "probe said no" : c->reason);
  if (memory == MemoryType::kHost && !(c->caps & MNCL_CAP_HOST_MEMORY)) {
    return "does not handle host memory";
  }
  return "";
}

// Where the rules put a usable candidate: lower is preferred.
int tier(const Candidate &c, const JobFacts &f) {
  const bool cuda = f.memory == MemoryType::kCuda;
  if (cuda && c.name == "nccl" && (c.caps & MNCL_CAP_CUDA_MEMORY)) return 0;
  if (cuda && c.name != "naive" && (c.caps & MNCL_CAP_CUDA_MEMORY)) return 1;
  if (c.name == "shm" && single_host(f)) return 2;
  if (c.name == "flat" && f.launched_by_mpi) return 3;
  if (c.name == "gloo") return 4;
  if (c.name == "naive") return 6;
  return 5;
}

Rule rule_of_tier(int t) {
  static const Rule rules[] = {Rule::kCudaNccl, Rule::kCudaCapable, Rule::kSingleHostShm,
                               Rule::kMpiFlat,  Rule::kGloo,        Rule::kBestScore,
                               Rule::kNaive};
  return rules[t];
}

// The backends the rules name for these facts, with their tiers (to report what was passed
// over).
std::vector<std::pair<std::string, int>> preferred_names(const JobFacts &f) {
  std::vector<std::pair<std::string, int>> names;
  if (f.memory == MemoryType::kCuda) names.emplace_back("nccl", 0);
  if (single_host(f)) names.emplace_back("shm", 2);
  if (f.launched_by_mpi) names.emplace_back("flat", 3);
  names.emplace_back("gloo", 4);
  return names;
}

std::string rule_reason(Rule rule, const Candidate &c, const Summary &t, const JobFacts &f) {
  const bool one = single_host(f);
  switch (rule) {
    case Rule::kCudaNccl:
      return format("%s: nccl", plural(t.num_gpus(), "NVIDIA GPU").c_str());
    case Rule::kCudaCapable:
      return format("%s handles CUDA buffers (probe score %d)", c.name.c_str(), c.score);
    case Rule::kSingleHostShm:
      return "every rank on one host: shm (shared memory)";
    case Rule::kMpiFlat:
      return one ? "launched by MPI: flat"
             : t.has_infiniband()
                 ? "launched by MPI: flat, MPI drives the InfiniBand fabric"
                 : "launched by MPI: flat, MPI drives the network (TCP, no InfiniBand)";
    case Rule::kGloo:
      // TCP only: Gloo's ibverbs transport has no unbound buffers (the plugin refuses it).
      return format("%s%s", f.launched_by_mpi ? "" : "not launched by MPI, ",
                    one                  ? "one host: gloo over TCP loopback"
                    : t.has_infiniband() ? "gloo over TCP (IPoIB where the hosts' addresses are "
                                           "on InfiniBand)"
                                         : "no InfiniBand: gloo over TCP");
    case Rule::kBestScore:
      return format("%s has the highest probe score (%d) of the remaining plugins", c.name.c_str(),
                    c.score);
    case Rule::kNaive:
      return "nothing else is usable: naive (the store-based reference backend, slow)";
    default:
      return "";
  }
}

}  // namespace

const char *memory_name(MemoryType memory) {
  return memory == MemoryType::kCuda ? "CUDA" : "host";
}

MemoryType resolve_memory(const std::string &setting, const Summary &topology) {
  if (setting == "host") return MemoryType::kHost;
  if (setting == "cuda") return MemoryType::kCuda;
  MNCL_CHECK(setting.empty() || setting == "auto", MNCL_ERR_INVALID_ARGUMENT,
             "MNCL_MEMORY='%s' is not auto, host or cuda", setting.c_str());
  // A job on a GPU host is a GPU job unless told otherwise, as with every DL framework.
  return topology.num_gpus() > 0 ? MemoryType::kCuda : MemoryType::kHost;
}

bool single_host(const JobFacts &f) {
  if (f.size <= 1 || f.num_hosts == 1) return true;
  return f.num_hosts < 0 && f.local_size >= f.size;
}

const char *rule_name(Rule rule) {
  switch (rule) {
    case Rule::kOverride:
      return "override";
    case Rule::kCudaNccl:
      return "cuda-nccl";
    case Rule::kCudaCapable:
      return "cuda-capable";
    case Rule::kSingleHostShm:
      return "single-host-shm";
    case Rule::kMpiFlat:
      return "mpi-flat";
    case Rule::kGloo:
      return "gloo";
    case Rule::kBestScore:
      return "best-score";
    case Rule::kNaive:
      return "naive-last";
    case Rule::kNone:
      return "none";
  }
  return "?";
}

Decision decide_backend(const Summary &topology, const JobFacts &facts,
                        const std::vector<Candidate> &candidates, const Overrides &overrides) {
  Decision d;
  const bool cuda = facts.memory == MemoryType::kCuda;

  // A per-memory override is the user's word: its order, and an error if nothing in it works.
  const std::string &override_list = cuda ? overrides.cuda : overrides.host;
  if (!override_list.empty()) {
    const char *var = cuda ? "MNCL_BACKEND_CUDA" : "MNCL_BACKEND_HOST";
    std::string refused;
    for (const std::string &name : split_list(override_list)) {
      const std::string why = unusable_because(find(candidates, name), facts.memory);
      if (why.empty()) {
        d.ranked.push_back(name);
      } else {
        refused += format("; %s %s", name.c_str(), why.c_str());
      }
    }
    if (d.ranked.empty()) {
      d.reason = format("%s=%s: nothing in it is usable here%s", var, override_list.c_str(),
                        refused.c_str());
      return d;
    }
    d.backend = d.ranked.front();
    d.rule = Rule::kOverride;
    d.reason =
        format("%s=%s: %s%s", var, override_list.c_str(), d.backend.c_str(), refused.c_str());
    return d;
  }

  std::vector<const Candidate *> usable;
  for (const auto &c : candidates) {
    if (unusable_because(&c, facts.memory).empty()) usable.push_back(&c);
  }
  if (usable.empty()) {
    d.reason = format("%s: no plugin is usable", job_text(facts).c_str());
    for (const auto &c : candidates) {
      d.reason += format("; %s %s", c.name.c_str(), unusable_because(&c, facts.memory).c_str());
    }
    if (candidates.empty()) d.reason += " (none loaded from the plugin path)";
    return d;
  }
  std::stable_sort(usable.begin(), usable.end(), [&](const Candidate *a, const Candidate *b) {
    const int ta = tier(*a, facts), tb = tier(*b, facts);
    if (ta != tb) return ta < tb;
    if (a->score != b->score) return a->score > b->score;
    return a->name < b->name;
  });
  for (const Candidate *c : usable) d.ranked.push_back(c->name);

  const Candidate &best = *usable.front();
  const int best_tier = tier(best, facts);
  d.backend = best.name;
  d.rule = rule_of_tier(best_tier);
  d.reason = rule_reason(d.rule, best, topology, facts);
  if (cuda && d.rule != Rule::kCudaNccl && d.rule != Rule::kCudaCapable) {
    d.reason = "no CUDA-capable backend usable, device buffers are staged through host memory; " +
               d.reason;
  }
  // Say which preferred backends were passed over, and why: the first thing a user asks.
  std::string passed;
  for (const auto &[name, name_tier] : preferred_names(facts)) {
    if (name_tier >= best_tier) break;
    const std::string why = unusable_because(find(candidates, name), facts.memory);
    if (!why.empty())
      passed += format("%s%s %s", passed.empty() ? "" : "; ", name.c_str(), why.c_str());
  }
  d.reason = job_text(facts) + " -> " + d.reason;
  if (!passed.empty()) d.reason += "; passed over: " + passed;
  return d;
}

}  // namespace mncl::topology

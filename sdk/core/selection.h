// Choosing a backend on one rank: MNCL_BACKEND (or config.backend) is a name, a path, a comma
// list of fallbacks tried in order, or "auto" — the topology-aware rules of
// topology/backend_rules.h over every plugin that loads (with MNCL_BACKEND_HOST /
// MNCL_BACKEND_CUDA replacing the rules for one memory type). Agreement across ranks is the
// communicator's job (comm.cpp, topology/agreement.h).
#pragma once

#include <mncl/mncl_plugin.h>

#include <memory>
#include <string>
#include <vector>

#include "core/launch_env.h"
#include "loader/plugin_loader.h"
#include "topology/agreement.h"
#include "topology/backend_rules.h"

namespace mncl::core {

struct ProbeResult {
  std::string name;
  uint64_t caps = 0;   // the plugin's MNCL_CAP_* (for the memory-type rules)
  int32_t score = 0;   // 0: unusable
  std::string reason;  // the plugin's reason, or why it could not be probed
};

struct Selection {
  std::shared_ptr<loader::Plugin> plugin;
  std::string why;                  // "MNCL_BACKEND=naive" / "auto: host memory, ... -> gloo"
  std::vector<ProbeResult> probed;  // every candidate considered, in order
  topology::MemoryType memory = topology::MemoryType::kHost;  // the buffers' memory (rules)
  // What this rank publishes for the agreement: its choice, whether the user forced it, and
  // (auto) every usable backend best first.
  topology::RankChoice choice;
};

// Facts about this job and machine handed to each plugin's probe. local_size and num_hosts
// are known after the rendezvous; before it (mncl-info) they come from the launcher or are -1.
mncl_probe_v1_t probe_info(const LaunchSettings &settings, int local_size = -1, int num_hosts = -1);
// Probes one loaded plugin (a throwing or misbehaving probe counts as unusable).
ProbeResult probe(const loader::Plugin &plugin, const mncl_probe_v1_t &info);
// Throws mncl::Error(MNCL_ERR_PLUGIN) explaining each candidate when none is usable, and
// MNCL_ERR_INVALID_ARGUMENT for a bad MNCL_MEMORY or a plugin that refused its own settings
// (a candidate of auto's, or one named). The plugin folders are searched at most once,
// through discovery (a communicator's creation passes its own, which the agreement then uses
// too), or through one of this call's without one.
Selection select_backend(const LaunchSettings &settings, const mncl_probe_v1_t &info,
                         loader::Discovery *discovery = nullptr);

}  // namespace mncl::core

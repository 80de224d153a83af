// Choosing a backend on one rank: MNCL_BACKEND (or config.backend) is a name, a path, a comma
// list of fallbacks tried in order, or "auto" — the loadable plugin with the highest probe
// score. Agreement across ranks is the communicator's job (comm.cpp).
#pragma once

#include <mncl/mncl_plugin.h>

#include <memory>
#include <string>
#include <vector>

#include "core/launch_env.h"
#include "loader/plugin_loader.h"

namespace mncl::core {

struct ProbeResult {
  std::string name;
  int32_t score = 0;     // 0: unusable
  std::string reason;    // the plugin's reason, or why it could not be probed
};

struct Selection {
  std::shared_ptr<loader::Plugin> plugin;
  std::string why;                   // "MNCL_BACKEND=naive" / "auto: highest score 10 of ..."
  std::vector<ProbeResult> probed;   // every candidate considered, in order
};

// Facts about this job and machine handed to each plugin's probe.
mncl_probe_v1_t probe_info(const LaunchSettings &settings);
// Probes one loaded plugin (a throwing or misbehaving probe counts as unusable).
ProbeResult probe(const loader::Plugin &plugin, const mncl_probe_v1_t &info);
// Throws mncl::Error(MNCL_ERR_PLUGIN) explaining each candidate when none is usable.
Selection select_backend(const std::string &spec, const mncl_probe_v1_t &info);

}  // namespace mncl::core

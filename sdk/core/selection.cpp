#include "core/selection.h"

#include <sys/stat.h>

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/log.h"

namespace mncl::core {

namespace {

std::vector<std::string> split_list(const std::string &spec) {
  std::vector<std::string> items;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

bool path_exists(const char *path) {
  struct stat st;
  return ::stat(path, &st) == 0;
}

}  // namespace

mncl_probe_v1_t probe_info(const LaunchSettings &settings) {
  mncl_probe_v1_t info{};
  info.struct_size = sizeof info;
  info.size = settings.size;
  info.local_size = settings.local_size;
  info.num_hosts = -1;  // known only after the rendezvous
  info.num_gpus = -1;   // the topology issue fills these from hwloc
  info.has_infiniband = path_exists("/sys/class/infiniband") ? 1 : 0;
  info.launched_by_mpi = settings.launched_by_mpi ? 1 : 0;
  return info;
}

ProbeResult probe(const loader::Plugin &plugin, const mncl_probe_v1_t &info) {
  ProbeResult result;
  result.name = plugin.name();
  char reason[512] = "";
  int32_t score = 0;
  const mncl_status_t status = plugin.table().probe(&info, &score, reason, sizeof reason);
  reason[sizeof reason - 1] = '\0';
  if (status != MNCL_OK) {
    result.reason = format("probe failed: %s: %s", status_name(status), last_error());
  } else {
    result.score = std::max(score, 0);
    result.reason = reason;
  }
  return result;
}

Selection select_backend(const std::string &spec, const mncl_probe_v1_t &info) {
  Selection selection;
  std::string failures;
  for (const std::string &candidate : split_list(spec)) {
    if (candidate == "auto") {
      const loader::PluginReport *best = nullptr;
      ProbeResult best_probe;
      auto reports = loader::discover();
      for (const auto &report : reports) {
        if (!report.loaded) continue;
        ProbeResult p = probe(*report.plugin, info);
        selection.probed.push_back(p);
        if (p.score > best_probe.score) {
          best = &report;
          best_probe = p;
        }
      }
      if (best != nullptr) {
        selection.plugin = best->plugin;
        selection.why = format("auto: highest probe score (%d) among %zu usable plugins",
                               best_probe.score, selection.probed.size());
        return selection;
      }
      failures += "\n  auto: no plugin found in the search path is usable here";
      continue;
    }
    try {
      auto plugin = loader::load(candidate);
      ProbeResult p = probe(*plugin, info);
      selection.probed.push_back(p);
      if (p.score > 0) {
        selection.plugin = plugin;
        selection.why = format("requested '%s' (probe score %d)", candidate.c_str(), p.score);
        return selection;
      }
      failures += format("\n  %s: unusable here: %s", candidate.c_str(), p.reason.c_str());
    } catch (const Error &e) {
      failures += format("\n  %s: %s", candidate.c_str(), e.what());
    }
  }
  throw Error(MNCL_ERR_PLUGIN,
              format("no usable backend for MNCL_BACKEND='%s':%s", spec.c_str(), failures.c_str()));
}

}  // namespace mncl::core

#include "core/selection.h"

#include <cxxabi.h>
#include <sys/stat.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <sstream>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "topology/hwloc_topology.h"

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

// An empty summary stands in for a machine hwloc could not read: the rules then go by the
// job's facts alone (no GPU, no InfiniBand known).
const topology::Summary &machine_summary() {
  static const topology::Summary unknown;
  const topology::Topology *machine = topology::this_machine();
  return machine ? machine->summary() : unknown;
}

// What decides whether the core runs a call natively or through a fallback (agreement.h).
std::string build_of(const loader::Plugin &plugin) {
  const auto &t = plugin.table();
  return format("plugin ABI v%u, collectives 0x%x, dtypes 0x%x, ops 0x%x", plugin.abi_version(),
                t.coll_mask, t.dtype_mask, t.op_mask);
}

}  // namespace

mncl_probe_v1_t probe_info(const LaunchSettings &settings, int local_size, int num_hosts) {
  mncl_probe_v1_t info{};
  info.struct_size = sizeof info;
  info.size = settings.size;
  info.local_size = local_size >= 1            ? local_size
                    : settings.local_size >= 1 ? settings.local_size
                    : settings.size == 1       ? 1
                                               : -1;
  info.num_hosts = num_hosts >= 1 ? num_hosts : settings.size == 1 ? 1 : -1;
  if (const topology::Topology *machine = topology::this_machine()) {
    info.num_gpus = machine->summary().num_gpus();
    info.has_infiniband = machine->summary().has_infiniband() ? 1 : 0;
  } else {
    info.num_gpus = -1;
    info.has_infiniband = path_exists("/sys/class/infiniband") ? 1 : 0;
  }
  info.launched_by_mpi = settings.launched_by_mpi ? 1 : 0;
  return info;
}

ProbeResult probe(const loader::Plugin &plugin, const mncl_probe_v1_t &info) {
  ProbeResult result;
  result.name = plugin.name();
  result.caps = plugin.table().caps;
  char reason[512] = "";
  int32_t score = 0;
  mncl_status_t status = MNCL_ERR_INTERNAL;
  std::optional<std::string> thrown;
  // The probe reports through the thread's last error (host->set_error); a probe that fails
  // without a message must not show one left by an earlier call, and the caller's stays intact.
  const std::string saved_error = last_error();
  set_last_error("");
  try {
    status = plugin.table().probe(&info, &score, reason, sizeof reason);
  } catch (abi::__forced_unwind &) {
    set_last_error(saved_error);
    throw;  // thread cancellation: never swallowed
  } catch (const std::exception &e) {
    thrown = e.what();
  } catch (...) {
    thrown = "an exception that is not a std::exception";
  }
  const std::string message = last_error();
  set_last_error(saved_error);
  reason[sizeof reason - 1] = '\0';
  if (thrown) {
    result.reason = "probe threw: " + *thrown;
  } else if (status != MNCL_OK) {
    result.reason = format("probe failed: %s: %s", status_name(status),
                           message.empty() ? "(no message)" : message.c_str());
  } else {
    result.score = std::max(score, 0);
    result.reason = reason;
  }
  return result;
}

namespace {

// An override list (MNCL_BACKEND_HOST=FLAT) with each name as a candidate spells it, where
// exactly one candidate has that name in another case.
std::string in_their_case(const std::string &list,
                          const std::vector<topology::Candidate> &candidates) {
  std::string out;
  for (const std::string &name : split_list(list)) {
    std::string spelt = name;
    const auto exact = std::find_if(candidates.begin(), candidates.end(),
                                    [&](const topology::Candidate &c) { return c.name == name; });
    if (exact == candidates.end()) {
      const auto same = [&](const topology::Candidate &c) {
        return env::lower(c.name) == env::lower(name);
      };
      if (std::count_if(candidates.begin(), candidates.end(), same) == 1) {
        spelt = std::find_if(candidates.begin(), candidates.end(), same)->name;
      }
    }
    out += (out.empty() ? "" : ",") + spelt;
  }
  return out;
}

}  // namespace

Selection select_backend(const LaunchSettings &settings, const mncl_probe_v1_t &info,
                         loader::Discovery *discovery) {
  const std::string &spec = settings.backend_spec;
  const topology::Summary &machine = machine_summary();
  // One search for the whole list: "auto" and an unknown name's list of the available ones
  // (each search loads and initializes every plugin, and logs each refusal).
  loader::Discovery own;
  loader::Discovery &plugins = discovery ? *discovery : own;
  Selection selection;
  selection.memory = topology::resolve_memory(settings.memory, machine);
  std::string failures;
  for (const std::string &candidate : split_list(spec)) {
    if (candidate == "auto") {
      std::vector<std::shared_ptr<loader::Plugin>> loaded;
      std::vector<topology::Candidate> candidates;
      for (const auto &report : plugins.reports()) {
        // A plugin that refused its own settings (MNCL_SHM_CHUNK=1K) is an error, not a
        // backend to pass over: the job would run on another one, slower, with no complaint.
        if (loader::refusal_status(report) == MNCL_ERR_INVALID_ARGUMENT) {
          throw Error(
              MNCL_ERR_INVALID_ARGUMENT,
              format("backend '%s' refused its settings: %s; correct or unset them "
                     "(%s)",
                     report.name.c_str(),
                     (report.init_message.empty() ? report.reason : report.init_message).c_str(),
                     report.path.c_str()));
        }
        if (!report.loaded) {
          // Unusable, with the loader's reason: an override naming it, or a rule preferring it,
          // says why it was passed over instead of "not installed".
          selection.probed.push_back({report.name, report.caps, 0, "refused: " + report.reason});
          candidates.push_back({report.name, report.caps, 0, "", report.reason});
          continue;
        }
        ProbeResult p = probe(*report.plugin, info);
        selection.probed.push_back(p);
        loaded.push_back(report.plugin);
        candidates.push_back({p.name, p.caps, p.score, p.reason, ""});
      }
      topology::JobFacts facts;
      facts.size = info.size;
      facts.local_size = info.local_size;
      facts.num_hosts = info.num_hosts;
      facts.launched_by_mpi = info.launched_by_mpi == 1;
      facts.memory = selection.memory;
      const topology::Overrides overrides{in_their_case(settings.backend_host, candidates),
                                          in_their_case(settings.backend_cuda, candidates)};
      const auto decision = topology::decide_backend(machine, facts, candidates, overrides);
      if (!decision.backend.empty()) {
        for (const auto &plugin : loaded) {
          if (plugin->name() == decision.backend) selection.plugin = plugin;
        }
        const bool forced = decision.rule == topology::Rule::kOverride;
        selection.why = "auto: " + decision.reason;
        const bool cuda = selection.memory == topology::MemoryType::kCuda;
        selection.choice = {decision.backend,
                            forced,
                            !forced ? std::string("auto")
                            : cuda  ? "MNCL_BACKEND_CUDA=" + settings.backend_cuda
                                    : "MNCL_BACKEND_HOST=" + settings.backend_host,
                            decision.ranked,
                            {}};
        for (const auto &plugin : loaded) {
          selection.choice.builds[plugin->name()] = build_of(*plugin);
        }
        return selection;
      }
      failures += "\n  auto: " + decision.reason;
      if (loaded.empty()) {
        std::string folders;
        for (const auto &dir : loader::search_path()) folders += (folders.empty() ? "" : ":") + dir;
        failures += "\n  plugin folders searched: " + folders;
      }
      continue;
    }
    try {
      auto plugin = loader::load(candidate, &plugins);
      ProbeResult p = probe(*plugin, info);
      selection.probed.push_back(p);
      if (p.score > 0) {
        selection.plugin = plugin;
        selection.why = format("requested '%s' (probe score %d)", candidate.c_str(), p.score);
        selection.choice = {
            plugin->name(), true, settings.backend_origin + "=" + spec, {plugin->name()}, {}};
        selection.choice.builds[plugin->name()] = build_of(*plugin);
        return selection;
      }
      failures += format("\n  %s: unusable here: %s", candidate.c_str(), p.reason.c_str());
    } catch (const Error &e) {
      if (e.status() == MNCL_ERR_INVALID_ARGUMENT) throw;  // its settings, not a next choice
      failures += format("\n  %s: %s", candidate.c_str(), e.what());
    }
  }
  throw Error(MNCL_ERR_PLUGIN,
              format("no usable backend for %s='%s':%s", settings.backend_origin.c_str(),
                     spec.c_str(), failures.c_str()));
}

}  // namespace mncl::core

// mncl-info: what this installation of MNCL can do here — the plugins it finds (and why any
// is refused), the backend it would choose now and why, the machine's topology and the process
// binding it implies, and every environment variable with its documentation and current value.
#include <mncl/mncl_plugin.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "common/env.h"
#include "common/error.h"
#include "core/launch_env.h"
#include "core/selection.h"
#include "core/validate.h"
#include "loader/plugin_loader.h"
#include "topology/binding.h"
#include "topology/hwloc_topology.h"
#include "topology/report.h"

namespace {

std::string caps_text(uint64_t caps) {
  std::string out;
  auto add = [&](uint64_t bit, const char *name) {
    if (caps & bit) out += (out.empty() ? "" : ",") + std::string(name);
  };
  add(MNCL_CAP_HOST_MEMORY, "host");
  add(MNCL_CAP_CUDA_MEMORY, "cuda");
  add(MNCL_CAP_NATIVE_ASYNC, "async");
  add(MNCL_CAP_STREAM_ORDERED, "stream");
  add(MNCL_CAP_CONCURRENT_P2P, "p2p-lanes");
  return out.empty() ? "-" : out;
}

// The collectives of mncl.h a backend with this coll_mask cannot run, counting the core's own
// forms: a coalesced allreduce as single allreduces, a batch as sends and receives (unless the
// backend runs batches itself), gatherv and scatterv as an alltoallv (unless it runs them).
std::string missing_functions(uint32_t mask) {
  const auto has = [mask](int kind) { return (mask & MNCL_COLL_BIT(kind)) != 0; };
  std::string out;
  const auto add = [&out](const char *fn) { out += (out.empty() ? "" : ", ") + std::string(fn); };
  for (int kind = 0; kind < MNCL_NUM_COLL_KINDS_V5; ++kind) {
    if (kind == MNCL_COLL_GATHERV || kind == MNCL_COLL_SCATTERV) {
      if (!has(kind) && !has(MNCL_COLL_ALLTOALLV)) add(mncl::core::coll_function_name(kind));
    } else if (kind == MNCL_COLL_ALLREDUCE_COALESCED) {
      if (!has(kind) && !has(MNCL_COLL_ALLREDUCE)) add(mncl::core::coll_function_name(kind));
    } else if (kind != MNCL_COLL_SENDRECV_BATCH) {
      if (!has(kind)) add(mncl::core::coll_function_name(kind));
    } else if (!has(kind) && !(has(MNCL_COLL_SEND) && has(MNCL_COLL_RECV))) {
      add("mncl_sendrecv_batch");
      add("mncl_sendrecv");
    }
  }
  return out;
}

void print_usage() {
  std::puts(
      "usage: mncl-info [--plugins] [--topology] [--env] [--help]\n"
      "Lists the backend plugins MNCL finds (path, version, ABI, capabilities, probe score, or\n"
      "why each was refused), the backend it would choose with the current environment, the\n"
      "machine's topology (hwloc; HWLOC_XMLFILE=file.xml shows another machine's) with the\n"
      "choice and process binding it implies, and every MNCL environment variable. With no\n"
      "option, prints everything.\n"
      "Exit status: 0; 1 for a bad MNCL_* setting (a value a parser or a plugin refuses, or an\n"
      "MNCL_* name that is not a variable) or an internal error; 2 for a bad option; 3 when\n"
      "no backend is usable here (--plugins, --topology: the decision is \"none\").");
}

void print_plugins(const mncl_probe_v1_t &info, mncl::loader::Discovery &plugins) {
  std::printf("Plugin search path (first match per name wins):\n");
  for (const auto &dir : mncl::loader::search_path()) std::printf("  %s\n", dir.c_str());
  std::printf("\nPlugins:\n");
  const auto &reports = plugins.reports();
  if (reports.empty()) std::printf("  (none found)\n");
  for (const auto &r : reports) {
    if (!r.loaded) {
      std::printf("  %-10s REFUSED  %s: %s\n", r.name.c_str(), r.path.c_str(), r.reason.c_str());
      continue;
    }
    const auto probe = mncl::core::probe(*r.plugin, info);
    std::printf(
        "  %-10s loaded   %s\n             version %s, plugin ABI v%u, memory %s, "
        "collectives 0x%03x, dtypes 0x%03x, ops 0x%02x\n",
        r.name.c_str(), r.path.c_str(), r.version.c_str(), r.abi_version, caps_text(r.caps).c_str(),
        r.coll_mask, r.dtype_mask, r.op_mask);
    const std::string missing = missing_functions(r.coll_mask);
    if (missing.empty()) {
      std::printf("             runs every collective of mncl.h\n");
    } else {
      std::printf("             cannot run %s (nor their mncl_i* forms)\n", missing.c_str());
    }
    std::printf("             probe score %d%s%s\n", probe.score, probe.reason.empty() ? "" : ": ",
                probe.reason.c_str());
  }
}

// The exit status a failed choice means: 1 for a bad setting (a plugin that refused its own,
// MNCL_SHM_CHUNK=1K), 3 when no backend is usable here.
int status_of(const mncl::Error &e) {
  return e.status() == MNCL_ERR_INVALID_ARGUMENT ? 1 : 3;
}

// 0, or status_of the choice's failure (the decision is "none").
int print_selection(const mncl::core::LaunchSettings &settings, const mncl_probe_v1_t &info,
                    mncl::loader::Discovery &plugins) {
  std::printf("\nBackend selection for this environment (MNCL_BACKEND=%s, %d rank%s):\n",
              settings.backend_spec.c_str(), settings.size, settings.size == 1 ? "" : "s");
  try {
    const auto selection = mncl::core::select_backend(settings, info, &plugins);
    std::printf("  -> %s: %s\n", selection.plugin->name().c_str(), selection.why.c_str());
    return 0;
  } catch (const mncl::Error &e) {
    std::printf("  -> none: %s\n", e.what());
    return status_of(e);
  } catch (const std::exception &e) {  // not the core's: a bug, reported rather than fatal
    std::printf("  -> none: internal error: %s\n", e.what());
  }
  return 3;
}

// The summary, each plugin's probe with this host's facts, the decision and why, and the
// binding this process would get as local rank 0 (or the launcher's local rank). 0, or
// status_of the choice's failure.
int print_topology(const mncl::core::LaunchSettings &settings, const mncl_probe_v1_t &info,
                   mncl::loader::Discovery &plugins) {
  namespace topo = mncl::topology;
  std::printf("\nTopology (hwloc):\n");
  const topo::Topology *machine = topo::this_machine();
  if (machine == nullptr) {
    std::printf("  (hwloc could not read this machine; see the warning above)\n");
  } else {
    std::printf("%s", topo::describe(machine->summary()).c_str());
  }
  const std::string local = info.local_size >= 1 ? std::to_string(info.local_size) : "?";
  const std::string hosts = info.num_hosts == 1  ? "1 host"
                            : info.num_hosts > 1 ? std::to_string(info.num_hosts) + " hosts"
                                                 : "hosts unknown before the rendezvous";
  std::printf("\n  Probes (%d rank%s, %s on this host, %s, %s):\n", info.size,
              info.size == 1 ? "" : "s", local.c_str(), hosts.c_str(),
              info.launched_by_mpi ? "launched by MPI" : "not launched by MPI");
  for (const auto &r : plugins.reports()) {
    if (!r.loaded) continue;
    const auto p = mncl::core::probe(*r.plugin, info);
    std::printf("    %-10s score %3d%s%s\n", p.name.c_str(), p.score, p.reason.empty() ? "" : "  ",
                p.reason.c_str());
  }
  try {
    const auto selection = mncl::core::select_backend(settings, info, &plugins);
    std::printf("\n  Decision (MNCL_BACKEND=%s, %s memory): %s\n    why: %s\n",
                settings.backend_spec.c_str(), topo::memory_name(selection.memory),
                selection.plugin->name().c_str(), selection.why.c_str());
    std::string ranked;
    for (const auto &name : selection.choice.ranked) ranked += (ranked.empty() ? "" : ", ") + name;
    std::printf("    usable, best first: %s\n", ranked.c_str());
    topo::BindRequest request;
    request.mode = topo::parse_bind_mode(settings.bind);
    request.local_rank = settings.local_rank >= 0 ? settings.local_rank : 0;
    request.local_size = info.local_size >= 1 ? info.local_size : 1;
    request.gpu = selection.memory == topo::MemoryType::kCuda
                      ? (settings.device >= 0 ? settings.device : request.local_rank)
                      : -1;
    if (machine != nullptr) {
      request.current = machine->current_binding();
      std::printf("\n  Process binding: %s\n",
                  topo::compute_binding(machine->summary(), request).reason.c_str());
    }
    return 0;
  } catch (const mncl::Error &e) {
    std::printf("\n  Decision (MNCL_BACKEND=%s): none: %s\n", settings.backend_spec.c_str(),
                e.what());
    return status_of(e);
  } catch (const std::exception &e) {
    std::printf("\n  Decision (MNCL_BACKEND=%s): none: internal error: %s\n",
                settings.backend_spec.c_str(), e.what());
  }
  return 3;
}

void print_env() {
  std::printf("\nEnvironment variables:\n");
  for (const auto &v : mncl::env::table()) {
    const char *value = mncl::env::raw(v.name);
    // A secret (MNCL_STORE_TOKEN) is shown as set, never by its value.
    const std::string shown =
        value ? mncl::env::shown_value(v.name, value)
              : std::string("(unset") +
                    (*v.default_value ? std::string(", default ") + v.default_value : "") + ")";
    std::printf("  %-28s = %s\n", v.name, shown.c_str());
    std::printf("      %s\n", v.doc);
  }
  const auto unknown = mncl::env::unknown_variables();
  if (unknown.empty()) return;
  std::printf("\nSet, but not MNCL variables (no effect):\n");
  for (const auto &u : unknown) std::printf("  %s\n", mncl::env::describe_unknown(u).c_str());
}

}  // namespace

int main(int argc, char **argv) {
  bool plugins = false, env = false, topology = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--plugins")) {
      plugins = true;
    } else if (!std::strcmp(argv[i], "--topology")) {
      topology = true;
    } else if (!std::strcmp(argv[i], "--env")) {
      env = true;
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      print_usage();
      return 0;
    } else {
      std::fprintf(stderr, "mncl-info: unknown option '%s'\n", argv[i]);
      print_usage();
      return 2;
    }
  }
  if (!plugins && !env && !topology) plugins = env = topology = true;

  std::printf("MNCL %d.%d.%d (libmncl ABI %d, plugin ABI v%u..v%u)\n\n", MNCL_VERSION_MAJOR,
              MNCL_VERSION_MINOR, MNCL_VERSION_PATCH, MNCL_ABI_MAJOR, MNCL_PLUGIN_ABI_OLDEST,
              MNCL_PLUGIN_ABI_CURRENT);
  int status = 0;
  if (plugins || topology) {
    try {
      const auto config = mncl::core::read_user_config(nullptr);
      const auto settings = mncl::core::resolve_launch_settings(config);
      const auto info = mncl::core::probe_info(settings);
      // One search of the plugin folders for every section (each refusal logged once).
      mncl::loader::Discovery discovery;
      if (plugins) {
        print_plugins(info, discovery);
        status = print_selection(settings, info, discovery);
      }
      if (topology) {
        const int decided = print_topology(settings, info, discovery);
        if (status == 0) status = decided;
      }
    } catch (const mncl::Error &e) {
      // A bad environment (MNCL_TIMEOUT=abc) is reported, and the rest still printed.
      std::printf("\nConfiguration error: %s: %s\n", mncl::status_name(e.status()), e.what());
      status = 1;
    } catch (const std::exception &e) {
      std::printf("\nInternal error: %s\n", e.what());
      status = 1;
    }
  }
  if (env) print_env();
  // A misspelt variable is a bad setting too (it was warned about above, on stderr).
  if (!mncl::env::unknown_variables().empty() && status != 1) status = 1;
  return status;
}

#include "baseline.h"

#include <cctype>

namespace mncl::perf {

std::vector<std::string> available_baselines() {
  std::vector<std::string> names;
#ifdef MNCL_PERF_HAVE_MPI
  names.push_back("mpi");
#endif
#ifdef MNCL_PERF_HAVE_GLOO
  names.push_back("gloo");
#endif
  return names;
}

void baseline_process_init(int *argc, char ***argv, const std::string &backend_spec) {
#ifdef MNCL_PERF_HAVE_MPI
  // flat (MPI itself) may run unless every candidate names another backend ("auto" may pick
  // flat under mpirun; a plugin's path may be flat's).
  bool flat_possible = false;
  size_t start = 0;
  for (;;) {
    const size_t comma = backend_spec.find(',', start);
    std::string name =
        backend_spec.substr(start, comma == std::string::npos ? comma : comma - start);
    for (char &c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    // A path (the loader takes any name with a '/') may be flat's plugin.
    if (name.empty() || name == "auto" || name == "flat" || name.find('/') != std::string::npos) {
      flat_possible = true;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  mpi_process_init(argc, argv, flat_possible);
#else
  (void)argc;
  (void)argv;
  (void)backend_spec;
#endif
}

void baseline_process_finalize() {
#ifdef MNCL_PERF_HAVE_MPI
  mpi_process_finalize();
#endif
}

std::unique_ptr<Baseline> make_baseline(const std::string &which, const std::string &backend,
                                        mncl_comm_t comm, std::string *why) {
  std::string lib = which;
  if (which == "auto") {
    // shm competes with Open MPI's own shared-memory path on one host, so MPI is its yardstick
    // too (available when the run was launched by mpirun, as the sweep does when it can).
    if (backend == "flat" || backend == "shm") {
      lib = "mpi";
    } else if (backend == "gloo") {
      lib = "gloo";
    } else {
      *why = "no raw library under the " + backend + " backend";
      return nullptr;
    }
  }
  if (lib == "none") {
    *why = "--baseline none";
    return nullptr;
  }
#ifdef MNCL_PERF_HAVE_MPI
  if (lib == "mpi") return make_mpi_baseline(comm, why);
#endif
#ifdef MNCL_PERF_HAVE_GLOO
  if (lib == "gloo") return make_gloo_baseline(comm, why);
#endif
  (void)comm;
  *why = "this mncl-perf was built without " + lib +
         " (install its development package and "
         "reconfigure)";
  return nullptr;
}

}  // namespace mncl::perf

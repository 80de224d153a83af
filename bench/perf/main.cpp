// mncl-perf: nccl-tests-style benchmark of MNCL collectives, with raw-library baselines and the
// memory-bandwidth limit measured in the same run; or, with --backends, a sweep over backends.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "baseline.h"
#include "driver.h"
#include "options.h"
#include "runner.h"

int main(int argc, char **argv) {
  using namespace mncl::perf;
  const Options o = parse_options(argc, argv);
  if (!o.backends.empty()) return run_sweep(o, argc, argv);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  try {
    // Before libmncl: under mpirun, MPI belongs to the application (the raw baseline), and
    // the flat plugin then finds it initialized.
    const char *env_backend = std::getenv("MNCL_BACKEND");
    baseline_process_init(&argc, &argv,
                          !o.backend.empty() ? o.backend
                          : env_backend      ? std::string(env_backend)
                                             : std::string("auto"));
    const int rc = run_rank(o, command);
    baseline_process_finalize();
    return rc;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "mncl-perf: %s\n", e.what());
    return 1;
  }
}

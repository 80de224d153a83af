// The sweep driver: `mncl-perf --backends naive,flat,gloo` runs one mncl-perf job per backend
// on local ranks (mncl-run, or mpirun where the backend needs MPI), shows a progress line, and
// combines the per-backend results into one JSON, one CSV and a PNG plot.
#pragma once

#include "options.h"

namespace mncl::perf {

// Returns 0 if every available backend ran cleanly (0 wrong values), 1 otherwise.
int run_sweep(const Options &o, int argc, char **argv);

}  // namespace mncl::perf

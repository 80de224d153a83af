// One mncl-perf run: this process is one rank of a job on one backend (launched by mncl-run,
// mpirun or any launcher MNCL understands).
#pragma once

#include <string>

#include "options.h"

namespace mncl::perf {

// Returns the process exit status: 0, 1 on wrong values or an MNCL error.
int run_rank(const Options &o, const std::string &command_line);

}  // namespace mncl::perf

// Human-readable text of a topology summary: what `mncl-info --topology` prints and what the
// log shows at info level.
#pragma once

#include <string>

#include "topology/summary.h"

namespace mncl::topology {

// Several lines, each indented by two spaces and ending in '\n'.
std::string describe(const Summary &summary);
// One line: "vm: 1 package, 1 NUMA node, 2 cores, 2 PUs, no NVIDIA GPU, no InfiniBand".
std::string one_line(const Summary &summary);

}  // namespace mncl::topology

// The memory-bandwidth ceiling, measured in the same run as the collectives: every rank copies a
// buffer far larger than the caches at the same time, and the machine's copy bandwidth B_mem is
// the bytes read + written by all ranks together over the wall-clock span from the first rank's
// start to the last rank's end (the STREAM "Copy" convention, which counts both the read and the
// write).
//
// A collective's algbw can then be at most B_mem / traffic_factor (collectives.h): for an
// allreduce every rank must at least read its input and write its output, 2 * ranks * size
// bytes in all, so algbw <= B_mem / (2 * ranks). This holds for ranks on one host.
#pragma once

#include <mncl/mncl.h>

#include <cstddef>

namespace mncl::perf {

struct MemBandwidth {
  double bytes_per_s = 0;  // all ranks together (read + write)
  double per_rank_bytes_per_s = 0;
  size_t buffer_bytes = 0;  // copied per rank per pass
  // The ranks run on more than one host (MNCL_HOSTID, else the host name, differs): one host's
  // steady_clock says nothing about another's, and the limit is a one-host bound anyway, so
  // nothing is measured (bytes_per_s stays 0) and the outputs say N/A.
  bool multi_host = false;
};

// Collective over `comm`: returns multi_host (and nothing measured) when the ranks span hosts,
// else the best of a few synchronized trials. Throws on an MNCL error.
MemBandwidth measure_membw(mncl_comm_t comm, int nranks, size_t bytes);

}  // namespace mncl::perf

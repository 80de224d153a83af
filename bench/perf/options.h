// mncl-perf command-line options: nccl-tests-compatible flags for one run on one backend, plus
// the sweep driver's flags (--backends ...), which spawn one such run per backend.
#pragma once

#include <mncl/mncl.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "collectives.h"

namespace mncl::perf {

struct Options {
  // nccl-tests flags.
  size_t min_bytes = 8;                 // -b
  size_t max_bytes = size_t(64) << 20;  // -e
  double step_factor = 2;               // -f (0 when -i is used)
  size_t step_bytes = 0;                // -i
  int iters = 20;                       // -n
  int warmup = 5;                       // -w
  int warmup_calls = 32;                // --warmup-calls: before each collective's first size
  int check = 1;                        // -c: checked iterations per size (0: none)
  mncl_dtype_t dtype = MNCL_FLOAT32;    // -d
  mncl_op_t op = MNCL_SUM;              // -o
  int root = 0;                         // -r
  int average = 1;                      // -a: time reported: 0 rank 0, 1 avg, 2 min, 3 max
  double timeout_s = 0;                 // -T: the communicator's timeout (0: MNCL_TIMEOUT)
  std::vector<CollKind> colls = {CollKind::kAllreduce};  // -C
  // MNCL-specific flags for one run.
  std::string backend;                    // --backend (empty: MNCL_BACKEND / auto)
  std::string baseline = "auto";          // --baseline auto|none|mpi|gloo
  std::string json_path;                  // -J / --json
  std::string csv_path;                   // --csv
  double size_budget_ms = 0;              // --size-budget-ms: fewer iterations for slow sizes
  bool membw = true;                      // --no-membw skips the memory-bandwidth ceiling
  size_t membw_bytes = size_t(64) << 20;  // --membw-bytes (per rank, split in two halves)
  bool progress = false;                  // --progress: a line per finished size on stderr (rank 0)
  std::string note;                       // --note TEXT printed in the header and JSON
  int debug_hang_rank = -1;               // --debug-hang-rank (hidden): that rank sleeps, for tests
  // Sweep-driver flags.
  std::vector<std::string> backends;          // --backends naive,flat,gloo
  int nranks = 4;                             // --np
  std::map<std::string, size_t> caps;         // --cap naive=1M (largest size per backend)
  std::string out_dir = "mncl-perf-results";  // --out-dir
  double backend_timeout_s = 0;               // --backend-timeout: kill a backend's run after
  std::string plot_script;                    // --plot-script (empty: the built-in path)
};

// Parses argv; prints usage and exits on -h or on a bad flag (exit status 2).
Options parse_options(int argc, char **argv);

// "8", "1K", "64M", "2G" (binary multiples, as in nccl-tests). Throws on garbage.
size_t parse_size(const std::string &text);
// 1536 -> "1.5 KiB"-style short form for messages.
std::string format_size(size_t bytes);

// The sizes of the sweep, as nccl-tests computes them.
std::vector<size_t> sweep_sizes(const Options &o);

// The flags of one run that reproduce `o` (sizes, iterations, dtype, ...), without the
// output files and the driver's own flags: what the sweep driver passes to every run.
std::vector<std::string> run_flags(const Options &o);

}  // namespace mncl::perf

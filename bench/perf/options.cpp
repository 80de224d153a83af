#include "options.h"

#include <getopt.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "common/parse_size.h"

namespace mncl::perf {

namespace {

constexpr const char *kUsage =
    R"(Usage: mncl-perf [options]                      (one run: every process is one rank)
       mncl-perf --backends naive,flat,gloo [options]  (sweep: spawns one run per backend)

Measures MNCL collectives like nccl-tests, with a raw-library baseline and the machine's
memory-bandwidth limit measured in the same run.

Sizes and iterations (nccl-tests flags):
  -b, --minbytes SIZE       smallest size (default 8); K, M, G suffixes are powers of 1024
  -e, --maxbytes SIZE       largest size (default 64M)
  -f, --stepfactor F        multiply the size by F each step (default 2)
  -i, --stepbytes SIZE      or add SIZE each step
  -n, --iters N             timed iterations per size (default 20)
  -w, --warmup_iters N      warm-up iterations per size (default 5)
      --warmup-calls N      untimed calls of each collective before its first size, MNCL's
                            then the raw library's (default 32; 0: none), so that neither
                            side's first size carries a cold start (e.g. Open MPI's shared
                            memory switches a peer to its fast path after 16 messages); out of
                            place, at the smallest size with 2 elements per block, <= 64K
  -c, --check N             checked iterations per size, each on fresh data (default 1; 0: off)
  -d, --datatype TYPE       int8 uint8 int32 uint32 int64 uint64 float16 (half) bfloat16
                            float32 (float) float64 (double); default float32
  -o, --op OP               sum prod min max avg (default sum)
  -r, --root R              root of bcast/reduce/scatter/gather/scatterv/gatherv (default 0)
  -a, --average 0|1|2|3     time reported: rank 0's, the average (default), min or max over ranks
  -T, --timeout SECONDS     the communicator's timeout: a hung peer fails the run after it
  -C, --colls LIST          comma list of allreduce bcast reduce scatter gather allgather
                            reduce_scatter alltoall sendrecv allgatherv alltoallv gatherv
                            scatterv, or "all" (default allreduce)
MNCL options:
  --backend NAME            backend of this run (default: MNCL_BACKEND, else auto)
  --baseline auto|none|mpi|gloo
                            raw library timed on the same buffers right after MNCL, at every
                            size (auto: mpi under flat and shm, gloo under gloo; mpi needs
                            mpirun)
  -J, --json FILE           write the results as JSON
  --csv FILE                write the results as CSV
  --size-budget-ms MS       cap warm-up + timed iterations of a size at about MS milliseconds
                            (at least one of each); each row's iters column gives the
                            timed iterations it got
  --no-membw                skip the memory-bandwidth measurement (no "% of limit" column)
  --membw-bytes SIZE        per-rank working set of the copy test (default 64M)
  --progress                rank 0 prints a line per finished size on stderr
  --note TEXT               a note printed in the header and the JSON
Sweep driver:
  --backends LIST           run each backend in turn on --np local ranks (mncl-run, or mpirun
                            for flat) and combine the results (JSON, CSV, PNG) in --out-dir
  --np N                    ranks per backend (default 4)
  --cap BACKEND=SIZE        largest size for one backend (repeatable), e.g. --cap naive=1M
  --out-dir DIR             where the results go (default ./mncl-perf-results)
  --backend-timeout SECONDS kill a backend's run after this long (default: none)
  --plot-script PATH        the plotting script (default: the one from the source tree)
  -h, --help                this text

Buffers: mncl-perf benchmarks host memory only. Under a device backend (nccl) its figures
include the host<->device copies the backend makes for host buffers; mncl-bench-nccl measures
nccl on device buffers, the fair comparison.

Columns: iters = timed iterations of the row (fewer than -n where --size-budget-ms cut them);
time in microseconds per call; algbw = size / time; busbw = algbw times the
nccl-tests factor (allreduce 2(n-1)/n; reduce_scatter, allgather, alltoall, scatter, gather
and their v forms (n-1)/n; bcast, reduce, sendrecv 1); MNCL/raw = MNCL time / raw time; %lim = algbw as a share
of the memory-bandwidth limit for the collective (see bench/perf/README.md).

allgatherv, alltoallv: size is the per-rank total, as for allgather / alltoall; count is the
mean block, per = size / (n * element size). The blocks are unequal but deterministic: they
alternate per/2 (rounded down) and 2*per - per/2, the last of an odd number of ranks gets per,
so they add up to n*per (per = 1 gives empty blocks). allgatherv: rank q's block is block q;
alltoallv: rank i sends block (i+j) mod n to rank j. Displacements are packed; busbw factor
(n-1)/n; alltoallv has no in-place form. The raw MPI column needs all n*per elements to fit
MPI's int counts and displacements (N/A beyond INT_MAX, with a note on stderr).

gatherv, scatterv (-r root): size is the root's total, as for gather / scatter; count is the
mean block per = size / (n * element size), and rank q's block is block q above (gatherv:
rank q sends it, scatterv: receives it), packed on the root. In place at the root only; busbw
factor (n-1)/n. Raw MPI: MPI_Gatherv / MPI_Scatterv with the same counts; raw Gloo: N/A (Gloo
has none). Every bundled backend runs both natively; a plugin without them (ABI v3/v4, or
MNCL_PLUGIN_ABI_MAX=4) runs them as an alltoallv, whose cost MNCL/raw then shows.
)";

[[noreturn]] void usage_error(const std::string &msg) {
  std::fprintf(stderr, "mncl-perf: %s\n(see mncl-perf --help)\n", msg.c_str());
  std::exit(2);
}

long parse_int(const char *flag, const char *text, long lo, long hi) {
  char *end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi)
    usage_error(std::string(flag) + ": '" + text + "' is not an integer in [" + std::to_string(lo) +
                ", " + std::to_string(hi) + "]");
  return v;
}

double parse_double(const char *flag, const char *text, double lo, double hi) {
  char *end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (*text == '\0' || *end != '\0' || errno != 0 || !(v >= lo && v <= hi))
    usage_error(std::string(flag) + ": '" + text + "' is not a number in [" + std::to_string(lo) +
                ", " + std::to_string(hi) + "]");
  return v;
}

size_t size_flag(const char *flag, const char *text) {
  try {
    return parse_size(text);
  } catch (const std::exception &e) {
    usage_error(std::string(flag) + ": " + e.what());
  }
}

mncl_dtype_t parse_dtype(const std::string &s) {
  static const struct {
    const char *name;
    mncl_dtype_t d;
  } names[] = {{"int8", MNCL_INT8},         {"uint8", MNCL_UINT8},     {"int32", MNCL_INT32},
               {"int", MNCL_INT32},         {"uint32", MNCL_UINT32},   {"int64", MNCL_INT64},
               {"uint64", MNCL_UINT64},     {"float16", MNCL_FLOAT16}, {"half", MNCL_FLOAT16},
               {"bfloat16", MNCL_BFLOAT16}, {"float32", MNCL_FLOAT32}, {"float", MNCL_FLOAT32},
               {"float64", MNCL_FLOAT64},   {"double", MNCL_FLOAT64}};
  for (const auto &n : names)
    if (s == n.name) return n.d;
  usage_error("-d: unknown datatype '" + s + "'");
}

mncl_op_t parse_op(const std::string &s) {
  static const struct {
    const char *name;
    mncl_op_t op;
  } names[] = {{"sum", MNCL_SUM},
               {"prod", MNCL_PROD},
               {"min", MNCL_MIN},
               {"max", MNCL_MAX},
               {"avg", MNCL_AVG}};
  for (const auto &n : names)
    if (s == n.name) return n.op;
  usage_error("-o: unknown op '" + s + "'");
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

enum LongOnly {
  kBackend = 1000,
  kBaseline,
  kCsv,
  kSizeBudget,
  kNoMembw,
  kMembwBytes,
  kProgress,
  kNote,
  kHang,
  kBackends,
  kNp,
  kCap,
  kOutDir,
  kBackendTimeout,
  kPlotScript,
  kWarmupCalls,
};

}  // namespace

size_t parse_size(const std::string &text) {
  return bench::parse_size(text);
}

std::string format_size(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t(1) << 30) && bytes % (size_t(1) << 30) == 0)
    std::snprintf(buf, sizeof buf, "%zu GiB", bytes >> 30);
  else if (bytes >= (size_t(1) << 20) && bytes % (size_t(1) << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

std::vector<size_t> sweep_sizes(const Options &o) {
  std::vector<size_t> sizes;
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    size_t next =
        o.step_bytes > 0 ? s + o.step_bytes : static_cast<size_t>(std::llround(s * o.step_factor));
    if (next <= s) break;  // -f 1, or a step of 0: one size, as in nccl-tests
    s = next;
  }
  return sizes;
}

std::vector<std::string> run_flags(const Options &o) {
  auto num = [](double v) {
    std::ostringstream ss;
    ss << v;
    return ss.str();
  };
  std::vector<std::string> f = {"-b", std::to_string(o.min_bytes), "-e",
                                std::to_string(o.max_bytes)};
  if (o.step_bytes > 0) {
    f.insert(f.end(), {"-i", std::to_string(o.step_bytes)});
  } else {
    f.insert(f.end(), {"-f", num(o.step_factor)});
  }
  f.insert(f.end(), {"-n", std::to_string(o.iters), "-w", std::to_string(o.warmup), "-c",
                     std::to_string(o.check), "-d", mncl_dtype_name(o.dtype), "-o",
                     mncl_op_name(o.op), "-r", std::to_string(o.root), "-a",
                     std::to_string(o.average), "--warmup-calls", std::to_string(o.warmup_calls)});
  if (o.timeout_s > 0) f.insert(f.end(), {"-T", num(o.timeout_s)});
  std::string colls;
  for (CollKind k : o.colls) colls += (colls.empty() ? "" : ",") + std::string(spec_of(k).name);
  f.insert(f.end(), {"-C", colls, "--baseline", o.baseline});
  if (o.size_budget_ms > 0) f.insert(f.end(), {"--size-budget-ms", num(o.size_budget_ms)});
  if (!o.membw) f.push_back("--no-membw");
  f.insert(f.end(), {"--membw-bytes", std::to_string(o.membw_bytes)});
  if (!o.note.empty()) f.insert(f.end(), {"--note", o.note});
  return f;
}

Options parse_options(int argc, char **argv) {
  Options o;
  static const option longs[] = {{"minbytes", required_argument, nullptr, 'b'},
                                 {"maxbytes", required_argument, nullptr, 'e'},
                                 {"stepbytes", required_argument, nullptr, 'i'},
                                 {"stepfactor", required_argument, nullptr, 'f'},
                                 {"iters", required_argument, nullptr, 'n'},
                                 {"warmup_iters", required_argument, nullptr, 'w'},
                                 {"check", required_argument, nullptr, 'c'},
                                 {"datatype", required_argument, nullptr, 'd'},
                                 {"op", required_argument, nullptr, 'o'},
                                 {"root", required_argument, nullptr, 'r'},
                                 {"average", required_argument, nullptr, 'a'},
                                 {"timeout", required_argument, nullptr, 'T'},
                                 {"colls", required_argument, nullptr, 'C'},
                                 {"json", required_argument, nullptr, 'J'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {"backend", required_argument, nullptr, kBackend},
                                 {"baseline", required_argument, nullptr, kBaseline},
                                 {"csv", required_argument, nullptr, kCsv},
                                 {"size-budget-ms", required_argument, nullptr, kSizeBudget},
                                 {"no-membw", no_argument, nullptr, kNoMembw},
                                 {"membw-bytes", required_argument, nullptr, kMembwBytes},
                                 {"progress", no_argument, nullptr, kProgress},
                                 {"note", required_argument, nullptr, kNote},
                                 {"debug-hang-rank", required_argument, nullptr, kHang},
                                 {"backends", required_argument, nullptr, kBackends},
                                 {"np", required_argument, nullptr, kNp},
                                 {"cap", required_argument, nullptr, kCap},
                                 {"out-dir", required_argument, nullptr, kOutDir},
                                 {"backend-timeout", required_argument, nullptr, kBackendTimeout},
                                 {"plot-script", required_argument, nullptr, kPlotScript},
                                 {"warmup-calls", required_argument, nullptr, kWarmupCalls},
                                 {nullptr, 0, nullptr, 0}};
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":b:e:i:f:n:w:c:d:o:r:a:T:C:J:h", longs, nullptr)) != -1) {
    switch (ch) {
      case 'b':
        o.min_bytes = size_flag("-b", optarg);
        break;
      case 'e':
        o.max_bytes = size_flag("-e", optarg);
        break;
      case 'i':
        o.step_bytes = size_flag("-i", optarg);
        o.step_factor = 0;
        break;
      case 'f':
        o.step_factor = parse_double("-f", optarg, 1, 1024);
        o.step_bytes = 0;
        break;
      case 'n':
        o.iters = static_cast<int>(parse_int("-n", optarg, 1, 1 << 24));
        break;
      case 'w':
        o.warmup = static_cast<int>(parse_int("-w", optarg, 0, 1 << 24));
        break;
      case 'c':
        o.check = static_cast<int>(parse_int("-c", optarg, 0, 1 << 20));
        break;
      case 'd':
        o.dtype = parse_dtype(optarg);
        break;
      case 'o':
        o.op = parse_op(optarg);
        break;
      case 'r':
        o.root = static_cast<int>(parse_int("-r", optarg, 0, 1 << 24));
        break;
      case 'a':
        o.average = static_cast<int>(parse_int("-a", optarg, 0, 3));
        break;
      case 'T':
        o.timeout_s = parse_double("-T", optarg, 0, 7 * 24 * 3600.0);
        break;
      case 'C': {
        o.colls.clear();
        for (const std::string &name : split(optarg, ',')) {
          if (name == "all") {
            for (const auto &s : all_collectives()) o.colls.push_back(s.kind);
            continue;
          }
          CollKind k;
          if (!coll_from_name(name, &k)) usage_error("-C: unknown collective '" + name + "'");
          o.colls.push_back(k);
        }
        if (o.colls.empty()) usage_error("-C: no collective named");
        break;
      }
      case 'J':
        o.json_path = optarg;
        break;
      case 'h':
        std::fputs(kUsage, stdout);
        std::exit(0);
      case kBackend:
        o.backend = optarg;
        break;
      case kBaseline:
        o.baseline = optarg;
        if (o.baseline != "auto" && o.baseline != "none" && o.baseline != "mpi" &&
            o.baseline != "gloo")
          usage_error("--baseline: '" + o.baseline + "' is not auto, none, mpi or gloo");
        break;
      case kCsv:
        o.csv_path = optarg;
        break;
      case kSizeBudget:
        o.size_budget_ms = parse_double("--size-budget-ms", optarg, 0, 1e9);
        break;
      case kNoMembw:
        o.membw = false;
        break;
      case kMembwBytes:
        o.membw_bytes = size_flag("--membw-bytes", optarg);
        break;
      case kProgress:
        o.progress = true;
        break;
      case kNote:
        o.note = optarg;
        break;
      case kHang:
        o.debug_hang_rank = static_cast<int>(parse_int("--debug-hang-rank", optarg, 0, 1 << 24));
        break;
      case kBackends:
        o.backends = split(optarg, ',');
        break;
      case kNp:
        o.nranks = static_cast<int>(parse_int("--np", optarg, 1, 4096));
        break;
      case kCap: {
        const std::string v = optarg;
        const size_t eq = v.find('=');
        if (eq == std::string::npos || eq == 0)
          usage_error("--cap: '" + v + "' is not BACKEND=SIZE");
        o.caps[v.substr(0, eq)] = size_flag("--cap", v.c_str() + eq + 1);
        break;
      }
      case kOutDir:
        o.out_dir = optarg;
        break;
      case kBackendTimeout:
        o.backend_timeout_s = parse_double("--backend-timeout", optarg, 0, 1e6);
        break;
      case kPlotScript:
        o.plot_script = optarg;
        break;
      case kWarmupCalls:
        o.warmup_calls = static_cast<int>(parse_int("--warmup-calls", optarg, 0, 1 << 20));
        break;
      case ':':
        usage_error(std::string("option ") + argv[optind - 1] + " needs a value");
      default:
        usage_error(std::string("unknown option ") + argv[optind - 1]);
    }
  }
  if (optind < argc) usage_error(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.min_bytes > o.max_bytes) usage_error("-b is larger than -e");
  return o;
}

}  // namespace mncl::perf

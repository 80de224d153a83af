#include "common/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

extern char **environ;  // POSIX: the process's environment

#include "common/error.h"
#include "common/log.h"

namespace mncl::env {

const std::vector<Variable> &table() {
  static const std::vector<Variable> variables = {
      {"MNCL_BACKEND", "auto",
       "Backend: a plugin name (naive, gloo, flat, nccl, shm), a path to a plugin .so, a comma "
       "list tried in order, or auto (the topology rules: mncl-info --topology shows them)."},
      {"MNCL_BACKEND_HOST", "",
       "With MNCL_BACKEND=auto: the backend (or comma list, tried in order) for communicators "
       "whose buffers are in host memory, replacing the topology rules; nothing usable in it "
       "is an error."},
      {"MNCL_BACKEND_CUDA", "",
       "With MNCL_BACKEND=auto: the backend (or comma list) for communicators whose buffers are "
       "CUDA device memory, replacing the topology rules."},
      {"MNCL_MEMORY", "auto",
       "Where the communicator's buffers live, for the backend rules: host, cuda, or auto "
       "(cuda when this host has an NVIDIA GPU)."},
      {"MNCL_BIND", "auto",
       "Process binding: none, numa (spread the host's ranks over NUMA nodes), core (over "
       "cores), or auto (near the rank's GPU, else spread over NUMA nodes; a binding set by "
       "the launcher is kept)."},
      {"HWLOC_XMLFILE", "",
       "Read by hwloc: take the machine's topology from this XML file (lstopo file.xml) "
       "instead of the live machine; MNCL then chooses as on that machine but never binds."},
      {"MNCL_PLUGIN_PATH", "",
       "Colon-separated folders searched for libmncl-<name>.so before <libdir>/mncl/plugins."},
      {"MNCL_PLUGIN_ABI_MAX", "",
       "Use no plugin table newer than this ABI version (1..newest): runs a plugin as a core of "
       "that version would, with the core's fallbacks for newer kinds (tests, compatibility)."},
      {"MNCL_STORE", "",
       "Bootstrap store: tcp://host:port (rank 0 listens there) or file:///shared/dir. Default: "
       "tcp://MASTER_ADDR:MASTER_PORT when those are set."},
      {"MNCL_STORE_TOKEN", "",
       "Shared secret every rank presents to the TCP store; connections without it are refused. "
       "Default: the launcher's id of the job (Slurm's job and step, Open MPI's job, PMIx's "
       "namespace, TORCHELASTIC_RUN_ID), which keeps other jobs out but is no secret."},
      {"MNCL_RANK", "",
       "This process's rank; else that of the first launcher, in the order RANK/WORLD_SIZE, "
       "OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID/SLURM_NTASKS, that sets both rank and size "
       "(another launcher that sets both and differs is an error, unless it started that one: "
       "Slurm around mpirun or a launcher of more ranks than its tasks, any around torchrun's "
       "agent); "
       "else the first of those rank variables set; else 0. MNCL_RANK and MNCL_SIZE settle a "
       "disagreement. Slurm's count in an srun step only (SLURM_STEP_ID set), not in an sbatch "
       "script."},
      {"MNCL_SIZE", "",
       "Number of ranks; else that of the launcher MNCL_RANK's lookup takes; else the first "
       "of WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS set; else 1."},
      {"MNCL_LOCAL_RANK", "",
       "Rank among the ranks on this host; else that of the launcher that gave the rank "
       "(LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID); else from the host names."},
      {"MNCL_LOCAL_SIZE", "",
       "Ranks on this host; else that of the launcher that gave the rank (LOCAL_WORLD_SIZE or "
       "OMPI_COMM_WORLD_LOCAL_SIZE); else from the host names (under srun and PMI launchers)."},
      {"MNCL_HOSTID", "",
       "What this rank counts as its host when ranks are grouped by host (local rank and size, "
       "mncl_comm_split_type, the backend rules); default: the host name. Ranks with the same "
       "value share a host (NCCL_HOSTID's role: containers with one host name, or one machine "
       "standing in for several: mncl-run --ranks-per-host)."},
      {"MNCL_TIMEOUT", "300",
       "Seconds any blocking step may take (rendezvous, each collective) before it fails."},
      {"MNCL_DEVICE", "", "Accelerator ordinal for this rank (default: the local rank)."},
      {"MNCL_DEBUG", "warn", "Log level: none, error, warn, info or trace (any case), or 0..4."},
      {"MNCL_DEBUG_FILE", "",
       "Write the log to this file (appended) instead of stderr; %h becomes the host name, %p "
       "the process id (one file per rank: /tmp/mncl.%h.%p.log)."},
      {"MNCL_LANE_LINGER_US", "50",
       "Microseconds a worker thread that runs non-blocking operations stays awake (yielding) "
       "after one of at most 64 KiB, for the next: small back-to-back isend/irecv/iallreduce "
       "skip a sleep and a wake-up. 0 sleeps at once (no CPU spent waiting)."},
      {"MNCL_CUDA_LIBRARY", "libcuda.so.1",
       "CUDA driver library whose presence in the process tells that buffers may be CUDA memory "
       "(staged through pinned host memory for host-only backends); never loaded by MNCL "
       "itself. 'none' turns the CUDA memory path off."},
      // Backend-specific settings (read by the plugins through the host's get_env).
      {"MNCL_GLOO_TRANSPORT", "tcp",
       "gloo: transport, tcp (the only one: this Gloo's ibverbs transport has no unbound "
       "buffers, which every gloo operation uses, so ibverbs is refused)."},
      {"MNCL_GLOO_IFACE", "",
       "gloo: network interface to bind, on one host too (default: GLOO_SOCKET_IFNAME's first; "
       "else loopback on one host, the host name's address across hosts)."},
      {"GLOO_SOCKET_IFNAME", "",
       "gloo (torch.distributed's variable): a comma list of interfaces; MNCL's gloo binds the "
       "first, unless MNCL_GLOO_IFACE is set."},
      {"MNCL_GLOO_ALGO", "auto",
       "gloo: allreduce algorithm, auto, ring, ring_chunked, halving_doubling or bcube. "
       "After a large ring_chunked allreduce, large transfers against the ring's direction "
       "on the same communicator (alltoall, gather, scatter) can take 100x longer over "
       "loopback: those sockets' send buffers stay at the kernel's minimum (raw Gloo too)."},
      {"MNCL_FLAT_BOUNDED", "1",
       "flat: 1 runs blocking calls on MPI's non-blocking collectives, polled, so MNCL_TIMEOUT "
       "and mncl_comm_abort apply, and checks a fingerprint of every collective across the "
       "ranks, so mismatched calls fail; 0 uses MPI's blocking collectives, 1-3 us faster per "
       "small call at 2 ranks, which cannot time out and give wrong values for mismatched calls."},
      {"MNCL_FLAT_RING_MIN_BYTES", "auto",
       "flat, bounded mode: a blocking allreduce, reduce or allgather of at least this many bytes "
       "per rank (its bytes / the ranks; an allgather's block; K/M/G accepted), or a "
       "reduce-scatter of a quarter of that per block, runs on flat's own ring (reduce-scatter "
       "and/or allgather, or a gather to the root, over point-to-point messages) when every "
       "rank's call would: MPI's non-blocking ones are slower than its blocking ones for large "
       "messages, and its reduce-scatter reduces everything at one rank. 0: never. auto (or "
       "unset): 2K on 2 ranks (a reduce 32K, an allgather 4K, a reduce-scatter 8K), 128K on "
       "more."},
      {"MNCL_FLAT_PROGRESS_THREAD", "1",
       "flat: 1 (under MPI_THREAD_MULTIPLE) runs a thread that moves posted operations on while "
       "the application is outside flat; 0: none, and a bounded collective's data are issued by "
       "flat calls only."},
      {"MNCL_FLAT_CHECK_EXCHANGE", "auto",
       "flat, bounded mode: how each collective's check goes round the ranks. auto: direct up to "
       "8 ranks (64 where a rank has no progress thread), else doubling; direct: every rank's "
       "element to every other at once (MPI completes it unaided; used if any rank asks); "
       "doubling: recursive doubling, log2 rounds stepped by flat's calls and progress thread "
       "(used if every rank asks and has that thread)."},
      {"MNCL_SHM_CHUNK", "1M",
       "shm: bytes per rank per pipeline round (64K..1G; K/M/G accepted); rank 0's value holds "
       "for the communicator."},
      {"MNCL_SHM_SMALL", "64K",
       "shm: allreduce/reduce up to this many bytes take the single-phase exchange (at most "
       "MNCL_SHM_CHUNK); rank 0's value holds."},
      {"MNCL_SHM_NT_BYTES", "4M",
       "shm: copies out of the segment of at least this many bytes bypass the caches "
       "(non-temporal stores); rank 0's value holds."},
      {"MNCL_SHM_SPIN", "",
       "shm: pause-loop iterations before a waiting rank yields (default: by load, fewer when "
       "ranks outnumber cores; at most 10000000)."},
      {"MNCL_SHM_YIELD_US", "",
       "shm: microseconds a waiting rank yields before it sleeps on a futex (default: by load; "
       "at most 1000000, and never past the operation's deadline or an abort)."},
      {"MNCL_SHM_SINGLE_COPY", "1",
       "shm: 1 reads point-to-point messages above two slots straight from the sender's memory "
       "(process_vm_readv) where allowed; 0 streams them through the segment; decline (tests) "
       "offers but never accepts. Each rank's own."},
      {"MNCL_NAIVE_PART_BYTES", "268435456",
       "naive: the largest store value; a longer message travels in parts of this size (the "
       "TCP store takes at most 1 GiB per value). Small values exercise that path in tests."},
      {"MASTER_ADDR", "", "torchrun-style store host, used when MNCL_STORE is unset."},
      {"MASTER_PORT", "",
       "torchrun-style store port, used when MNCL_STORE is unset (and the job has more than one "
       "rank: a job of one uses no store)."},
      // Launchers' own variables, read when the MNCL_* ones are unset.
      {"RANK", "", "torchrun: this process's rank."},
      {"WORLD_SIZE", "", "torchrun: number of ranks."},
      {"LOCAL_RANK", "", "torchrun: rank on this host."},
      {"LOCAL_WORLD_SIZE", "", "torchrun: ranks on this host."},
      {"TORCHELASTIC_RUN_ID", "",
       "torchrun: set by its agent; tells its RANK/WORLD_SIZE from a pair left in the shell, so "
       "that srun's or mpirun's own variables around torchrun are not a disagreement."},
      {"TORCHELASTIC_USE_AGENT_STORE", "",
       "torchrun: True when its agent serves its own store on MASTER_PORT; MNCL then refuses "
       "that port for its store (set MNCL_STORE=tcp://MASTER_ADDR:<another port>)."},
      {"OMPI_COMM_WORLD_RANK", "", "Open MPI (mpirun): this process's rank."},
      {"OMPI_COMM_WORLD_SIZE", "", "Open MPI (mpirun): number of ranks."},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "", "Open MPI (mpirun): rank on this host."},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "", "Open MPI (mpirun): ranks on this host."},
      {"PMI_RANK", "", "PMI launchers (MPICH, srun --mpi=pmi2): this process's rank."},
      {"PMI_SIZE", "", "PMI launchers: number of ranks."},
      {"SLURM_PROCID", "", "Slurm (srun): this process's rank."},
      {"SLURM_NTASKS", "", "Slurm (srun): number of ranks."},
      {"SLURM_LOCALID", "", "Slurm (srun): rank on this host."},
      {"SLURM_STEP_ID", "",
       "Slurm: the srun step's id (or SLURM_STEPID); without it (an sbatch script, salloc's "
       "shell) the SLURM_* rank variables are not used."},
      {"MNCL_LIBRARY", "",
       "Python package (import mncl): libmncl.so to load, a file or a folder (default: next to "
       "the package, the install prefix's lib/, a checkout's build/lib, then the system's "
       "search path)."},
      {"MNCL_RUN_GRACE", "5",
       "mncl-run: seconds the other ranks get to end after one failed before they are killed."},
      // The repository's scripts (read by them, never by the library: listed so that a set one
      // draws no warning in the processes they start).
      {"MNCL_BUILD_DIR", "build",
       "scripts/*.sh: the build folder (setup.sh configures and builds it; sweep.sh and test.sh "
       "run from it)."},
      {"MNCL_BUILD_TYPE", "RelWithDebInfo", "scripts/setup.sh: CMAKE_BUILD_TYPE of the build."},
      {"MNCL_BUILD_TARGETS", "",
       "scripts/setup.sh: build only these targets (space-separated; default: everything)."},
      {"MNCL_CMAKE_ARGS", "", "scripts/setup.sh: more arguments for CMake's configure step."},
      {"MNCL_SWEEP_BACKENDS", "naive,flat,gloo,shm",
       "scripts/sweep.sh: the backends to sweep (missing or unusable ones are skipped, with the "
       "reason)."},
      {"MNCL_SWEEP_OUT", "", "scripts/sweep.sh: the output folder (default: <build>/sweep)."},
      {"MNCL_TEST_SANITIZERS", "0",
       "scripts/test.sh: 1 also runs the reliability builds (ASan+UBSan, TSan, fuzzing), as CI "
       "does."},
      {"MNCL_FUZZ_SECONDS", "60", "scripts/reliability.sh: seconds of the libFuzzer run."},
      {"MNCL_JOBS", "nproc", "scripts/update-abi-baseline.sh: parallel jobs of its build."},
      {"MNCL_GPU_CHECK_MAX_BYTES", "1Gi",
       "tests/gpu/run.sh: the largest size of its overhead sweep."},
      // Reliability aids (tests/fault).
      {"MNCL_DEBUG_CHECKS", "0",
       "1: before each collective, every rank compares a fingerprint of its call (kind, count, "
       "dtype, op, root, sequence number) with the other ranks' through the store, so "
       "mismatched calls fail on every rank naming both (a few store round trips per call). "
       "Then the counts that differ by rank: each gatherv/scatterv count against the root's "
       "counts[rank], each alltoallv sendcounts[j] against rank j's recvcounts[rank]; a "
       "disagreement fails every rank with MNCL_ERR_REMOTE naming both ranks and counts."},
      {"MNCL_SHM_FAKE_HOST", "",
       "Test hook: shm takes ranks with different values for ranks on different hosts (its "
       "refusal of a communicator that spans hosts is tested on one machine)."},
  };
  return variables;
}

const Variable *find(const std::string &name) {
  for (const auto &v : table()) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

const char *raw(const char *name) {
  return secure_getenv(name);
}

bool is_secret(const std::string &name) {
  std::string upper = name;
  for (char &c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char *word : {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL"}) {
    if (upper.find(word) != std::string::npos) return true;
  }
  return false;
}

std::string shown_value(const std::string &name, const char *value) {
  if (value == nullptr) return "(unset)";
  return is_secret(name) ? "set (hidden)" : std::string(value);
}

namespace {

bool starts_with(const std::string &text, const char *prefix) {
  return text.compare(0, std::strlen(prefix), prefix) == 0;
}

// The test suite's hooks (fake GPUs, mock plugins, per-test knobs) and mncl-perf's hand-over
// to its ranks: set in the processes of tests and benchmarks, documented where they are read.
bool is_internal(const std::string &name) {
  // Written after "MNCL_" (as below): tests/loader/check_env_table.sh takes every quoted
  // "MNCL_..." literal of the library for a variable it reads.
  const std::string rest = name.substr(5);
  for (const char *prefix :
       {"TEST_", "MOCK_", "FAKE_", "GPU_TEST_", "SPLIT_TEST_", "CONFORMANCE_", "PERF_"}) {
    if (starts_with(rest, prefix)) return true;
  }
  return rest == "P2P_ITERATIONS";
}

std::vector<std::string> (*g_plugin_names)() = nullptr;  // set_plugin_names_source

std::string likely_meant(const std::string &name);

// A name in the namespace of a plugin found on the search path (a third party's: MNCL_MINE_FOO
// for libmncl-mine.so), which only that plugin knows. Never that of a built-in plugin, whose
// variables the table holds (MNCL_GLOO_IFAC, MNCL_NCCL_DEBUG are typos), nor a name near a
// documented one or another library's name for one (a file libmncl-timeout.so must not hide
// MNCL_TIMEOUT_S). plugins: their names, as found.
bool in_plugin_namespace(const std::string &name, const std::vector<std::string> &plugins) {
  static const char *const kBuiltIn[] = {"naive", "flat", "gloo", "shm", "nccl"};
  for (const std::string &plugin : plugins) {
    if (std::find_if(std::begin(kBuiltIn), std::end(kBuiltIn),
                     [&](const char *b) { return lower(plugin) == b; }) != std::end(kBuiltIn)) {
      continue;
    }
    std::string stem = "MNCL_";  // MNCL_MY_NET for my-net
    for (const char c : plugin) {
      stem += std::isalnum(static_cast<unsigned char>(c))
                  ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                  : '_';
    }
    if (starts_with(name, (stem + "_").c_str()) && likely_meant(name).empty()) return true;
  }
  return false;
}

std::vector<std::string> plugin_names() {
  return g_plugin_names != nullptr ? g_plugin_names() : std::vector<std::string>{};
}

size_t edit_distance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The documented name an unknown one most likely meant: names other libraries use for the
// same setting (NCCL_DEBUG's, torch's), else the closest by edit distance (at most 2, 3 for
// long names), else "".
std::string likely_meant(const std::string &name) {
  // After "MNCL_", as in is_internal.
  static const std::pair<const char *, const char *> kAliases[] = {
      {"LOG", "DEBUG"},
      {"LOG_LEVEL", "DEBUG"},
      {"LOGLEVEL", "DEBUG"},
      {"VERBOSE", "DEBUG"},
      {"LOG_FILE", "DEBUG_FILE"},
      {"WORLD_SIZE", "SIZE"},
      {"NRANKS", "SIZE"},
      {"LOCAL_WORLD_SIZE", "LOCAL_SIZE"},
      {"SOCKET_IFNAME", "GLOO_IFACE"},
      {"IFNAME", "GLOO_IFACE"},
      {"GLOO_IFNAME", "GLOO_IFACE"},
      {"GLOO_SOCKET_IFNAME", "GLOO_IFACE"},
      {"MASTER_ADDR", "STORE"},
      {"MASTER_PORT", "STORE"},
      {"TIMEOUT_S", "TIMEOUT"},
      {"TIMEOUT_MS", "TIMEOUT"},
  };
  for (const auto &[alias, meant] : kAliases) {
    if (name.compare(5, std::string::npos, alias) == 0) return std::string("MNCL_") + meant;
  }
  std::string best;
  size_t best_distance = name.size() > 12 ? 3 : 2;
  for (const auto &v : table()) {
    if (!starts_with(v.name, "MNCL_")) continue;
    const size_t d = edit_distance(name, v.name);
    if (d <= best_distance && (best.empty() || d < best_distance)) {
      best = v.name;
      best_distance = d;
    }
  }
  return best;
}

std::mutex g_mutex;
std::set<std::string> g_logged;          // names whose value was logged
std::set<std::string> g_warned_unknown;  // unknown names warned about

// Once per process, under g_mutex: every unknown MNCL_* name set now.
void warn_unknown_once() {
  static bool scanned = false;
  if (scanned) return;
  scanned = true;
  for (const auto &unknown : unknown_variables()) {
    if (g_warned_unknown.insert(unknown.name).second) {
      MNCL_WARN("%s (mncl-info --env lists them)", describe_unknown(unknown).c_str());
    }
  }
}

}  // namespace

void set_plugin_names_source(std::vector<std::string> (*source)()) {
  g_plugin_names = source;
}

std::vector<Unknown> unknown_variables() {
  std::vector<Unknown> out;
  std::optional<std::vector<std::string>> plugins;  // looked up for the first candidate only
  for (char **entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char *equals = std::strchr(*entry, '=');
    if (equals == nullptr) continue;
    const std::string name(*entry, static_cast<size_t>(equals - *entry));
    if (!starts_with(name, "MNCL_") || find(name) != nullptr || is_internal(name)) continue;
    if (!plugins) plugins = plugin_names();
    if (in_plugin_namespace(name, *plugins)) continue;
    out.push_back({name, likely_meant(name)});
  }
  std::sort(out.begin(), out.end(),
            [](const Unknown &a, const Unknown &b) { return a.name < b.name; });
  return out;
}

std::string describe_unknown(const Unknown &unknown) {
  std::string text = unknown.name + " is not a documented MNCL variable and has no effect";
  if (!unknown.meant.empty()) text += " (did you mean " + unknown.meant + "?)";
  return text;
}

std::optional<std::string> get(const char *name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  warn_unknown_once();
  const char *value = raw(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  if (g_logged.insert(name).second) {
    if (is_secret(name)) {
      MNCL_INFO("%s set by environment (value hidden)", name);
    } else {
      MNCL_INFO("%s set by environment to %s", name, value);
    }
    // Plugins read their own variables (GLOO_SOCKET_IFNAME...) through the host's get_env:
    // only a name in MNCL's own namespace that the table lacks is a likely typo (set after
    // the first scan, or read by a plugin under an undocumented name).
    if (std::strncmp(name, "MNCL_", 5) == 0 && find(name) == nullptr && !is_internal(name) &&
        !in_plugin_namespace(name, plugin_names()) && g_warned_unknown.insert(name).second) {
      MNCL_WARN("%s (mncl-info --env lists them)",
                describe_unknown({name, likely_meant(name)}).c_str());
    }
  }
  return std::string(value);
}

std::string lower(std::string text) {
  for (char &c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::optional<int64_t> get_timeout_ms(const char *name) {
  auto text = get(name);
  if (!text) return std::nullopt;
  errno = 0;
  char *end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  MNCL_CHECK(errno == 0 && end != text->c_str() && *end == '\0' && std::isfinite(seconds),
             MNCL_ERR_INVALID_ARGUMENT, "%s='%s' is not a number of seconds", name, text->c_str());
  MNCL_CHECK(seconds > 0 && seconds * 1000.0 <= static_cast<double>(kMaxTimeoutMs),
             MNCL_ERR_INVALID_ARGUMENT,
             "%s='%s' is out of range: give seconds > 0 and at most one week (604800)", name,
             text->c_str());
  return static_cast<int64_t>(std::ceil(seconds * 1000.0));
}

std::optional<int64_t> get_int(const char *name, int64_t lo, int64_t hi) {
  auto text = get(name);
  if (!text) return std::nullopt;
  errno = 0;
  char *end = nullptr;
  const long long value = std::strtoll(text->c_str(), &end, 10);
  MNCL_CHECK(errno == 0 && end != text->c_str() && *end == '\0', MNCL_ERR_INVALID_ARGUMENT,
             "%s='%s' is not an integer", name, text->c_str());
  MNCL_CHECK(value >= lo && value <= hi, MNCL_ERR_INVALID_ARGUMENT,
             "%s=%lld is out of range [%lld, %lld]", name, value, static_cast<long long>(lo),
             static_cast<long long>(hi));
  return value;
}

}  // namespace mncl::env

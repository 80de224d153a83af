#include "common/env.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

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
       "Shared secret every rank presents to the TCP store; connections without it are refused."},
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
       "gloo: network interface to bind (default: the host name's address; loopback on one "
       "host)."},
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
       "the package, then the system's search path)."},
      {"MNCL_RUN_GRACE", "5",
       "mncl-run: seconds the other ranks get to end after one failed before they are killed."},
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

std::optional<std::string> get(const char *name) {
  const char *value = raw(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  static std::mutex mutex;
  static std::set<std::string> logged;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (logged.insert(name).second) {
      if (is_secret(name)) {
        MNCL_INFO("%s set by environment (value hidden)", name);
      } else {
        MNCL_INFO("%s set by environment to %s", name, value);
      }
      // Plugins read their own variables (GLOO_SOCKET_IFNAME...) through the host's get_env:
      // only a name in MNCL's own namespace that the table lacks is a likely typo.
      if (std::strncmp(name, "MNCL_", 5) == 0 && find(name) == nullptr) {
        MNCL_WARN("%s is not a documented MNCL variable (mncl-info --env lists them)", name);
      }
    }
  }
  return std::string(value);
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

#include "core/launch_env.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "bootstrap/store.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "topology/binding.h"

namespace mncl::core {

namespace {

constexpr int64_t kDefaultTimeoutMs = 300000;
// The TCP store waits for at most 2^20 keys at once (one per rank when joining): a larger job
// could never start, and rank 0 would first allocate for it.
constexpr int64_t kMaxRanks = 1 << 20;

// One launcher's variables. local_rank / local_size: nullptr where it has none (the local
// rank and size then come from grouping the ranks by host).
struct Launcher {
  const char *name;
  const char *rank;
  const char *size;
  const char *local_rank;
  const char *local_size;
};
// In the order they are looked at: the first that sets both its rank and its size gives them.
constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE", nullptr, nullptr},
    // SLURM_NTASKS_PER_NODE is what was asked for, not this node's count: the size comes from
    // grouping by host.
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};
constexpr const Launcher &kTorchrun = kLaunchers[0];
constexpr const Launcher &kOpenMpi = kLaunchers[1];
constexpr const Launcher &kPmi = kLaunchers[2];
constexpr const Launcher &kSlurm = kLaunchers[3];

struct RankSize {
  int64_t rank = 0;
  int64_t size = 1;
  bool operator==(const RankSize &o) const { return rank == o.rank && size == o.size; }
};

// Whether this process is a task of an srun step (SLURM_STEP_ID, or the older SLURM_STEPID, a
// normal step's id). An sbatch script (the batch step) has SLURM_PROCID=0 and SLURM_NTASKS of
// the whole allocation too: a program it runs (preprocessing, or a launcher of its own) is no
// rank of N. So are salloc's shell (the interactive step) and the extern step.
bool in_slurm_step() {
  constexpr int64_t kMaxNormalStepId = 0xfffffff0;  // slurm.h's SLURM_MAX_NORMAL_STEP_ID
  for (const char *name : {"SLURM_STEP_ID", "SLURM_STEPID"}) {
    const char *v = env::raw(name);
    if (v == nullptr || *v == '\0') continue;
    char *end = nullptr;
    errno = 0;
    const long long id = std::strtoll(v, &end, 10);
    return errno == 0 && *end == '\0' && id >= 0 && id < kMaxNormalStepId;
  }
  return false;
}

// Whether the launcher's variables count at all (Slurm's only in an srun step).
bool counts(const Launcher &l) {
  return &l != &kSlurm || in_slurm_step();
}

// A launcher's rank and size, if it sets both.
std::optional<RankSize> complete(const Launcher &l) {
  if (!counts(l)) return std::nullopt;
  const auto rank = env::get_int(l.rank, 0, kMaxRanks);
  const auto size = env::get_int(l.size, 1, kMaxRanks);
  if (!rank || !size) return std::nullopt;
  return RankSize{*rank, *size};
}

// As complete(), for a launcher only looked at, not used: a malformed value of it (RANK=abc
// beside mncl-run's MNCL_RANK/MNCL_SIZE) is ignored with a warning instead of failing.
std::optional<RankSize> complete_if_valid(const Launcher &l) {
  try {
    return complete(l);
  } catch (const Error &e) {
    MNCL_WARN("%s's variables ignored: %s", l.name, e.what());
    return std::nullopt;
  }
}

std::string describe(const Launcher &l, const RankSize &v) {
  return format("%s=%lld %s=%lld (%s)", l.rank, static_cast<long long>(v.rank), l.size,
                static_cast<long long>(v.size), l.name);
}

bool truthy(const char *name) {
  const char *v = env::raw(name);
  if (v == nullptr) return false;
  const std::string text = env::lower(v);
  return text == "true" || text == "1" || text == "yes";
}

// Whether `outer`'s variables, disagreeing with those of `inner` (the launcher that gives the
// rank), are those of a launcher that started `inner`'s: srun or an sbatch/salloc step around
// mpirun, or around any launcher of more ranks than Slurm has tasks (one Slurm task per node,
// each starting several ranks), or anything around torchrun. torchrun counts as inner only when its
// agent's own variable is there (TORCHELASTIC_RUN_ID): a RANK/WORLD_SIZE pair typed by hand or left
// in the shell is not.
bool encloses(const Launcher &outer, const RankSize &outer_values, const Launcher &inner,
              const RankSize &inner_values) {
  if (&outer == &kSlurm) {
    // mpirun in an sbatch script starts its daemons with srun (Open MPI 3 and later, MPICH's
    // hydra): its ranks inherit the daemons' step, SLURM_PROCID the node's index and
    // SLURM_NTASKS the number of nodes, whatever -np and the mapping.
    if (&inner == &kOpenMpi || &inner == &kPmi) return true;
    // Fewer Slurm tasks than ranks: each task starts several workers (DeepSpeed's launcher,
    // mp.spawn). A stale pair of a smaller job (RANK=0 WORLD_SIZE=1 under srun -n 2) is not.
    if (outer_values.size < inner_values.size) return true;
  }
  if (&inner == &kTorchrun) return env::raw("TORCHELASTIC_RUN_ID") != nullptr;
  return false;
}

// The job id `l` gives each of its ranks (see LaunchSettings::job_token); "" where it gives none.
// PMIx's namespace only beside PMIX_RANK = `rank`: one inherited from whatever started the
// launcher (which sets no PMIx variables itself) need not be the same on every rank.
std::string launcher_job_token(const Launcher &l, int rank) {
  const auto value = [](const char *name) { return env::get(name).value_or(""); };
  if (&l == &kTorchrun) {
    const std::string run = value("TORCHELASTIC_RUN_ID");  // "none": torchrun's default
    return run.empty() || run == "none" ? "" : "torchrun:" + run;
  }
  if (&l == &kSlurm) {
    std::string step = value("SLURM_STEP_ID");
    if (step.empty()) step = value("SLURM_STEPID");
    const std::string job = value("SLURM_JOB_ID");
    return job.empty() || step.empty() ? "" : "slurm:" + job + "." + step;
  }
  // Open MPI's job id and its random per-job transport key; else (Open MPI 5, PMI) PMIx's
  // namespace of the job.
  if (&l == &kOpenMpi && !value("OMPI_MCA_ess_base_jobid").empty()) {
    return "ompi:" + value("OMPI_MCA_ess_base_jobid") + "-" +
           value("OMPI_MCA_orte_precondition_transports");
  }
  const std::string ns = value("PMIX_NAMESPACE");
  return ns.empty() || value("PMIX_RANK") != std::to_string(rank) ? "" : "pmix:" + ns;
}

// The launcher whose rank and size are used: the first that sets both. Every other launcher
// that sets both must agree with it, unless it started that one (encloses): a RANK=0
// WORLD_SIZE=1 left in the shell under mpirun made every process a job of one rank. Only the
// user's MNCL_RANK/MNCL_SIZE (or the config) settle a disagreement. nullptr: none sets both.
const Launcher *choose_launcher() {
  const Launcher *chosen = nullptr;
  RankSize values;
  for (const Launcher &l : kLaunchers) {
    if (auto v = complete(l)) {
      chosen = &l;
      values = *v;
      break;
    }
  }
  if (chosen == nullptr) return nullptr;
  for (const Launcher &other : kLaunchers) {
    if (&other == chosen) continue;
    const auto v = complete(other);
    if (v) {
      if (*v == values) continue;
      if (encloses(other, *v, *chosen, values)) {
        MNCL_INFO("%s ignored: the rank and size come from %s, run under %s",
                  describe(other, *v).c_str(), describe(*chosen, values).c_str(), other.name);
        continue;
      }
      throw Error(MNCL_ERR_INVALID_ARGUMENT,
                  format("the launchers' variables disagree: %s but %s; one pair was left in the "
                         "environment by another launch. Unset the variables of the launcher "
                         "that did not start this process (%s and %s, or %s and %s), or set "
                         "MNCL_RANK and MNCL_SIZE to the rank and size to use",
                         describe(*chosen, values).c_str(), describe(other, *v).c_str(),
                         chosen->rank, chosen->size, other.rank, other.size));
    }
    // A lone variable of a launcher looked at earlier (a RANK without WORLD_SIZE under
    // mpirun) is ignored, with a warning where it differs.
    if (&other > chosen) continue;
    const auto lone_rank = env::get_int(other.rank, 0, kMaxRanks);
    const auto lone_size = env::get_int(other.size, 1, kMaxRanks);
    if (lone_rank && *lone_rank != values.rank) {
      MNCL_WARN("%s=%lld (%s) ignored: the rank and size come from %s", other.rank,
                static_cast<long long>(*lone_rank), other.name, describe(*chosen, values).c_str());
    }
    if (lone_size && *lone_size != values.size) {
      MNCL_WARN("%s=%lld (%s) ignored: the rank and size come from %s", other.size,
                static_cast<long long>(*lone_size), other.name, describe(*chosen, values).c_str());
    }
  }
  return chosen;
}

// With no launcher setting both: the first that sets this one variable.
const Launcher *first_setting(const char *Launcher::*field, int64_t lo) {
  for (const Launcher &l : kLaunchers) {
    if (counts(l) && env::get_int(l.*field, lo, kMaxRanks)) return &l;
  }
  return nullptr;
}

// Whether the job's rank and size are those of an MPI launcher (Open MPI, PMI, or PMIx under
// srun --mpi=pmix): not merely that such variables are around (mncl-run started from an
// mpirun'ed shell, a stale RANK/WORLD_SIZE pair...).
bool from_mpi(const RankSize &job) {
  for (const Launcher *l : {&kOpenMpi, &kPmi}) {
    if (auto v = complete_if_valid(*l); v && *v == job) return true;
  }
  const char *pmix = env::raw("PMIX_RANK");
  if (pmix == nullptr || *pmix == '\0') return false;
  char *end = nullptr;
  errno = 0;
  const long long pmix_rank = std::strtoll(pmix, &end, 10);
  if (errno != 0 || *end != '\0' || pmix_rank != job.rank) return false;
  auto slurm = complete_if_valid(kSlurm);
  return slurm && *slurm == job;
}

// tcp://MASTER_ADDR:MASTER_PORT, MASTER_ADDR checked here so that a mistake names it (the
// URL's parser would name a URL the user never wrote, and "host:port" in MASTER_ADDR would
// pass as an IPv6 address that then resolves nowhere, every rank but 0 waiting out the timeout).
std::string master_store_url(const std::string &addr, int64_t port) {
  const auto refuse = [&](const char *why) {
    throw Error(MNCL_ERR_INVALID_ARGUMENT,
                format("MASTER_ADDR='%s' %s (it names rank 0's host: a host name, an IPv4 "
                       "address or an IPv6 address, with the port in MASTER_PORT)",
                       addr.c_str(), why));
  };
  if (addr.empty()) refuse("is empty");
  for (char c : addr) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '@') {
      refuse("holds a space, '/' or '@'");
    }
  }
  // torchrun takes an IPv6 MASTER_ADDR as it is; a URL needs it in brackets.
  std::string host = addr;
  const bool bracketed = host.front() == '[';
  if (bracketed) {
    const size_t close = host.find(']');
    if (close == std::string::npos) refuse("has unbalanced brackets");
    if (close + 1 != host.size()) refuse("has more after ']' (a port belongs in MASTER_PORT)");
    host = host.substr(1, close - 1);
  } else if (host.find_first_of("[]") != std::string::npos) {
    refuse("has unbalanced brackets");
  }
  const bool ipv6 = host.find(':') != std::string::npos;
  if (ipv6) {
    in6_addr address{};
    const std::string unscoped = host.substr(0, host.find('%'));  // fe80::1%eth0
    if (inet_pton(AF_INET6, unscoped.c_str(), &address) != 1) {
      refuse(!bracketed && host.find(':') == host.rfind(':')
                 ? "is no IPv6 address (a port after ':' belongs in MASTER_PORT)"
                 : "is no IPv6 address");
    }
  } else if (bracketed) {
    in_addr address{};
    if (inet_pton(AF_INET, host.c_str(), &address) != 1) refuse("is no address in brackets");
  }
  return format(ipv6 ? "tcp://[%s]:%lld" : "tcp://%s:%lld", host.c_str(),
                static_cast<long long>(port));
}

}  // namespace

mncl_config_t read_user_config(const mncl_config_t *user) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  if (user == nullptr) return config;
  constexpr size_t kMinSize = offsetof(mncl_config_t, backend);
  MNCL_CHECK(user->struct_size >= kMinSize, MNCL_ERR_INVALID_ARGUMENT,
             "config->struct_size is %zu, smaller than any mncl_config_t (%zu); initialize it "
             "with MNCL_CONFIG_INIT",
             user->struct_size, kMinSize);
  MNCL_CHECK(user->magic == MNCL_CONFIG_MAGIC, MNCL_ERR_INVALID_ARGUMENT,
             "config->magic is 0x%08x, expected MNCL_CONFIG_MAGIC (0x%08x); initialize the "
             "config with MNCL_CONFIG_INIT",
             user->magic, MNCL_CONFIG_MAGIC);
  MNCL_CHECK(user->struct_size <= (1u << 16), MNCL_ERR_INVALID_ARGUMENT,
             "config->struct_size is %zu, implausibly large", user->struct_size);
  // An older caller's smaller struct: the fields it does not have keep their defaults.
  std::memcpy(&config, user, std::min(user->struct_size, sizeof config));
  config.struct_size = sizeof config;
  // A newer caller's larger struct: accepted only if every field we do not know is zero.
  const auto *tail = reinterpret_cast<const unsigned char *>(user);
  for (size_t i = sizeof config; i < user->struct_size; ++i) {
    MNCL_CHECK(tail[i] == 0, MNCL_ERR_NOT_SUPPORTED,
               "config (struct_size %zu, version %d) sets fields unknown to this library "
               "(mncl_config_t of %zu bytes, version %d); upgrade libmncl",
               user->struct_size, static_cast<int>(user->version), sizeof config, MNCL_VERSION);
  }
  MNCL_CHECK(config.reserved0 == 0, MNCL_ERR_INVALID_ARGUMENT, "config->reserved0 must be 0");
  return config;
}

std::string normalized_backend_list(const std::string &spec) {
  std::string out;
  size_t begin = 0;
  for (;;) {
    const size_t comma = spec.find(',', begin);
    const std::string entry =
        spec.substr(begin, comma == std::string::npos ? comma : comma - begin);
    out += env::lower(entry) == "auto" ? "auto" : entry;
    if (comma == std::string::npos) return out;
    out += ',';
    begin = comma + 1;
  }
}

LaunchSettings resolve_launch_settings(const mncl_config_t &config) {
  LaunchSettings s;

  s.backend_spec = normalized_backend_list(
      config.backend ? config.backend : env::get("MNCL_BACKEND").value_or("auto"));
  if (config.backend) s.backend_origin = "config.backend";
  MNCL_CHECK(!s.backend_spec.empty(), MNCL_ERR_INVALID_ARGUMENT, "the backend name is empty");
  s.backend_host = normalized_backend_list(env::get("MNCL_BACKEND_HOST").value_or(""));
  s.backend_cuda = normalized_backend_list(env::get("MNCL_BACKEND_CUDA").value_or(""));
  s.memory = env::lower(env::get("MNCL_MEMORY").value_or("auto"));
  MNCL_CHECK(s.memory == "auto" || s.memory == "host" || s.memory == "cuda",
             MNCL_ERR_INVALID_ARGUMENT, "MNCL_MEMORY='%s' is not auto, host or cuda",
             s.memory.c_str());
  s.bind = env::lower(env::get("MNCL_BIND").value_or("auto"));
  topology::parse_bind_mode(s.bind);  // throws, naming MNCL_BIND and the bad value
  // Read at each creation; parsed here too so that a bad value fails before the rendezvous,
  // and mncl-info reports it.
  s.lane_linger_us = env::get_int("MNCL_LANE_LINGER_US", 0, 1000000).value_or(50);
  s.debug_checks = env::get_int("MNCL_DEBUG_CHECKS", 0, 1).value_or(0) == 1;

  // Size first, so the rank can be range-checked against it. MNCL_RANK/MNCL_SIZE (and the
  // config) are the user's own and win, unchecked; else the launchers' (choose_launcher).
  const bool explicit_rank = config.rank != MNCL_FROM_ENV || env::get("MNCL_RANK");
  const bool explicit_size = config.size != MNCL_FROM_ENV || env::get("MNCL_SIZE");
  const Launcher *chosen = explicit_rank && explicit_size ? nullptr : choose_launcher();
  const Launcher *size_from = nullptr, *rank_from = nullptr;
  if (config.size != MNCL_FROM_ENV) {
    MNCL_CHECK(config.size >= 1, MNCL_ERR_INVALID_ARGUMENT,
               "config->size is %d; it must be >= 1 (or -1 for the environment)", config.size);
    s.size = config.size;
  } else if (auto size = env::get_int("MNCL_SIZE", 1, kMaxRanks)) {
    s.size = static_cast<int>(*size);
  } else {
    size_from = chosen ? chosen : first_setting(&Launcher::size, 1);
    s.size = size_from ? static_cast<int>(*env::get_int(size_from->size, 1, kMaxRanks)) : 1;
  }
  if (config.rank != MNCL_FROM_ENV) {
    s.rank = config.rank;
  } else if (auto rank = env::get_int("MNCL_RANK", 0, kMaxRanks)) {
    s.rank = static_cast<int>(*rank);
  } else {
    rank_from = chosen ? chosen : first_setting(&Launcher::rank, 0);
    s.rank = rank_from ? static_cast<int>(*env::get_int(rank_from->rank, 0, kMaxRanks)) : 0;
  }
  s.rank_origin = config.rank != MNCL_FROM_ENV ? "config->rank"
                  : rank_from                  ? rank_from->rank
                  : explicit_rank              ? "MNCL_RANK"
                                               : "the default";
  s.size_origin = config.size != MNCL_FROM_ENV ? "config->size"
                  : size_from                  ? size_from->size
                  : explicit_size              ? "MNCL_SIZE"
                                               : "the default";
  MNCL_CHECK(s.rank >= 0 && s.rank < s.size, MNCL_ERR_INVALID_ARGUMENT,
             "rank %d (from %s) is out of range for %d ranks (from %s)", s.rank,
             s.rank_origin.c_str(), s.size, s.size_origin.c_str());
  const RankSize job{s.rank, s.size};
  s.launched_by_mpi = from_mpi(job);
  if (rank_from != nullptr && rank_from == size_from)
    s.job_token = launcher_job_token(*rank_from, s.rank);

  // The local rank and size: the user's, else those of the launcher that gave the rank (never
  // a leftover LOCAL_RANK beside mpirun's); with a rank the user set, those of a launcher whose
  // rank and size are the same; else -1: from grouping the ranks by host.
  const Launcher *local_from = rank_from;
  if (local_from == nullptr && explicit_rank) {
    for (const Launcher &l : kLaunchers) {
      if (auto v = complete_if_valid(l); v && *v == job) {
        local_from = &l;
        break;
      }
    }
  }
  const char *local_rank_name = "MNCL_LOCAL_RANK", *local_size_name = "MNCL_LOCAL_SIZE";
  if (auto v = env::get_int("MNCL_LOCAL_RANK", 0, kMaxRanks)) {
    s.local_rank = static_cast<int>(*v);
  } else if (local_from != nullptr && local_from->local_rank != nullptr) {
    local_rank_name = local_from->local_rank;
    s.local_rank = static_cast<int>(env::get_int(local_rank_name, 0, kMaxRanks).value_or(-1));
  }
  if (auto v = env::get_int("MNCL_LOCAL_SIZE", 1, kMaxRanks)) {
    s.local_size = static_cast<int>(*v);
  } else if (local_from != nullptr && local_from->local_size != nullptr) {
    local_size_name = local_from->local_size;
    s.local_size = static_cast<int>(env::get_int(local_size_name, 1, kMaxRanks).value_or(-1));
  }
  s.local_rank_origin = local_rank_name;
  // The local rank picks the GPU: one past the local size is a launcher's mistake, not a device.
  MNCL_CHECK(s.local_rank < 0 || s.local_size < 0 || s.local_rank < s.local_size,
             MNCL_ERR_INVALID_ARGUMENT,
             "the local rank %d (from %s) is out of range for %d local ranks (from %s); set "
             "MNCL_LOCAL_RANK and MNCL_LOCAL_SIZE to override",
             s.local_rank, local_rank_name, s.local_size, local_size_name);

  // The bootstrap store: the config's or MNCL_STORE, else torchrun's MASTER_ADDR:MASTER_PORT
  // (checked strictly only then: a stray MASTER_PORT=abc fails no job of one rank, nor one that
  // names its store).
  const bool store_named = config.bootstrap != nullptr || env::get("MNCL_STORE");
  const bool store_from_master = !store_named && s.size > 1;
  std::optional<std::string> master_addr;
  int64_t master_port = 0;  // 0: not set
  std::string master_url;
  try {
    master_addr = env::get("MASTER_ADDR");
    master_port = env::get_int("MASTER_PORT", 1, 65535).value_or(0);
    if (master_addr && master_port > 0) master_url = master_store_url(*master_addr, master_port);
  } catch (const Error &) {
    // Held against the job only where they make its store (MASTER_ADDR set: a lone malformed
    // MASTER_PORT beside mpirun's private file store gives nothing).
    if (store_from_master && env::get("MASTER_ADDR")) throw;
    master_addr.reset();  // not used: only compared with the store named below
    master_port = 0;
    master_url.clear();
  }
  if (config.bootstrap != nullptr) {
    s.store_url = config.bootstrap;
    bootstrap::check_store_url(s.store_url, "config->bootstrap");
  } else if (auto url = env::get("MNCL_STORE")) {
    s.store_url = *url;
    bootstrap::check_store_url(s.store_url, "MNCL_STORE");
  } else if (s.size > 1) {
    // A job of one rank needs no store: torchrun --nproc-per-node=1 sets MASTER_ADDR and
    // MASTER_PORT all the same, where its agent's own store may already listen.
    s.store_url = master_url;
    s.store_from_master = !master_url.empty();
  }
  // torchrun's agent serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
  // rank 0 could not listen there, and the other ranks would talk to torch's store.
  if (s.size > 1 && !master_url.empty() && s.store_url == master_url &&
      truthy("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string host = master_url.substr(6, master_url.rfind(':') - 6);
    throw Error(MNCL_ERR_BOOTSTRAP,
                format("%s is torchrun's own store (TORCHELASTIC_USE_AGENT_STORE=%s: torchrun's "
                       "agent already listens on MASTER_PORT=%lld), so MNCL cannot start its "
                       "store there: set MNCL_STORE=tcp://%s:<another free port>, the same on "
                       "every rank (rank 0 listens there)",
                       master_url.c_str(), env::raw("TORCHELASTIC_USE_AGENT_STORE"),
                       static_cast<long long>(master_port), host.c_str()));
  }
  // Under mpirun on a single host, no address is needed: a file store in /tmp named after the
  // Open MPI job id is private to this job and visible to all of its ranks. The job id holds
  // only 16 bits that differ between runs of mpirun, so the folder's name also carries the
  // job's random 128-bit transport key (mpirun sets it for every job): a folder left by a
  // killed job of the same id is then never taken for this job's.
  if (s.store_url.empty() && s.size > 1) {
    const char *job_id = env::raw("OMPI_MCA_ess_base_jobid");
    const auto ompi = complete(kOpenMpi);
    const auto local_size = env::get_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxRanks);
    if (job_id != nullptr && ompi && *ompi == job && local_size && *local_size == s.size) {
      std::string key = env::raw("OMPI_MCA_orte_precondition_transports")
                            ? env::raw("OMPI_MCA_orte_precondition_transports")
                            : "";
      if (key.find_first_not_of("0123456789abcdefABCDEF-") != std::string::npos) key.clear();
      s.store_url = format("file:///tmp/mncl-%d-ompi-%s%s%s", static_cast<int>(getuid()), job_id,
                           key.empty() ? "" : "-", key.c_str());
      s.store_is_private_dir = true;
    }
  }
  if (s.size > 1 && s.store_url.empty()) {
    std::string hint;
    if (master_addr && master_port == 0) {
      hint = format("; MASTER_ADDR is set (%s) but MASTER_PORT is not: set it too",
                    master_addr->c_str());
    } else if (!master_addr && master_port > 0) {
      hint = format("; MASTER_PORT is set (%lld) but MASTER_ADDR is not: set it too",
                    static_cast<long long>(master_port));
    }
    throw Error(MNCL_ERR_BOOTSTRAP,
                format("a job of %d ranks (from %s) needs a bootstrap store: set "
                       "MNCL_STORE=tcp://host:port (rank 0 listens there) or file:///shared/dir, "
                       "or MASTER_ADDR and MASTER_PORT, or launch with mncl-run -n %d%s",
                       s.size, s.size_origin.c_str(), s.size, hint.c_str()));
  }

  if (config.timeout_ms != MNCL_FROM_ENV) {
    // The bound MNCL_TIMEOUT has: deadlines computed from larger values overflowed the clocks'
    // arithmetic (create failed at once, or poll() got a negative timeout and never returned).
    MNCL_CHECK(
        config.timeout_ms > 0 && config.timeout_ms <= env::kMaxTimeoutMs, MNCL_ERR_INVALID_ARGUMENT,
        "config->timeout_ms is %lld; it must be > 0 and at most %lld (one week), or -1 "
        "for MNCL_TIMEOUT",
        static_cast<long long>(config.timeout_ms), static_cast<long long>(env::kMaxTimeoutMs));
    s.timeout_ms = config.timeout_ms;
  } else {
    s.timeout_ms = env::get_timeout_ms("MNCL_TIMEOUT").value_or(kDefaultTimeoutMs);
  }

  if (config.device != MNCL_FROM_ENV) {
    MNCL_CHECK(config.device >= 0, MNCL_ERR_INVALID_ARGUMENT,
               "config->device is %d; it must be >= 0 (or -1 for the default)", config.device);
    s.device = config.device;
  } else {
    s.device = static_cast<int>(env::get_int("MNCL_DEVICE", 0, 1 << 16).value_or(-1));
  }
  return s;
}

}  // namespace mncl::core

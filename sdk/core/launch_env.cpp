#include "core/launch_env.h"

#include <unistd.h>

#include <cstring>
#include <optional>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "topology/binding.h"

namespace mncl::core {

namespace {

constexpr int64_t kDefaultTimeoutMs = 300000;
constexpr int64_t kMaxRanks = 1 << 24;

// The first of several launcher variables that is set, as an integer in [lo, hi].
std::optional<int64_t> first_int(std::initializer_list<const char *> names, int64_t lo,
                                 int64_t hi) {
  for (const char *name : names) {
    if (auto v = env::get_int(name, lo, hi)) return v;
  }
  return std::nullopt;
}

// The rank and size variables of each launcher, in the order they are looked at.
struct LauncherVar {
  const char *launcher;
  const char *rank;
  const char *size;
};
constexpr LauncherVar kLauncherVars[] = {
    {"torchrun", "RANK", "WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
};

// Where `field` comes from: the first launcher that sets both its rank and its size, so that
// a variable another launcher left in the shell (a RANK from torchrun under mpirun gave every
// process the same rank) cannot mix with it; else the first launcher that sets `field` (an
// sbatch script's exported WORLD_SIZE beside srun's SLURM_PROCID). Variables of a launcher
// looked at earlier that are ignored and disagree get a warning.
const LauncherVar *launcher_var(const char *LauncherVar::*field, int64_t lo) {
  for (const LauncherVar &vars : kLauncherVars) {
    const auto value = env::get_int(vars.*field, lo, kMaxRanks);
    if (!value || !env::get_int(vars.rank, 0, kMaxRanks) || !env::get_int(vars.size, 1, kMaxRanks))
      continue;
    for (const LauncherVar *earlier = kLauncherVars; earlier != &vars; ++earlier) {
      const auto ignored = env::get_int(earlier->*field, lo, kMaxRanks);
      if (ignored && *ignored != *value) {
        MNCL_WARN("%s=%lld (%s) ignored: the rank and size come from %s (%s=%lld)", earlier->*field,
                  static_cast<long long>(*ignored), earlier->launcher, vars.launcher, vars.*field,
                  static_cast<long long>(*value));
      }
    }
    return &vars;
  }
  for (const LauncherVar &vars : kLauncherVars) {
    if (env::get_int(vars.*field, lo, kMaxRanks)) return &vars;
  }
  return nullptr;
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

LaunchSettings resolve_launch_settings(const mncl_config_t &config) {
  LaunchSettings s;

  s.backend_spec = config.backend ? config.backend : env::get("MNCL_BACKEND").value_or("auto");
  if (config.backend) s.backend_origin = "config.backend";
  MNCL_CHECK(!s.backend_spec.empty(), MNCL_ERR_INVALID_ARGUMENT, "the backend name is empty");
  s.backend_host = env::get("MNCL_BACKEND_HOST").value_or("");
  s.backend_cuda = env::get("MNCL_BACKEND_CUDA").value_or("");
  s.memory = env::get("MNCL_MEMORY").value_or("auto");
  MNCL_CHECK(s.memory == "auto" || s.memory == "host" || s.memory == "cuda",
             MNCL_ERR_INVALID_ARGUMENT, "MNCL_MEMORY='%s' is not auto, host or cuda",
             s.memory.c_str());
  s.bind = env::get("MNCL_BIND").value_or("auto");
  topology::parse_bind_mode(s.bind);  // throws, naming MNCL_BIND and the bad value

  s.launched_by_mpi =
      env::raw("OMPI_COMM_WORLD_SIZE") || env::raw("PMI_SIZE") || env::raw("PMIX_RANK");

  // Size first, so the rank can be range-checked against it. MNCL_RANK/MNCL_SIZE (and the
  // config) are the user's own and win; else the launchers' (launcher_var).
  const LauncherVar *size_from = nullptr, *rank_from = nullptr;
  if (config.size != MNCL_FROM_ENV) {
    MNCL_CHECK(config.size >= 1, MNCL_ERR_INVALID_ARGUMENT,
               "config->size is %d; it must be >= 1 (or -1 for the environment)", config.size);
    s.size = config.size;
  } else if (auto size = env::get_int("MNCL_SIZE", 1, kMaxRanks)) {
    s.size = static_cast<int>(*size);
  } else {
    size_from = launcher_var(&LauncherVar::size, 1);
    s.size = size_from ? static_cast<int>(*env::get_int(size_from->size, 1, kMaxRanks)) : 1;
  }
  if (config.rank != MNCL_FROM_ENV) {
    s.rank = config.rank;
  } else if (auto rank = env::get_int("MNCL_RANK", 0, kMaxRanks)) {
    s.rank = static_cast<int>(*rank);
  } else {
    rank_from = launcher_var(&LauncherVar::rank, 0);
    s.rank = rank_from ? static_cast<int>(*env::get_int(rank_from->rank, 0, kMaxRanks)) : 0;
  }
  s.rank_origin = config.rank != MNCL_FROM_ENV ? "config->rank"
                  : rank_from                  ? rank_from->rank
                  : env::get("MNCL_RANK")      ? "MNCL_RANK"
                                               : "the default";
  const char *size_origin = config.size != MNCL_FROM_ENV ? "config->size"
                            : size_from                  ? size_from->size
                            : env::get("MNCL_SIZE")      ? "MNCL_SIZE"
                                                         : "the default";
  MNCL_CHECK(s.rank >= 0 && s.rank < s.size, MNCL_ERR_INVALID_ARGUMENT,
             "rank %d (from %s) is out of range for %d ranks (from %s)", s.rank,
             s.rank_origin.c_str(), s.size, size_origin);

  s.local_rank = static_cast<int>(
      first_int({"MNCL_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, 0,
                kMaxRanks)
          .value_or(-1));
  s.local_size = static_cast<int>(
      first_int({"MNCL_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}, 1, kMaxRanks)
          .value_or(-1));
  // The local rank picks the GPU: one past the local size is a launcher's mistake, not a device.
  MNCL_CHECK(s.local_rank < 0 || s.local_size < 0 || s.local_rank < s.local_size,
             MNCL_ERR_INVALID_ARGUMENT,
             "the local rank %d is out of range for %d local ranks (check LOCAL_RANK / "
             "LOCAL_WORLD_SIZE or MNCL_LOCAL_RANK / MNCL_LOCAL_SIZE)",
             s.local_rank, s.local_size);

  if (config.bootstrap != nullptr) {
    s.store_url = config.bootstrap;
  } else if (auto url = env::get("MNCL_STORE")) {
    s.store_url = *url;
  } else {
    auto addr = env::get("MASTER_ADDR");
    auto port = env::get_int("MASTER_PORT", 1, 65535);
    if (addr && port) {
      // torchrun takes an IPv6 MASTER_ADDR as it is; a URL needs it in brackets.
      const bool bare_ipv6 = addr->find(':') != std::string::npos && addr->front() != '[';
      s.store_url = format(bare_ipv6 ? "tcp://[%s]:%lld" : "tcp://%s:%lld", addr->c_str(),
                           static_cast<long long>(*port));
    }
  }
  // Under mpirun on a single host, no address is needed: a file store in /tmp named after the
  // Open MPI job id is private to this job and visible to all of its ranks.
  if (s.store_url.empty() && s.size > 1 && s.launched_by_mpi) {
    const char *job = env::raw("OMPI_MCA_ess_base_jobid");
    const auto local_size = env::get_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxRanks);
    if (job != nullptr && local_size && *local_size == s.size) {
      s.store_url = format("file:///tmp/mncl-%d-ompi-%s", static_cast<int>(getuid()), job);
      s.store_is_private_dir = true;
    }
  }
  MNCL_CHECK(s.size == 1 || !s.store_url.empty(), MNCL_ERR_BOOTSTRAP,
             "a job of %d ranks needs a bootstrap store: set MNCL_STORE=tcp://host:port (rank 0 "
             "listens there) or file:///shared/dir, or MASTER_ADDR and MASTER_PORT, or launch "
             "with mncl-run -n %d",
             s.size, s.size);

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

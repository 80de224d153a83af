// Resolves a communicator's settings from the caller's mncl_config_t and the launcher's
// environment (MNCL_*, torchrun, Open MPI, PMI, Slurm), validating everything up front.
#pragma once

#include <mncl/mncl.h>

#include <cstdint>
#include <string>

namespace mncl::core {

struct LaunchSettings {
  std::string backend_spec;  // "auto", "naive", "/path/libmncl-x.so", "gloo,naive"
  std::string backend_origin = "MNCL_BACKEND";  // or "config.backend" (for messages)
  // With backend_spec "auto": the user's list for one memory type, replacing the rules.
  std::string backend_host;     // MNCL_BACKEND_HOST
  std::string backend_cuda;     // MNCL_BACKEND_CUDA
  std::string memory = "auto";  // MNCL_MEMORY: auto, host or cuda (validated)
  std::string bind = "auto";    // MNCL_BIND: none, numa, core or auto (validated)
  int rank = 0;
  int size = 1;
  std::string rank_origin = "the default";  // "MNCL_RANK", "RANK", "config->rank"... (messages)
  std::string size_origin = "the default";  // "MNCL_SIZE", "WORLD_SIZE", "config->size"...
  // MNCL_LOCAL_*, else those of the launcher that gave the rank; -1: derive from hostnames.
  int local_rank = -1;
  int local_size = -1;
  std::string local_rank_origin = "MNCL_LOCAL_RANK";  // or the launcher's variable (messages)
  std::string store_url;                              // empty: in-process store (only for size 1)
  bool store_is_private_dir = false;  // a file store folder MNCL made up (removed at the end)
  bool store_from_master = false;     // store_url is MASTER_ADDR:MASTER_PORT (no one named one)
  int64_t timeout_ms = 300000;
  int device = -1;
  int64_t lane_linger_us = 50;  // MNCL_LANE_LINGER_US
  bool debug_checks = false;    // MNCL_DEBUG_CHECKS
  // The rank and size are Open MPI's, PMI's, or PMIx's under srun (not merely that such
  // variables are set).
  bool launched_by_mpi = false;
  // The id of this job that the launcher which gave the rank and size puts in every rank's
  // environment ("slurm:<job>.<step>", "ompi:<jobid>...", "pmix:<namespace>", "torchrun:<run
  // id>"); empty when the rank is the user's own (MNCL_RANK, the config, mncl-run) or the
  // launcher says none. The TCP store's token where MNCL_STORE_TOKEN is unset: a rank of
  // another job (or a stale one of an earlier job) on the same address is refused, not joined.
  std::string job_token;
};

// Copies min(caller size, own size) of a caller's config (NULL: all defaults) after checking
// struct_size and magic; rejects a non-zero tail this library does not understand.
mncl_config_t read_user_config(const mncl_config_t *user);
// Applies the documented precedence: config field, then environment, then default, and checks
// every core setting (a malformed MNCL_STORE url, MNCL_LANE_LINGER_US, MNCL_DEBUG_CHECKS: each
// MNCL_ERR_INVALID_ARGUMENT naming it; keyword values in any case). Throws
// MNCL_ERR_INVALID_ARGUMENT when two launchers that each set a rank and a size disagree (and
// MNCL_RANK/MNCL_SIZE do not settle it), MNCL_ERR_BOOTSTRAP when a job of several ranks has no
// store, or only torchrun's agent's (TORCHELASTIC_USE_AGENT_STORE).
LaunchSettings resolve_launch_settings(const mncl_config_t &config);
// A backend list with its "auto" entries in lower case ("AUTO,gloo" -> "auto,gloo"); plugin
// names are matched in any case by the loader (loader::load) and the selection.
std::string normalized_backend_list(const std::string &spec);

}  // namespace mncl::core

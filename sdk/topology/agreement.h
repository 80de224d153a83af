// Agreeing on one backend across ranks. Each rank decides locally (backend_rules.h, or the
// user's MNCL_BACKEND), publishes a RankChoice through the bootstrap store, reads everyone's,
// and runs agree() on the same list in the same order: every rank reaches the same answer, or
// the same error, without another round trip.
//
//   every rank chose the same backend      -> that backend.
//   choices differ and some rank was told  -> error naming each rank's choice and how it was
//     what to use (MNCL_BACKEND, config,      made: a forced choice is never silently
//     MNCL_BACKEND_HOST/CUDA)                 overridden by the other ranks' preference.
//   choices differ, every rank chose auto  -> the backend every rank can use that is best in
//     (their machines differ: a node            the worst rank's eyes (smallest worst position
//     without GPUs, without InfiniBand)         in the ranked lists, then smallest sum, then
//                                               name); none common -> error listing each rank.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace mncl::topology {

struct RankChoice {
  std::string backend;              // this rank's own choice
  bool forced = false;              // chosen by the user, not by the rules
  std::string how;                  // "auto", "MNCL_BACKEND=naive", "MNCL_BACKEND_HOST=gloo"
  std::vector<std::string> ranked;  // usable backends, most preferred first (auto only)
  // The build of each backend in `ranked` this rank loaded: "plugin ABI v5, collectives 0x..,
  // dtypes 0x.., ops 0x..". The core runs a call natively or through a fallback by these, so
  // ranks that loaded different builds (another libmncl-<name>.so, MNCL_PLUGIN_ABI_MAX) would
  // run one call two ways and wait on each other until the timeout.
  std::map<std::string, std::string> builds;
};

// A text record for the store, and back. parse() throws mncl::Error(MNCL_ERR_BOOTSTRAP) on a
// record this code did not write.
std::string serialize(const RankChoice &choice);
RankChoice parse_choice(const std::string &record);

struct Agreement {
  std::string backend;  // "" on error
  std::string why;      // how the ranks agreed (for the log)
  std::string error;    // why they could not, naming each rank's choice
};

// The backend every rank runs, and the same build of it everywhere.
Agreement agree(const std::vector<RankChoice> &ranks);
// The name alone (agree() without the builds' check).
Agreement agree_on_name(const std::vector<RankChoice> &ranks);

}  // namespace mncl::topology

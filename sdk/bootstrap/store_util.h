// Helpers shared by the store implementations.
#pragma once

#include <chrono>
#include <string>

#include "bootstrap/store.h"
#include "common/error.h"

namespace mncl::bootstrap {

// Throws MNCL_ERR_ABORTED ("... aborted while <what>") if opts.aborted is raised.
inline void throw_if_aborted(const WaitOptions &opts, const std::string &what) {
  if (opts.aborted != nullptr && opts.aborted->load(std::memory_order_acquire)) {
    throw Error(MNCL_ERR_ABORTED, "the communicator was aborted while " + what);
  }
}

// Store::erase_prefix's argument: an empty prefix would erase every key of the store.
inline void check_erase_prefix(const std::string &prefix) {
  MNCL_CHECK(!prefix.empty(), MNCL_ERR_INVALID_ARGUMENT,
             "store: erase_prefix needs a prefix (an empty one would erase every key)");
}

// For messages: "3.0 s".
inline double seconds(std::chrono::milliseconds duration) {
  return duration.count() / 1000.0;
}

}  // namespace mncl::bootstrap

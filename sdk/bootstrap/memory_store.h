// An in-process store for single-rank communicators that were given no store address: lets a
// 1-rank job (and every plugin's rendezvous code path) run without any networking.
#pragma once

#include "bootstrap/store.h"

namespace mncl::bootstrap {

std::shared_ptr<Store> make_memory_store();

}  // namespace mncl::bootstrap

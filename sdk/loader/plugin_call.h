// Calls into a plugin's table, made safe against the plugin mistakes the ABI forbids but a
// plugin built without the kit's guard makes: a C++ exception escaping an entry (it killed the
// process from a lane's thread: std::terminate), a status that is no mncl_status_t (-1, which
// reached the application as is), MNCL_IN_PROGRESS where only a final status means anything (a
// blocking call returned it, and a caller would have kept waiting), and a failure without a
// message (the error text ended in ": ").
#pragma once

#include <cxxabi.h>
#include <mncl/mncl.h>

#include <exception>
#include <string>

#include "common/error.h"

namespace mncl::loader {

// The text of a failure the plugin gave no words for.
inline const char *no_message_text() {
  return "(no message: the backend set none with host->set_error)";
}

// The status `entry` of plugin `backend` returned (or the exception it threw), made a valid
// final status: a bad one becomes MNCL_ERR_INTERNAL, with a last error that names the backend,
// the entry and what it did; a failure without a message gets no_message_text() as its last
// error. f runs the entry and returns its status; the thread's last error is the plugin's
// message (host->set_error), as the caller left it before the call.
// threw (optional): set when the entry threw, which leaves the plugin's state unknown (the
// caller then gives up on the communicator), unlike a bad status.
template <typename F>
mncl_status_t call_plugin(const std::string &backend, const char *entry, F &&f,
                          bool *threw = nullptr) {
  mncl_status_t status = MNCL_ERR_INTERNAL;
  std::string thrown;
  try {
    status = f();
  } catch (::abi::__forced_unwind &) {
    throw;  // thread cancellation: never swallowed
  } catch (const std::exception &e) {
    thrown = std::string("a C++ exception (") + e.what() + ")";
  } catch (...) {
    thrown = "a C++ exception that is no std::exception";
  }
  if (threw != nullptr) *threw = !thrown.empty();
  if (!thrown.empty()) {
    set_last_error(
        format("backend '%s': %s threw %s, which the plugin ABI forbids (a plugin "
               "reports failures as a status and host->set_error)",
               backend.c_str(), entry, thrown.c_str()));
    return MNCL_ERR_INTERNAL;
  }
  if (status < MNCL_OK || status >= MNCL_IN_PROGRESS) {
    const std::string said = last_error();
    set_last_error(
        format("backend '%s': %s returned %d, which is no final mncl_status_t (0 to "
               "%d)%s%s",
               backend.c_str(), entry, static_cast<int>(status),
               static_cast<int>(MNCL_ERR_INTERNAL), said.empty() ? "" : ": ", said.c_str()));
    return MNCL_ERR_INTERNAL;
  }
  if (status != MNCL_OK && *last_error() == '\0') set_last_error(no_message_text());
  return status;
}

}  // namespace mncl::loader

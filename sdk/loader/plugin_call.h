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

namespace mncl::loader {

// The text of a failure the plugin gave no words for.
inline const char *no_message_text() {
  return "(no message: the backend set none with host->set_error)";
}

// Out of line, off the hot path: the last error for an entry that threw (what: the
// std::exception's text, or nullptr), MNCL_ERR_INTERNAL.
mncl_status_t plugin_threw(const std::string &backend, const char *entry, const char *what);
// Out of line: a failed status made a valid final one (see call_plugin).
mncl_status_t plugin_failed(const std::string &backend, const char *entry, mncl_status_t status);

// The status `entry` of plugin `backend` returned (or the exception it threw), made a valid
// final status: a bad one becomes MNCL_ERR_INTERNAL, with a last error that names the backend,
// the entry and what it did; a failure without a message gets no_message_text() as its last
// error. f runs the entry and returns its status; the thread's last error is the plugin's
// message (host->set_error), as the caller left it before the call. threw (optional): set when
// the entry threw, which leaves the plugin's state unknown (the caller then gives up on the
// communicator), unlike a bad status. The success path costs one compare.
template <typename F>
mncl_status_t call_plugin(const std::string &backend, const char *entry, F &&f,
                          bool *threw = nullptr) {
  mncl_status_t status;
  try {
    status = f();
  } catch (::abi::__forced_unwind &) {
    throw;  // thread cancellation: never swallowed
  } catch (const std::exception &e) {
    if (threw != nullptr) *threw = true;
    return plugin_threw(backend, entry, e.what());
  } catch (...) {
    if (threw != nullptr) *threw = true;
    return plugin_threw(backend, entry, nullptr);
  }
  if (threw != nullptr) *threw = false;
  if (__builtin_expect(status == MNCL_OK, 1)) return MNCL_OK;
  return plugin_failed(backend, entry, status);
}

}  // namespace mncl::loader

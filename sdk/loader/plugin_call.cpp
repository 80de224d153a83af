#include "loader/plugin_call.h"

#include "common/error.h"

namespace mncl::loader {

mncl_status_t plugin_threw(const std::string &backend, const char *entry, const char *what) {
  const std::string thrown = what != nullptr
                                 ? std::string("a C++ exception (") + what + ")"
                                 : std::string("a C++ exception that is no std::exception");
  set_last_error(
      format("backend '%s': %s threw %s, which the plugin ABI forbids (a plugin "
             "reports failures as a status and host->set_error)",
             backend.c_str(), entry, thrown.c_str()));
  return MNCL_ERR_INTERNAL;
}

mncl_status_t plugin_failed(const std::string &backend, const char *entry, mncl_status_t status) {
  if (status < MNCL_OK || status >= MNCL_IN_PROGRESS) {
    const std::string said = last_error();
    set_last_error(
        format("backend '%s': %s returned %d, which is no final mncl_status_t (0 to "
               "%d)%s%s",
               backend.c_str(), entry, static_cast<int>(status),
               static_cast<int>(MNCL_ERR_INTERNAL), said.empty() ? "" : ": ", said.c_str()));
    return MNCL_ERR_INTERNAL;
  }
  if (*last_error() == '\0') set_last_error(no_message_text());
  return status;
}

}  // namespace mncl::loader

#include "common/error.h"

#include <cstdarg>
#include <cstdio>

namespace mncl {

namespace {
thread_local std::string t_last_error;
}

void set_last_error(const std::string &message) {
  if (message.empty() && t_last_error.empty()) return;  // the hot path clears before each call
  t_last_error = message;
}
const char *last_error() {
  return t_last_error.c_str();
}

const char *status_name(mncl_status_t status) {
  switch (status) {
    case MNCL_OK:
      return "MNCL_OK";
    case MNCL_ERR_INVALID_ARGUMENT:
      return "MNCL_ERR_INVALID_ARGUMENT";
    case MNCL_ERR_NOT_SUPPORTED:
      return "MNCL_ERR_NOT_SUPPORTED";
    case MNCL_ERR_TIMEOUT:
      return "MNCL_ERR_TIMEOUT";
    case MNCL_ERR_REMOTE:
      return "MNCL_ERR_REMOTE";
    case MNCL_ERR_ABORTED:
      return "MNCL_ERR_ABORTED";
    case MNCL_ERR_PLUGIN:
      return "MNCL_ERR_PLUGIN";
    case MNCL_ERR_BOOTSTRAP:
      return "MNCL_ERR_BOOTSTRAP";
    case MNCL_ERR_SYSTEM:
      return "MNCL_ERR_SYSTEM";
    case MNCL_ERR_INTERNAL:
      return "MNCL_ERR_INTERNAL";
    case MNCL_IN_PROGRESS:
      return "MNCL_IN_PROGRESS";
  }
  return "MNCL_ERR_UNKNOWN";
}

std::string format(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

}  // namespace mncl

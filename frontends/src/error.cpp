#include "mncl/frontends/error.hpp"

namespace mncl {

void throw_status(mncl_status_t status, const std::string &context) {
  // Read the message first: any later MNCL call on this thread would replace it.
  const char *last = mncl_last_error();
  std::string what = context + ": " + mncl_status_string(status);
  if (last && *last) what += std::string(": ") + last;
  throw_error(status, what);
}

void throw_error(mncl_status_t status, const std::string &what) {
  switch (status) {
    case MNCL_ERR_INVALID_ARGUMENT:
      throw InvalidArgument(what);
    case MNCL_ERR_NOT_SUPPORTED:
      throw NotSupported(what);
    case MNCL_ERR_TIMEOUT:
      throw TimeoutError(what);
    case MNCL_ERR_REMOTE:
      throw RemoteError(what);
    case MNCL_ERR_ABORTED:
      throw AbortedError(what);
    case MNCL_ERR_PLUGIN:
      throw PluginError(what);
    case MNCL_ERR_BOOTSTRAP:
      throw BootstrapError(what);
    case MNCL_ERR_SYSTEM:
      throw SystemError(what);
    case MNCL_OK:
    case MNCL_IN_PROGRESS:
    case MNCL_ERR_INTERNAL:
      break;
  }
  // MNCL_OK/IN_PROGRESS here, or a status newer than this header: a bug either way.
  throw InternalError(what);
}

}  // namespace mncl

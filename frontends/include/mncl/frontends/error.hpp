// The C++ face of MNCL's status codes: every failed C call becomes an exception whose type names
// the status, and whose message holds the call and mncl_last_error().
//
//   try { comm.allreduce(grads); }
//   catch (const mncl::TimeoutError &e) { ... a peer went silent ... }
//   catch (const mncl::Error &e) { std::cerr << e.what() << " (" << e.status() << ")\n"; }
#ifndef MNCL_FRONTENDS_ERROR_HPP
#define MNCL_FRONTENDS_ERROR_HPP

#include <mncl/mncl.h>

#include <stdexcept>
#include <string>

namespace mncl {

// Base of every exception the frontends throw; status() is the MNCL status it stands for.
class Error : public std::runtime_error {
 public:
  Error(mncl_status_t status, const std::string &what)
      : std::runtime_error(what), status_(status) {}
  mncl_status_t status() const noexcept { return status_; }

 private:
  mncl_status_t status_;
};

// One class per C status (MNCL_ERR_*), so callers catch exactly what they can handle.
#define MNCL_FRONTENDS_DEFINE_ERROR(Name, Status)                   \
  class Name : public Error {                                       \
   public:                                                          \
    explicit Name(const std::string &what) : Error(Status, what) {} \
  }
MNCL_FRONTENDS_DEFINE_ERROR(InvalidArgument, MNCL_ERR_INVALID_ARGUMENT);
MNCL_FRONTENDS_DEFINE_ERROR(NotSupported, MNCL_ERR_NOT_SUPPORTED);
MNCL_FRONTENDS_DEFINE_ERROR(TimeoutError, MNCL_ERR_TIMEOUT);
MNCL_FRONTENDS_DEFINE_ERROR(RemoteError, MNCL_ERR_REMOTE);
MNCL_FRONTENDS_DEFINE_ERROR(AbortedError, MNCL_ERR_ABORTED);
MNCL_FRONTENDS_DEFINE_ERROR(PluginError, MNCL_ERR_PLUGIN);
MNCL_FRONTENDS_DEFINE_ERROR(BootstrapError, MNCL_ERR_BOOTSTRAP);
MNCL_FRONTENDS_DEFINE_ERROR(SystemError, MNCL_ERR_SYSTEM);
MNCL_FRONTENDS_DEFINE_ERROR(InternalError, MNCL_ERR_INTERNAL);
#undef MNCL_FRONTENDS_DEFINE_ERROR

// Frontend-only failures that have no C call behind them.
// Bytes that do not decode as the expected type (truncated, trailing data, absurd lengths).
class SerializationError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};
// A checkpoint could not be written or read back.
class CheckpointError : public SystemError {
 public:
  using SystemError::SystemError;
};

// Throws the exception for `status` (which must not be MNCL_OK), with `context` (usually the C
// function's name) and the thread's mncl_last_error() in the message.
[[noreturn]] void throw_status(mncl_status_t status, const std::string &context);
// Throws the exception for `status` with `what` as its whole message (InternalError for MNCL_OK
// and statuses newer than this header).
[[noreturn]] void throw_error(mncl_status_t status, const std::string &what);

// The one check every wrapper does after a C call.
inline void check(mncl_status_t status, const char *context) {
  if (status != MNCL_OK) throw_status(status, context);
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_ERROR_HPP

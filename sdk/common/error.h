// Internal error type of the SDK. Everything inside libmncl reports failures by throwing
// mncl::Error; the C API layer (api/) catches it, stores the message as the thread's last error
// and returns the status. Nothing of this header crosses the ABI.
#pragma once

#include <mncl/mncl.h>

#include <stdexcept>
#include <string>

namespace mncl {

class Error : public std::runtime_error {
 public:
  Error(mncl_status_t status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  mncl_status_t status() const { return status_; }

 private:
  mncl_status_t status_;
};

// Thread-local last error of the C API (mncl_last_error()).
void set_last_error(const std::string &message);
const char *last_error();

// "MNCL_ERR_TIMEOUT" style name of a status, without explanation.
const char *status_name(mncl_status_t status);

// Formats like printf into a std::string.
std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace mncl

// Throws mncl::Error(status, printf-formatted message) unless cond holds.
#define MNCL_CHECK(cond, status, ...)                                        \
  do {                                                                       \
    if (!(cond)) throw ::mncl::Error((status), ::mncl::format(__VA_ARGS__)); \
  } while (0)

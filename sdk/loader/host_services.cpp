// The services every plugin receives at init(): logging, error messages and configuration,
// all routed through the core so they share its log, last-error slot and env table.
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "loader/plugin_loader.h"

namespace mncl::loader {

namespace {

// The calling plugin's name, for the log tag: one host table serves every plugin and log() has
// no context argument, so ask the dynamic linker which libmncl-<name>.so the call came from.
std::string caller_tag(const void *return_address) {
  Dl_info info;
  if (return_address != nullptr && dladdr(return_address, &info) != 0 &&
      info.dli_fname != nullptr) {
    const char *base = std::strrchr(info.dli_fname, '/');
    std::string file = base ? base + 1 : info.dli_fname;
    const std::string prefix = "libmncl-", suffix = ".so";
    if (file.size() > prefix.size() + suffix.size() &&
        file.compare(0, prefix.size(), prefix) == 0 &&
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
    }
  }
  return "plugin";
}

void host_log(int32_t level, const char *file, int32_t line, const char *fmt, ...) {
  if (level <= MNCL_LOG_NONE || level > log::level() || fmt == nullptr) return;
  const std::string tag = caller_tag(__builtin_return_address(0));
  va_list args;
  va_start(args, fmt);
  log::vwrite_tagged(level, tag.c_str(), file ? file : "?", line, fmt, args);
  va_end(args);
}

void host_set_error(const char *fmt, ...) {
  if (fmt == nullptr) {
    set_last_error("");
    return;
  }
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string message(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(message.data(), message.size() + 1, fmt, args);
  va_end(args);
  set_last_error(message);
}

const char *host_get_env(const char *name) {
  // The ABI promises the string lives until the next call, so one slot per thread suffices.
  thread_local std::string value;
  if (name == nullptr) return nullptr;
  const auto v = env::get(name);
  if (!v) return nullptr;
  value = *v;
  return value.c_str();
}

}  // namespace

const mncl_host_v1_t *host_services() {
  // log::level() is read once per process, so the snapshot in log_level stays true.
  static const mncl_host_v1_t host = {sizeof(mncl_host_v1_t), MNCL_VERSION, log::level(), &host_log,
                                      &host_set_error,        &host_get_env};
  return &host;
}

}  // namespace mncl::loader

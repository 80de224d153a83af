// Leveled logging to stderr (or MNCL_DEBUG_FILE), one line per message:
//   [mncl 12345 r0 INFO sdk/loader/plugin_loader.cpp:88] loaded naive 0.1.0 (ABI v1)
// The level comes from MNCL_DEBUG=none|error|warn|info|trace (default warn).
#pragma once

#include <mncl/mncl_plugin_v1.h>

#include <cstdarg>

namespace mncl::log {

enum Level : int {
  kNone = MNCL_LOG_NONE,
  kError = MNCL_LOG_ERROR,
  kWarn = MNCL_LOG_WARN,
  kInfo = MNCL_LOG_INFO,
  kTrace = MNCL_LOG_TRACE
};

// Current threshold (reads MNCL_DEBUG once, lazily).
int level();
// Tags later lines with this process's rank in the world communicator (-1: unknown).
void set_rank(int rank);
void write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// Same, with an extra tag (the plugin's name) in front of the message.
int parse_level(const char *text);  // -1 if not a level name
void vwrite_tagged(int level, const char *tag, const char *file, int line, const char *fmt,
                   va_list args);

}  // namespace mncl::log

#define MNCL_LOG(lvl, ...)                                                                         \
  do {                                                                                             \
    if ((lvl) <= ::mncl::log::level()) ::mncl::log::write((lvl), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define MNCL_ERROR(...) MNCL_LOG(::mncl::log::kError, __VA_ARGS__)
#define MNCL_WARN(...) MNCL_LOG(::mncl::log::kWarn, __VA_ARGS__)
#define MNCL_INFO(...) MNCL_LOG(::mncl::log::kInfo, __VA_ARGS__)
#define MNCL_TRACE(...) MNCL_LOG(::mncl::log::kTrace, __VA_ARGS__)

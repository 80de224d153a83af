#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "common/env.h"

namespace mncl::log {

namespace {
std::atomic<int> g_level{-1};
std::atomic<int> g_rank{-1};

const char *level_name(int level) {
  switch (level) {
    case kError:
      return "ERROR";
    case kWarn:
      return "WARN";
    case kInfo:
      return "INFO";
    case kTrace:
      return "TRACE";
  }
  return "?";
}

// Strips the build machine's source prefix so lines show "sdk/loader/x.cpp".
const char *short_path(const char *file) {
  for (const char *marker : {"/sdk/", "/plugins/", "/tests/", "/frontends/", "/bench/"}) {
    if (const char *p = std::strstr(file, marker)) return p + 1;
  }
  return file;
}
}  // namespace

int parse_level(const char *text) {
  if (text == nullptr || *text == '\0') return kWarn;
  const std::string v = env::lower(text);  // any case: MNCL_DEBUG=INFO as NCCL_DEBUG=INFO
  if (v == "none" || v == "0") return kNone;
  if (v == "error" || v == "1") return kError;
  if (v == "warn" || v == "2") return kWarn;
  if (v == "info" || v == "3") return kInfo;
  if (v == "trace" || v == "4") return kTrace;
  return -1;
}

int level() {
  int lvl = g_level.load(std::memory_order_relaxed);
  if (lvl < 0) {
    lvl = parse_level(env::raw("MNCL_DEBUG"));
    if (lvl < 0) {
      std::fprintf(stderr,
                   "[mncl WARN] MNCL_DEBUG='%s' is not none|error|warn|info|trace; "
                   "using warn\n",
                   env::raw("MNCL_DEBUG"));
      lvl = kWarn;
    }
    g_level.store(lvl, std::memory_order_relaxed);
  }
  return lvl;
}

void set_rank(int rank) {
  g_rank.store(rank, std::memory_order_relaxed);
}

namespace {
// Where lines go: stderr, or the file MNCL_DEBUG_FILE names (appended; %h: the host name,
// %p: the process id, %%: a '%', as NCCL_DEBUG_FILE), opened at the first line.
FILE *sink() {
  static FILE *const out = [] {
    const char *pattern = env::raw("MNCL_DEBUG_FILE");
    if (pattern == nullptr || *pattern == '\0') return stderr;
    std::string path;
    for (const char *c = pattern; *c != '\0'; ++c) {
      if (c[0] == '%' && c[1] == 'h') {
        char host[256] = "host";
        gethostname(host, sizeof host - 1);
        path += host;
      } else if (c[0] == '%' && c[1] == 'p') {
        path += std::to_string(getpid());
      } else if (c[0] == '%' && c[1] == '%') {
        path += '%';
      } else {
        path += *c;
        continue;
      }
      ++c;
    }
    FILE *file = std::fopen(path.c_str(), "ae");
    if (file == nullptr) {
      std::fprintf(stderr, "[mncl WARN] MNCL_DEBUG_FILE: cannot open '%s': %s; logging to stderr\n",
                   path.c_str(), std::strerror(errno));
      return stderr;
    }
    std::setvbuf(file, nullptr, _IOLBF, 0);  // whole lines, as stderr's
    return file;
  }();
  return out;
}
}  // namespace

void vwrite_tagged(int lvl, const char *tag, const char *file, int line, const char *fmt,
                   va_list args) {
  char message[2048];
  std::vsnprintf(message, sizeof message, fmt, args);
  char rank[16] = "";
  if (int r = g_rank.load(std::memory_order_relaxed); r >= 0) {
    std::snprintf(rank, sizeof rank, " r%d", r);
  }
  // A plugin's message that already starts with its name ("shm: rank 1 ...", "gloo 0.1.0 ...")
  // is not tagged a second time.
  if (tag != nullptr) {
    const size_t n = std::strlen(tag);
    if (std::strncmp(message, tag, n) == 0 && (message[n] == ':' || message[n] == ' ')) {
      tag = nullptr;
    }
  }
  // One fprintf per line so concurrent ranks and threads do not interleave within a line.
  std::fprintf(sink(), "[mncl %d%s %s %s:%d] %s%s%s\n", static_cast<int>(getpid()), rank,
               level_name(lvl), short_path(file), line, tag ? tag : "", tag ? ": " : "", message);
}

void write(int lvl, const char *file, int line, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vwrite_tagged(lvl, nullptr, file, line, fmt, args);
  va_end(args);
}

}  // namespace mncl::log

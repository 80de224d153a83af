// MNCL_DEBUG's values: the level names in any case (NCCL_DEBUG=INFO habits) and the digits;
// anything else is refused (-1: level() then warns once and keeps warn). MNCL_DEBUG_FILE: the
// lines go to that file, %h and %p expanded. A plugin's tag is not repeated.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/log.h"

namespace mncl::log {
namespace {

TEST(LogLevel, NamesInAnyCaseAndDigits) {
  EXPECT_EQ(parse_level("none"), kNone);
  EXPECT_EQ(parse_level("ERROR"), kError);
  EXPECT_EQ(parse_level("Warn"), kWarn);
  EXPECT_EQ(parse_level("INFO"), kInfo);
  EXPECT_EQ(parse_level("tRaCe"), kTrace);
  EXPECT_EQ(parse_level("3"), kInfo);
  EXPECT_EQ(parse_level(nullptr), kWarn);
  EXPECT_EQ(parse_level(""), kWarn);
}

TEST(LogLevel, OtherValuesRefused) {
  EXPECT_EQ(parse_level("verbose"), -1);
  EXPECT_EQ(parse_level("info "), -1);
  EXPECT_EQ(parse_level("5"), -1);
}

void tagged(const char *tag, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vwrite_tagged(kWarn, tag, __FILE__, __LINE__, fmt, args);
  va_end(args);
}

// Runs `lines` in a child process (the sink is chosen at the first line a process writes) with
// MNCL_DEBUG_FILE=<temp dir>/log.%h.%p.%% and returns what the file holds.
template <typename Lines>
std::string child_log(Lines lines) {
  char dir[] = "/tmp/mncl-log-test-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  const pid_t child = fork();
  EXPECT_GE(child, 0);
  if (child == 0) {
    setenv("MNCL_DEBUG_FILE", (std::string(dir) + "/log.%h.%p.%%").c_str(), 1);
    lines();
    _exit(0);
  }
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  const std::string path = std::string(dir) + "/log." + host + "." + std::to_string(child) + ".%";
  std::ifstream in(path);
  EXPECT_TRUE(in) << path << " was not written";
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  rmdir(dir);
  return text.str();
}

TEST(LogFile, LinesGoToTheNamedFileWithHostAndPid) {
  const std::string text =
      child_log([] { write(kWarn, __FILE__, __LINE__, "a warning for the file"); });
  EXPECT_NE(text.find("WARN"), std::string::npos) << text;
  EXPECT_NE(text.find("a warning for the file"), std::string::npos) << text;
}

// A plugin's lines carry its name once: "shm: rank 1", never "shm: shm: rank 1".
TEST(LogTag, APluginsNameIsNotRepeated) {
  const std::string text = child_log([] {
    tagged("shm", "shm: rank %d mapped", 1);
    tagged("gloo", "gloo 0.1.0: CPU collectives");
    tagged("shm", "rank %d alone", 2);
    tagged("shm", "shmem is not shm");
  });
  EXPECT_NE(text.find("] shm: rank 1 mapped\n"), std::string::npos) << text;
  EXPECT_NE(text.find("] gloo 0.1.0: CPU collectives\n"), std::string::npos) << text;
  EXPECT_NE(text.find("] shm: rank 2 alone\n"), std::string::npos) << text;
  EXPECT_NE(text.find("] shm: shmem is not shm\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("shm: shm:"), std::string::npos) << text;
}

}  // namespace
}  // namespace mncl::log

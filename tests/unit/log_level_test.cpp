// MNCL_DEBUG's values: the level names in any case (NCCL_DEBUG=INFO habits) and the digits;
// anything else is refused (-1: level() then warns once and keeps warn). MNCL_DEBUG_FILE: the
// lines go to that file, %h and %p expanded.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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

// In a child process: the sink is chosen at the first line a process writes.
TEST(LogFile, LinesGoToTheNamedFileWithHostAndPid) {
  char dir[] = "/tmp/mncl-log-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("MNCL_DEBUG_FILE", (std::string(dir) + "/log.%h.%p.%%").c_str(), 1);
    write(kWarn, __FILE__, __LINE__, "a warning for the file");
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  const std::string path = std::string(dir) + "/log." + host + "." + std::to_string(child) + ".%";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " was not written";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("WARN"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("a warning for the file"), std::string::npos) << text.str();
  std::remove(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace mncl::log

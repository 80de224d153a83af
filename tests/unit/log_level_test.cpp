// MNCL_DEBUG's values: the level names in any case (NCCL_DEBUG=INFO habits) and the digits;
// anything else is refused (-1: level() then warns once and keeps warn).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace mncl::log

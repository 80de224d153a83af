// For tests of the core's internals (linked against its objects): expecting an mncl::Error.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace mncl::testing {

// Runs f, expecting mncl::Error with status; returns its message ("" and a failure otherwise).
template <typename F>
std::string error_of(F &&f, mncl_status_t status) {
  try {
    f();
  } catch (const Error &e) {
    EXPECT_EQ(status_name(e.status()), std::string(status_name(status))) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an mncl::Error " << status_name(status);
  return "";
}

}  // namespace mncl::testing

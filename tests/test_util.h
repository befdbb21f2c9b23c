// Helpers shared by the tests: catching an h2::Error and checking its code and message.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace h2::testing_util {

// Runs `fn`, expects an h2::Error with `code`, and returns its message ("" and a test failure otherwise).
template <typename Fn>
std::string error_of(Fn&& fn, ErrorCode code) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no h2::Error was raised";
  return "";
}

}  // namespace h2::testing_util

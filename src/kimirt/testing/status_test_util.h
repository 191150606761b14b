// Assertions on kimirt::Status for the tests: that a call failed, and that its message names
// every part the test expects (a tensor, a field, a path), so a test pins the message's content
// without pinning its exact wording.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kimirt/core/status.h"

// Asserts `st_expr` is an error whose message contains every one of the remaining arguments.
#define EXPECT_ERROR_HAS(st_expr, ...)                                  \
  do {                                                                  \
    const ::kimirt::Status _st = (st_expr);                             \
    ASSERT_FALSE(_st.ok()) << "expected an error";                      \
    const std::vector<std::string> _parts{__VA_ARGS__};                 \
    for (const std::string& _part : _parts) {                           \
      EXPECT_NE(_st.message().find(_part), std::string::npos)           \
          << "missing \"" << _part << "\" in: " << _st.message();       \
    }                                                                   \
  } while (0)

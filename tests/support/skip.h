// Visible skips for Catch2 v2, which has no SKIP of its own.
//
// CKPT_SKIP(message) warns and ends the test case; the test binary then
// exits with kSkipReturnCode when nothing failed, and CMake registers that
// code as ctest's SKIP_RETURN_CODE, so ctest lists the test as "Skipped"
// (with the reason in its output) instead of counting it as passed.
#pragma once

#include <catch2/catch.hpp>

namespace ckpt::testing {

inline constexpr int kSkipReturnCode = 77;

// Set by CKPT_SKIP; read by tests/main.cc.
inline bool& SkipRequested() {
  static bool skipped = false;
  return skipped;
}

}  // namespace ckpt::testing

#define CKPT_SKIP(message)                         \
  do {                                             \
    WARN("skipped: " << message);                  \
    ::ckpt::testing::SkipRequested() = true;       \
    return;                                        \
  } while (0)

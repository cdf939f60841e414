// The Catch2 main shared by every test binary: exits with kSkipReturnCode
// when a test skipped itself and nothing failed (see support/skip.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/skip.h"

int main(int argc, char** argv) {
  const int result = Catch::Session().run(argc, argv);
  if (result == 0 && ckpt::testing::SkipRequested()) {
    return ckpt::testing::kSkipReturnCode;
  }
  return result;
}

// What the integration tests look for in a daemon's files: a file's bytes,
// and a file that appears within a bound (a COMMIT another process
// writes in the background).
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace ckpt::testing {

// The whole file; fails the test if it cannot be opened.
inline std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Waits up to `timeout` for `path` to exist; whether it does.
inline bool Appears(const std::filesystem::path& path, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::filesystem::exists(path);
}

}  // namespace ckpt::testing

// Test support for the daemon's lifecycle tests: its log, its config file.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "integration/daemon_fixture.h"

namespace ckpt::testing {

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

inline std::string DaemonLog(const DaemonProcess& daemon) {
  return ReadText(daemon.dir() + "/ckptd.log");
}

// Waits up to `timeout_ms` for the daemon's log to hold `needle` `times`
// times; true once it does.
inline bool WaitForLog(const DaemonProcess& daemon, const std::string& needle,
                       int timeout_ms, int times = 1) {
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    const std::string log = DaemonLog(daemon);
    int count = 0;
    for (size_t at = log.find(needle); at != std::string::npos;
         at = log.find(needle, at + 1)) {
      ++count;
    }
    if (count >= times) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace ckpt::testing

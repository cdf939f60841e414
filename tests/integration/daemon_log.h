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
#include "support/logfmt.h"

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

// The log as written (logfmt lines).
inline std::string DaemonLog(const DaemonProcess& daemon) {
  return ReadText(daemon.dir() + "/ckptd.log");
}

// The `msg` of every line of the log, decoded, one per line.
inline std::string DaemonMessages(const DaemonProcess& daemon) {
  std::string messages;
  for (const LogfmtFields& line : ParseLog(DaemonLog(daemon))) {
    messages += Field(line, "msg");
    messages += '\n';
  }
  return messages;
}

// Waits up to `timeout_ms` for `times` lines of the daemon's log to pass
// `match`; true once they do.
template <typename Match>
bool WaitForLines(const DaemonProcess& daemon, Match match, int timeout_ms,
                  int times) {
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    int count = 0;
    for (const LogfmtFields& line : ParseLog(DaemonLog(daemon))) count += match(line);
    if (count >= times) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Lines with every field of `want` (Matches).
inline bool WaitForLog(const DaemonProcess& daemon, const LogfmtFields& want,
                       int timeout_ms, int times = 1) {
  return WaitForLines(
      daemon, [&](const LogfmtFields& line) { return Matches(line, want); },
      timeout_ms, times);
}

// Lines whose message contains `needle`.
inline bool WaitForLog(const DaemonProcess& daemon, const std::string& needle,
                       int timeout_ms, int times = 1) {
  return WaitForLines(
      daemon,
      [&](const LogfmtFields& line) {
        return absl::StrContains(Field(line, "msg"), needle);
      },
      timeout_ms, times);
}

}  // namespace ckpt::testing

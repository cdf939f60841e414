#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <ctime>
#include <string>

namespace ckpt {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
constexpr const char* kLevelNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level; }

void LogLine(LogLevel level, absl::string_view message) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  char stamp[32];
  strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  std::string line = absl::StrCat(stamp, ".", now.tv_nsec / 1000000, "Z ",
                                  kLevelNames[static_cast<int>(level)], " ",
                                  message, "\n");
  // One write per line keeps lines from different threads whole; a failed
  // log write has nowhere to be reported, so it is dropped.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace ckpt

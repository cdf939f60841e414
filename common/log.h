// A small leveled logger writing one line per message to stderr (journald
// picks it up under systemd). Thread-safe: each line is one write(2).
#pragma once

#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"

namespace ckpt {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. Default: kInfo.
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, absl::string_view message);

template <typename... Args>
void Log(LogLevel level, const Args&... args) {
  if (LogEnabled(level)) LogLine(level, absl::StrCat(args...));
}
template <typename... Args>
void LogInfo(const Args&... args) { Log(LogLevel::kInfo, args...); }
template <typename... Args>
void LogWarning(const Args&... args) { Log(LogLevel::kWarning, args...); }
template <typename... Args>
void LogError(const Args&... args) { Log(LogLevel::kError, args...); }
template <typename... Args>
void LogDebug(const Args&... args) { Log(LogLevel::kDebug, args...); }

}  // namespace ckpt

// A small leveled logger writing one structured line per event to stderr
// (journald picks it up under systemd). Thread-safe: each line is one
// write(2).
//
// Lines are logfmt: `key=value` pairs separated by spaces, a value quoted
// (with \" \\ \n \r \t escapes, \xHH for any other byte below 0x20 or from
// 0x7f on) when it is empty or holds a space, '=', '"', '\', a control
// character or a byte from 0x80 on, so any line is plain ASCII and splits
// back into the same pairs (docs/OPERATIONS.md, "Logs"):
//
//   ts=2026-11-23T06:30:21.123Z level=info job=llama checkpoint=step-100
//     session=3 rank=0 pid=4242 msg=staged save=7 elapsed_ms=412
//
// `ts`, `level` and `msg` are on every line. Who an event concerns comes
// between `level` and `msg`, in a fixed order: job, checkpoint, session,
// rank, pid (the trainer's); the event's other fields follow `msg`. They come from a LogFields
// passed as the first argument, and from the ScopedLogFields of the
// calling thread: a request handler sets its session's once, and every
// line logged while it runs (by whatever code) carries them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. Default: kInfo.
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

// The fields of one event besides its message. Setting a key twice keeps
// the last value; the five context keys print in their fixed order wherever
// they were set, the others in the order first set.
class LogFields {
 public:
  LogFields& Job(absl::string_view job) { return SetText("job", job); }
  LogFields& Checkpoint(absl::string_view name) { return SetText("checkpoint", name); }
  LogFields& Session(uint64_t id) { return Set("session", id); }
  LogFields& Rank(uint32_t rank) { return Set("rank", rank); }
  LogFields& Pid(pid_t pid) { return Set("pid", pid); }
  // Any other field, text or a number; `key` must be a plain word
  // ([a-z0-9_]).
  template <typename T>
  LogFields& Set(absl::string_view key, const T& value) {
    if constexpr (std::is_convertible_v<const T&, absl::string_view>) {
      return SetText(key, value);
    } else {
      return SetText(key, absl::StrCat(value));
    }
  }

  // `other`'s fields over this one's (other's value wins on a shared key).
  void Merge(const LogFields& other);
  bool empty() const { return fields_.empty(); }
  // The value of `key`, or empty if it is not set.
  absl::string_view Get(absl::string_view key) const;
  const std::vector<std::pair<std::string, std::string>>& fields() const {
    return fields_;
  }

 private:
  LogFields& SetText(absl::string_view key, absl::string_view value);

  std::vector<std::pair<std::string, std::string>> fields_;
};

// Sets fields on every line this thread logs until it goes out of scope.
// Scopes nest; an inner one's value wins on a shared key.
class ScopedLogFields {
 public:
  explicit ScopedLogFields(LogFields fields);
  ~ScopedLogFields();
  ScopedLogFields(const ScopedLogFields&) = delete;
  ScopedLogFields& operator=(const ScopedLogFields&) = delete;

 private:
  LogFields saved_;  // the thread's fields before this scope
};

// Whether descriptor `fd` is the journal stream that systemd named in
// `journal_stream` (the JOURNAL_STREAM variable, "device:inode"; null if
// unset): then each line starts with its syslog priority ("<4>" for warn,
// sd-daemon(3)), so `journalctl -p warning` selects by level.
bool IsJournalStream(const char* journal_stream, int fd);

// `value` as a logfmt value: bare if it is a plain token, else quoted.
std::string LogfmtValue(absl::string_view value);

// The whole line (without its newline) that LogLine writes.
std::string FormatLogLine(LogLevel level, const LogFields& fields,
                          absl::string_view message);
void LogLine(LogLevel level, absl::string_view message);
void LogLine(LogLevel level, const LogFields& fields, absl::string_view message);

// Log(level, [fields,] message parts...): the parts are concatenated with
// absl::StrCat into `msg`.
template <typename First, typename... Args>
void Log(LogLevel level, const First& first, const Args&... args) {
  if (!LogEnabled(level)) return;
  if constexpr (std::is_same_v<First, LogFields>) {
    LogLine(level, first, absl::StrCat(args...));
  } else {
    LogLine(level, absl::StrCat(first, args...));
  }
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

#include "common/log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace ckpt {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
constexpr const char* kLevelNames[] = {"debug", "info", "warn", "error"};

// Who an event concerns, in the order every line prints them.
constexpr std::array<absl::string_view, 5> kContextKeys = {
    "job", "checkpoint", "session", "rank", "pid"};

// The fields of this thread's ScopedLogFields, innermost last merged.
thread_local LogFields t_fields;

bool IsPlainToken(absl::string_view value) {
  if (value.empty()) return false;
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= ' ' || u >= 0x7f || c == '=' || c == '"' || c == '\\') return false;
  }
  return true;
}

// Syslog priorities of the levels (debug 7, info 6, warning 4, error 3).
constexpr const char* kJournalPrefixes[] = {"<7>", "<6>", "<4>", "<3>"};

// Decided once: stderr does not change under a running daemon.
bool StderrIsJournal() {
  static const bool journal =
      IsJournalStream(std::getenv("JOURNAL_STREAM"), STDERR_FILENO);
  return journal;
}

void AppendField(std::string* line, absl::string_view key,
                 absl::string_view value) {
  absl::StrAppend(line, " ", key, "=", LogfmtValue(value));
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

bool IsJournalStream(const char* journal_stream, int fd) {
  if (journal_stream == nullptr) return false;
  // systemd checks the same pair: a stderr redirected elsewhere by a
  // wrapper inherits the variable but not the stream.
  std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(journal_stream, absl::MaxSplits(':', 1));
  uint64_t device = 0, inode = 0;
  if (!absl::SimpleAtoi(parts.first, &device) || !absl::SimpleAtoi(parts.second, &inode)) {
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  return st.st_dev == device && st.st_ino == inode;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level; }

LogFields& LogFields::SetText(absl::string_view key, absl::string_view value) {
  for (auto& [k, v] : fields_) {
    if (k == key) {
      v = std::string(value);
      return *this;
    }
  }
  fields_.emplace_back(std::string(key), std::string(value));
  return *this;
}

void LogFields::Merge(const LogFields& other) {
  for (const auto& [k, v] : other.fields_) SetText(k, v);
}

absl::string_view LogFields::Get(absl::string_view key) const {
  for (const auto& [k, v] : fields_) {
    if (k == key) return v;
  }
  return {};
}

ScopedLogFields::ScopedLogFields(LogFields fields) : saved_(t_fields) {
  t_fields.Merge(fields);
}

ScopedLogFields::~ScopedLogFields() { t_fields = std::move(saved_); }

std::string LogfmtValue(absl::string_view value) {
  if (IsPlainToken(value)) return std::string(value);
  std::string out = "\"";
  for (const char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < ' ' || static_cast<unsigned char>(c) >= 0x7f) {
          // Other control bytes would let a name from a request forge a
          // line break or escape sequence in the journal; bytes from 0x80
          // on are not text a line can be trusted to hold (a parse error
          // quoting binary garbage; C1 controls such as 0x9b, a terminal's
          // CSI, in UTF-8 or not), so a line stays plain ASCII.
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
          out += hex;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string FormatLogLine(LogLevel level, const LogFields& fields,
                          absl::string_view message) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  char stamp[32];
  strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  char millis[24];
  std::snprintf(millis, sizeof(millis), ".%03ldZ", now.tv_nsec / 1000000);

  LogFields all = t_fields;
  all.Merge(fields);
  std::string line = absl::StrCat("ts=", stamp, millis,
                                  " level=", kLevelNames[static_cast<int>(level)]);
  for (const absl::string_view key : kContextKeys) {
    if (absl::string_view value = all.Get(key); !value.empty()) {
      AppendField(&line, key, value);
    }
  }
  AppendField(&line, "msg", message);
  for (const auto& [key, value] : all.fields()) {
    if (std::find(kContextKeys.begin(), kContextKeys.end(), key) ==
        kContextKeys.end()) {
      AppendField(&line, key, value);
    }
  }
  return line;
}

void LogLine(LogLevel level, absl::string_view message) {
  LogLine(level, LogFields(), message);
}

void LogLine(LogLevel level, const LogFields& fields, absl::string_view message) {
  std::string line = FormatLogLine(level, fields, message);
  line += '\n';
  if (StderrIsJournal()) line.insert(0, kJournalPrefixes[static_cast<int>(level)]);
  // One write per line keeps lines from different threads whole; a failed
  // log write has nowhere to be reported, so it is dropped.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace ckpt

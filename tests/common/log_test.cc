// The log line format (common/log.h), read back by an independent logfmt
// parser (tests/support/logfmt.h).
#include "common/log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "support/logfmt.h"

namespace ckpt::testing {
namespace {

LogfmtFields Parsed(const std::string& line) {
  INFO(line);
  std::optional<LogfmtFields> fields = ParseLogfmt(line);
  REQUIRE(fields.has_value());
  return *fields;
}

}  // namespace

TEST_CASE("any value survives a log line whole: spaces, quotes, escapes, line breaks, "
          "control bytes, '=' and the empty string",
          "[unit][log]") {
  const std::string hostile[] = {
      "plain",
      "",
      "two words",
      "a=b",
      "say \"hi\"",
      "back\\slash",
      "line\nbreak\r\n",
      "tab\there",
      std::string("nul\0byte", 8),
      "\x1b[31mred\x7f",
      "x\nts=2026-01-01T00:00:00.000Z level=error msg=forged",
      "ünïcode ✓",
  };
  for (const std::string& value : hostile) {
    INFO(value);
    const std::string line =
        FormatLogLine(LogLevel::kWarning, LogFields().Job(value).Set("reason", value), value);
    // One line, however hostile the value.
    CHECK(line.find('\n') == std::string::npos);
    CHECK(line.find('\r') == std::string::npos);
    const LogfmtFields fields = Parsed(line);
    CHECK(Field(fields, "msg") == value);
    CHECK(Field(fields, "job") == value);
    CHECK(Field(fields, "reason") == value);
    CHECK(Field(fields, "level") == "warn");
  }
}

TEST_CASE("bytes of 0x80 and above are escaped in hex: a line is plain ASCII, "
          "whatever a parse error of binary garbage quotes",
          "[unit][log]") {
  // What the config parser quoted from a gzip file: 0x8b, its second byte.
  const std::string garbage("\x1f\x8b\x08\x00 caf\xc3\xa9 \xff", 12);
  const std::string line = FormatLogLine(LogLevel::kError, LogFields().Set("reason", garbage),
                                         garbage);
  INFO(line);
  for (const char c : line) {
    const auto u = static_cast<unsigned char>(c);
    CHECK((u >= ' ' && u < 0x7f));
  }
  CHECK(absl::StrContains(line, "msg=\"\\x1f\\x8b\\x08\\x00 caf\\xc3\\xa9 \\xff\""));
  const LogfmtFields fields = Parsed(line);
  CHECK(Field(fields, "msg") == garbage);
  CHECK(Field(fields, "reason") == garbage);
  // A value that is a plain token but for a high byte is quoted too.
  CHECK(LogfmtValue("\x8b") == "\"\\x8b\"");
}

TEST_CASE("a line prints ts and level, then job, checkpoint, session, rank and pid in "
          "that order, then msg and the event's own fields",
          "[unit][log]") {
  LogFields fields;
  fields.Set("bytes", 4096).Pid(42).Rank(3).Session(7).Checkpoint("step-1").Job("llama");
  const std::string line = FormatLogLine(LogLevel::kInfo, fields, "staged");
  INFO(line);
  const size_t after_stamp = line.find(' ');
  REQUIRE(line.rfind("ts=", 0) == 0);
  CHECK(line.substr(after_stamp) ==
        " level=info job=llama checkpoint=step-1 session=7 rank=3 pid=42 msg=staged "
        "bytes=4096");
  // Rank 0 is a rank, not an absent one.
  CHECK(Field(Parsed(FormatLogLine(LogLevel::kInfo, LogFields().Rank(0), "m")), "rank") ==
        "0");
}

TEST_CASE("a thread's scoped fields go on each of its lines until the scope ends, "
          "nested scopes and explicit fields win on a shared key, and other threads "
          "never see them",
          "[unit][log]") {
  CHECK(Parsed(FormatLogLine(LogLevel::kInfo, {}, "before")).count("session") == 0);
  {
    const ScopedLogFields outer(LogFields().Session(1).Pid(10).Job("outer"));
    LogfmtFields line = Parsed(FormatLogLine(LogLevel::kInfo, {}, "in outer"));
    CHECK(Field(line, "session") == "1");
    CHECK(Field(line, "job") == "outer");
    {
      const ScopedLogFields inner(LogFields().Job("inner").Rank(2));
      line = Parsed(FormatLogLine(LogLevel::kInfo, {}, "in inner"));
      CHECK(Field(line, "job") == "inner");
      CHECK(Field(line, "rank") == "2");
      CHECK(Field(line, "pid") == "10");
      line = Parsed(FormatLogLine(LogLevel::kInfo, LogFields().Job("explicit"), "m"));
      CHECK(Field(line, "job") == "explicit");
    }
    line = Parsed(FormatLogLine(LogLevel::kInfo, {}, "outer again"));
    CHECK(Field(line, "job") == "outer");
    CHECK(line.count("rank") == 0);
    std::string other;
    std::thread([&] { other = FormatLogLine(LogLevel::kInfo, {}, "other thread"); }).join();
    CHECK(Parsed(other).count("session") == 0);
  }
  CHECK(Parsed(FormatLogLine(LogLevel::kInfo, {}, "after")).count("session") == 0);
}

TEST_CASE("the logfmt reader refuses what is not one line of key=value pairs",
          "[unit][log]") {
  // The reader is the tests' witness for the format: it must not accept
  // what a log shipper would split differently.
  CHECK_FALSE(ParseLogfmt("").has_value());
  CHECK_FALSE(ParseLogfmt("msg").has_value());
  CHECK_FALSE(ParseLogfmt("msg=a b").has_value());
  CHECK_FALSE(ParseLogfmt("msg=\"open").has_value());
  CHECK_FALSE(ParseLogfmt("msg=\"a\\q\"").has_value());
  CHECK_FALSE(ParseLogfmt("msg=a  level=info").has_value());
  CHECK_FALSE(ParseLogfmt("msg=a msg=b").has_value());
  CHECK_FALSE(ParseLogfmt("msg=").has_value());
  CHECK(ParseLogfmt("msg=\"\" level=info").has_value());
}

TEST_CASE("lines carry a syslog priority only where stderr is the journal stream "
          "systemd named",
          "[unit][log]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  struct stat st {};
  REQUIRE(::fstat(fds[1], &st) == 0);
  const std::string mine = absl::StrCat(st.st_dev, ":", st.st_ino);
  CHECK(IsJournalStream(mine.c_str(), fds[1]));
  CHECK_FALSE(IsJournalStream(nullptr, fds[1]));
  // Another stream: a wrapper redirected stderr but kept the variable.
  CHECK_FALSE(IsJournalStream(absl::StrCat(st.st_dev, ":", st.st_ino + 1).c_str(), fds[1]));
  CHECK_FALSE(IsJournalStream("garbage", fds[1]));
  CHECK_FALSE(IsJournalStream(mine.c_str(), -1));
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace ckpt::testing

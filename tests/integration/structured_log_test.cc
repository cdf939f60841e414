// ckptd's log as an operator's log shipper reads it: every line parses as
// logfmt, and every event of a trainer's save and load names its job,
// checkpoint, session, rank and pid (common/log.h).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "integration/daemon_fixture.h"
#include "integration/daemon_log.h"
#include "integration/test_rank.h"
#include "support/logfmt.h"

namespace ckpt::testing {
namespace {

constexpr const char* kContextKeys[] = {"job", "checkpoint", "session", "rank", "pid"};

// Every field the checks below rely on, for a failure's message.
std::string Describe(const LogfmtFields& line) {
  std::string out;
  for (const auto& [key, value] : line) absl::StrAppend(&out, key, "=[", value, "] ");
  return out;
}

}  // namespace

TEST_CASE(
    "every log line is logfmt with a time, level and message, and each event "
    "of a save and a load names its job, checkpoint, session, rank and pid",
    "[integration][log]") {
  DaemonProcess daemon;
  const std::string pid = absl::StrCat(getpid());
  {
    TestRank rank(daemon.socket(), "logged", 2, 1 << 20);
    rank.Fill(1);
    auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
    rank.Zero();
    REQUIRE(rank.client().Load(rank.LoadRequestFor("latest")).ok());
    // Refused: the name is committed already.
    REQUIRE_FALSE(rank.client().Save(rank.SaveRequestFor("step-1")).ok());
    // A name is the client's to choose: one that tries to forge a line of
    // its own is refused, and logged as one line that says so.
    REQUIRE_FALSE(rank.client()
                      .Save(rank.SaveRequestFor(
                          "x\nts=2026-01-01T00:00:00.000Z level=error msg=forged"))
                      .ok());
    rank.Fill(2);
    auto cancelled = rank.client().Save(rank.SaveRequestFor("step-2"));
    REQUIRE(cancelled.ok());
    REQUIRE((*cancelled)->Cancel().ok());
    CHECK_FALSE((*cancelled)->WaitCommitted().ok());
  }
  REQUIRE(WaitForLog(daemon, LogfmtFields{{"msg", "session closed"}, {"pid", pid}},
                     10'000));

  const std::string text = DaemonLog(daemon);
  INFO(text);
  const std::vector<LogfmtFields> lines = ParseLog(text);
  REQUIRE(lines.size() > 10);
  const std::regex timestamp(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  const std::set<std::string> levels = {"debug", "info", "warn", "error"};
  for (const LogfmtFields& line : lines) {
    INFO(Describe(line));
    CHECK(Field(line, "unparsed").empty());
    CHECK(std::regex_match(Field(line, "ts"), timestamp));
    CHECK(levels.count(Field(line, "level")) == 1);
    CHECK(line.count("msg") == 1);
    CHECK(Field(line, "msg") != "forged");
  }

  // This trainer's session, as its handshake was accepted.
  std::string session;
  for (const LogfmtFields& line : lines) {
    if (Matches(line, {{"msg", "handshake accepted"}, {"pid", pid}})) {
      session = Field(line, "session");
    }
  }
  REQUIRE_FALSE(session.empty());

  // Each phase of step-1 once, naming the trainer; the load names the
  // checkpoint "latest" resolved to.
  const LogfmtFields trainer = {
      {"job", "logged"}, {"session", session}, {"rank", "0"}, {"pid", pid}};
  auto with = [&](LogfmtFields fields) {
    fields.insert(trainer.begin(), trainer.end());
    return fields;
  };
  for (const char* phase : {"accepted", "staged", "durable", "committed"}) {
    INFO(phase);
    CHECK(CountMatching(text, with({{"msg", phase}, {"checkpoint", "step-1"}})) == 1);
  }
  CHECK(CountMatching(text, with({{"msg", "session opened"}})) == 1);
  // The part's writing, phase by phase, from its start: the enqueue in
  // microseconds, the rest in ms.
  int written = 0;
  for (const LogfmtFields& line : lines) {
    if (!Matches(line, with({{"msg", "part written"}, {"checkpoint", "step-1"}}))) continue;
    ++written;
    INFO(Describe(line));
    CHECK(Field(line, "bytes") == "2101248");
    for (const char* phase :
         {"enqueued_us", "staged_ms", "first_write_ms", "written_ms", "synced_ms"}) {
      CHECK_FALSE(Field(line, phase).empty());
    }
    CHECK(std::stoll(Field(line, "enqueued_us")) / 1000 <=
          std::stoll(Field(line, "staged_ms")));
    CHECK(std::stoll(Field(line, "staged_ms")) <= std::stoll(Field(line, "synced_ms")));
    CHECK(std::stoll(Field(line, "written_ms")) <= std::stoll(Field(line, "synced_ms")));
  }
  CHECK(written == 1);
  int loads = 0;
  for (const LogfmtFields& line : lines) {
    if (!Matches(line, with({{"msg", "loaded"}, {"checkpoint", "step-1"}}))) continue;
    ++loads;
    INFO(Describe(line));
    CHECK((Field(line, "source") == "memory" || Field(line, "source") == "storage"));
    CHECK_FALSE(Field(line, "elapsed_ms").empty());
  }
  CHECK(loads == 1);
  CHECK(CountMatching(text,
                      with({{"msg", "save refused: "},
                            {"checkpoint", "step-1"},
                            {"level", "info"}}),
                      /*message_prefix=*/true) == 1);
  CHECK(CountMatching(text, with({{"msg", "cancelled"},
                                  {"checkpoint", "step-2"},
                                  {"level", "warn"}})) == 1);
  // The forged name is in the refusal's fields and message, escaped, on
  // the one line.
  CHECK(CountMatching(text,
                      with({{"msg", "save refused: "},
                            {"checkpoint",
                             "x\nts=2026-01-01T00:00:00.000Z level=error msg=forged"}}),
                      /*message_prefix=*/true) == 1);

  // Every line about this trainer's saves and loads carries all five (its
  // session's own lines concern no one checkpoint).
  const std::set<std::string> session_events = {"handshake accepted", "session opened",
                                                "session closed"};
  int events = 0;
  for (const LogfmtFields& line : lines) {
    if (Field(line, "pid") != pid || session_events.count(Field(line, "msg")) != 0) {
      continue;
    }
    ++events;
    INFO(Describe(line));
    for (const char* key : kContextKeys) CHECK_FALSE(Field(line, key).empty());
  }
  CHECK(events >= 9);
}

}  // namespace ckpt::testing

// SIGTERM drains the saves in flight up to drain_timeout_ms and cancels
// what is left, through a real daemon (daemon/save_drain.h).
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "integration/daemon_fixture.h"
#include "integration/daemon_log.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;

void CheckExitedCleanly(DaemonProcess& daemon, int timeout_ms) {
  const std::optional<int> status = daemon.WaitForExit(timeout_ms);
  REQUIRE(status.has_value());
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
}

TEST_CASE("a save in flight at SIGTERM commits within the drain deadline, while "
          "new saves and sessions are refused as 'ckptd is stopping'",
          "[integration][drain]") {
  // 16 MiB at 8 MiB/s in 4 MiB writes: about 1.5 s of writing, well inside
  // the default drain deadline (60 s).
  DaemonProcess daemon({"--write_rate_limit", std::to_string(8 << 20)});
  TestRank rank(daemon.socket(), "job", 4, 4 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  (*save)->progress();  // follows its progress from now on
  REQUIRE(kill(daemon.pid(), SIGTERM) == 0);
  REQUIRE(WaitForLog(daemon, "drain: refusing new saves", 5'000));

  const absl::StatusOr<std::unique_ptr<SaveHandle>> refused =
      rank.client().Save(rank.SaveRequestFor("step-2"));
  REQUIRE_FALSE(refused.ok());
  INFO(refused.status().ToString());
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(refused.status().message(), "ckptd is stopping"));
  const auto newcomer = Client::Connect(
      {.socket = daemon.socket(), .job = "other", .rank = 0, .world_size = 1});
  REQUIRE_FALSE(newcomer.ok());
  INFO(newcomer.status().ToString());
  CHECK(absl::StrContains(newcomer.status().message(), "ckptd is stopping"));

  const absl::Status committed = (*save)->WaitCommitted();
  INFO(committed.ToString());
  CHECK(committed.ok());
  CheckExitedCleanly(daemon, 30'000);
  CHECK(std::filesystem::exists(daemon.root() + "/job/step-1/COMMIT"));
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/job/step-2"));
  const std::string log = DaemonLog(daemon);
  INFO(log);
  CHECK(absl::StrContains(log, "1 checkpoint(s) ended while draining: job/step-1; 0 cancelled"));
}

TEST_CASE("a save that cannot commit by the drain deadline is cancelled, its waiter "
          "hears that the daemon stopped, and the checkpoint before it is intact",
          "[integration][drain]") {
  std::string tmpl = TempBase() + "/ckptd-conf-XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  const std::string config = tmpl + "/ckptd.conf";
  WriteText(config, "drain_timeout_ms: 1500\n");
  DaemonProcess daemon({"--config", config});
  {
    TestRank rank(daemon.socket(), "job", 4, 4 << 20);
    rank.Fill(1);
    auto first = rank.client().Save(rank.SaveRequestFor("step-1"));
    REQUIRE(first.ok());
    REQUIRE((*first)->WaitCommitted().ok());

    // Throttled live to 1 MiB/s: the next 16 MiB would take about 12 s.
    WriteText(config, "drain_timeout_ms: 1500\nwrite_rate_limit: 1048576\n");
    REQUIRE(kill(daemon.pid(), SIGHUP) == 0);
    REQUIRE(WaitForLog(daemon, "reload: write_rate_limit: 0 -> 1048576", 10'000));
    rank.Fill(2);
    auto second = rank.client().Save(rank.SaveRequestFor("step-2"));
    REQUIRE(second.ok());
    REQUIRE((*second)->WaitStaged().ok());
    const auto stop = Clock::now();
    REQUIRE(kill(daemon.pid(), SIGTERM) == 0);

    const absl::Status waited = (*second)->WaitCommitted();
    INFO(waited.ToString());
    CHECK(waited.code() == absl::StatusCode::kCancelled);
    CHECK(absl::StrContains(
        waited.message(),
        "ckptd stopped before this checkpoint committed; drain deadline 1500 ms"));
    CheckExitedCleanly(daemon, 15'000);
    // The deadline, not the write: the cancelled writer stopped waiting.
    CHECK(Clock::now() - stop < std::chrono::seconds(8));
  }
  const std::string log = DaemonLog(daemon);
  INFO(log);
  CHECK(absl::StrContains(log, "0 checkpoint(s) ended while draining; 1 cancelled at "
                               "the deadline: job/step-2"));
  // Nothing of step-2 committed; step-1 is still the latest, whole.
  CHECK(std::filesystem::exists(daemon.root() + "/job/step-1/COMMIT"));
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/job/step-2/COMMIT"));
  CHECK(absl::StrContains(ReadText(daemon.root() + "/job/LATEST"), "step-1"));
  daemon.Restart();
  TestRank reader(daemon.socket(), "job", 4, 4 << 20);
  reader.Zero();
  const auto loaded = reader.client().Load(reader.LoadRequestFor("step-1"));
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(reader.Holds(1));
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

}  // namespace
}  // namespace ckpt::testing

// Failure in the middle of a save: an operator cancel, and ckptd killed with
// SIGKILL. Neither may commit the new checkpoint or harm the previous one.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

// 16 MiB/s makes a 64 MiB save last about four seconds.
const std::vector<std::string> kSlowWrites = {"--write_rate_limit",
                                              std::to_string(16 << 20)};

void SaveCommitted(TestRank& rank, uint32_t step) {
  rank.Fill(step);
  auto save = rank.client().Save(rank.SaveRequestFor("step-" + std::to_string(step)));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
}

// Waits until the save has written some bytes (it is mid-way).
void WaitForWrites(SaveHandle& save) {
  for (int i = 0; i < 500; ++i) {
    if (save.progress().bytes_written() > 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL("the save wrote nothing within 5 s");
}

}  // namespace

TEST_CASE("cancel in the middle of a save leaves nothing committed",
          "[integration][cancel]") {
  DaemonProcess daemon(kSlowWrites);
  TestRank small(daemon.socket(), "job", 1, 1 << 20);
  SaveCommitted(small, 1);
  TestRank rank(daemon.socket(), "job", 16, 4 << 20);
  rank.Fill(2);
  auto save = rank.client().Save(rank.SaveRequestFor("step-2"));
  REQUIRE(save.ok());
  WaitForWrites(**save);

  const ProcessResult cancel = RunProcess(
      {CKPTCTL_BINARY, "--socket", daemon.socket(), "cancel", "job", "step-2"});
  INFO(cancel.out);
  CHECK(cancel.exit_code == 0);
  const absl::Status result = (*save)->WaitCommitted();
  CHECK(absl::IsCancelled(result));
  CHECK(absl::StrContains(result.message(), "cancelled by the operator"));

  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/job/step-2/COMMIT"));
  auto list = rank.client().List("job");
  REQUIRE(list.ok());
  for (const auto& info : *list) {
    CHECK((info.checkpoint() == "step-1") == info.committed());
  }
  auto load = rank.client().Load(rank.LoadRequestFor("step-2"));
  CHECK(absl::IsNotFound(load.status()));
  small.Zero();
  auto previous = small.client().Load(small.LoadRequestFor("latest"));
  REQUIRE(previous.ok());
  CHECK(previous->checkpoint() == "step-1");
  CHECK(small.Holds(1));
}

TEST_CASE("a save of a cancelled checkpoint name can be retried and commits",
          "[integration][cancel]") {
  DaemonProcess daemon(kSlowWrites);
  TestRank rank(daemon.socket(), "job", 4, 4 << 20);
  rank.Fill(7);
  auto save = rank.client().Save(rank.SaveRequestFor("step-7"));
  REQUIRE(save.ok());
  WaitForWrites(**save);
  REQUIRE((*save)->Cancel().ok());
  CHECK(absl::IsCancelled((*save)->WaitCommitted()));
  // The cancelled attempt is cleaned up asynchronously; retry until the name
  // is free again.
  absl::StatusOr<std::unique_ptr<SaveHandle>> retry;
  for (int i = 0; i < 100; ++i) {
    retry = rank.client().Save(rank.SaveRequestFor("step-7"));
    if (retry.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(retry.ok());
  REQUIRE((*retry)->WaitCommitted().ok());
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("step-7")).ok());
  CHECK(rank.Holds(7));
}

TEST_CASE("ckptd killed with SIGKILL mid-save keeps the previous checkpoint "
          "loadable and never commits the new one, which the restarted daemon "
          "removes",
          "[integration][crash]") {
  DaemonProcess daemon(kSlowWrites);
  {
    TestRank rank(daemon.socket(), "job", 16, 4 << 20);
    SaveCommitted(rank, 1);
    rank.Fill(2);
    auto save = rank.client().Save(rank.SaveRequestFor("step-2"));
    REQUIRE(save.ok());
    WaitForWrites(**save);
    daemon.Kill();
    CHECK_FALSE((*save)->WaitCommitted().ok());
  }
  CHECK(std::filesystem::exists(daemon.root() + "/job/step-2"));
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/job/step-2/COMMIT"));

  daemon.Restart();
  // Its save died with the daemon, so it can never commit: startup
  // recovery removed it (storage/startup_recovery.h).
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/job/step-2"));
  TestRank rank(daemon.socket(), "job", 16, 4 << 20);
  auto list = rank.client().List("job");
  REQUIRE(list.ok());
  REQUIRE(list->size() == 1);
  CHECK((*list)[0].checkpoint() == "step-1");
  CHECK((*list)[0].committed());
  CHECK((*list)[0].latest());

  auto lost = rank.client().Load(rank.LoadRequestFor("step-2"));
  CHECK(absl::IsNotFound(lost.status()));
  auto latest = rank.client().Load(rank.LoadRequestFor("latest"));
  REQUIRE(latest.ok());
  CHECK(latest->checkpoint() == "step-1");
  CHECK(rank.Holds(1));

  // The trainer retries the lost step.
  SaveCommitted(rank, 2);
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("latest")).ok());
  CHECK(rank.Holds(2));
}

}  // namespace ckpt::testing

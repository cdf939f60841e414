// The write rate cap (--write_rate_limit) through a real daemon: it paces
// the writes to storage, never the staging of a state the pool holds, so
// the trainer's wait (STAGED) does not grow with slow storage while
// DURABLE still keeps to the cap.
//
// The relations are chosen so that a loaded machine cannot flip them:
// 16 MiB at 4 MiB/s in 4 MiB writes is at least ~3 s of turns whatever the
// machine does (the limiter's clock, not the disk, sets it), and staging
// 16 MiB from this process's memory takes tens of milliseconds, so the
// bound of 1.5 s for STAGED is tens of times what it needs and still far
// below the ~3 s a staging loop that waited for each write's turn would
// take. Speed itself is measured by the benchmarks (docs/BENCHMARKS.md).
#include <signal.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "integration/daemon_fixture.h"
#include "integration/daemon_log.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kTensors = 4;
constexpr uint64_t kTensorBytes = 4 << 20;  // 16 MiB in all: the pool holds it
constexpr uint64_t kCap = 4 << 20;          // bytes per second

// Seconds from the daemon's acceptance of a save to `micros` (one of its
// phase times, from the daemon's own clock).
double SecondsAfterAccepted(const v1::SaveProgress& p, int64_t micros) {
  REQUIRE(p.accepted_unix_micros() > 0);
  REQUIRE(micros > 0);
  return static_cast<double>(micros - p.accepted_unix_micros()) / 1e6;
}

// Saves `checkpoint` of `rank` and waits for its commit; the progress then.
v1::SaveProgress SaveAndCommit(TestRank& rank, const std::string& checkpoint) {
  auto save = rank.client().Save(rank.SaveRequestFor(checkpoint));
  REQUIRE(save.ok());
  const absl::Status staged = (*save)->WaitStaged();
  INFO(staged.ToString());
  REQUIRE(staged.ok());
  const absl::Status committed = (*save)->WaitCommitted();
  INFO(committed.ToString());
  REQUIRE(committed.ok());
  return (*save)->progress();
}

// Fills `rank` with the pattern of step 1, saves it as step-1 under a daemon
// capped at kCap and waits for the commit; checks, from the daemon's phase
// times, that the writes kept to the cap and the staging did not wait for it.
void SaveUnderTheCap(TestRank& rank) {
  rank.Fill(1);
  const v1::SaveProgress p = SaveAndCommit(rank, "step-1");
  const double staged = SecondsAfterAccepted(p, p.staged_unix_micros());
  const double durable = SecondsAfterAccepted(p, p.durable_unix_micros());
  INFO("staged after " << staged << " s, durable after " << durable << " s");
  // The cap holds: the first 4 MiB go at once, each later 4 MiB a second
  // after the one before, and the file's last page after that.
  CHECK(durable >= 3.5);
  // Staging did not wait for the writes' turns.
  CHECK(staged < 1.5);
  // The checkpoint's commit time, by which LATEST and retention order
  // checkpoints, is when its save began, not when its writes ended
  // (seconds later here): two saves in flight keep the order they were
  // saved in, whichever finishes its writes first.
  auto listed = rank.client().List("job");
  INFO(listed.status().ToString());
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  const double committed_at = SecondsAfterAccepted(p, (*listed)[0].committed_unix_micros());
  INFO("commit time " << committed_at << " s after the save was accepted");
  CHECK(committed_at <= 0.0);
  CHECK(committed_at > -1.0);
}

}  // namespace

TEST_CASE("a capped daemon stages a state its pool holds without waiting for the "
          "cap, while its writes still keep to the cap",
          "[integration][write-rate]") {
  DaemonProcess daemon({"--write_rate_limit", std::to_string(kCap)});
  TestRank rank(daemon.socket(), "job", kTensors, kTensorBytes);
  SaveUnderTheCap(rank);

  rank.Zero();
  auto load = rank.client().Load(rank.LoadRequestFor("step-1"));
  INFO(load.status().ToString());
  REQUIRE(load.ok());
  CHECK(load->source() == "storage");
  CHECK(rank.Holds(1));
}

TEST_CASE("a capped save with the memory tier on stages without waiting for the "
          "cap, and the tier then serves every byte of it",
          "[integration][write-rate][memory-tier]") {
  DaemonProcess daemon({"--write_rate_limit", std::to_string(kCap),
                        "--keep_in_memory_bytes", std::to_string(64 << 20)});
  TestRank rank(daemon.socket(), "job", kTensors, kTensorBytes);
  SaveUnderTheCap(rank);

  // The trainer's memory changes right after STAGED; the tier still holds
  // the saved bytes, every one of them verified on the way out.
  rank.Fill(2);
  auto load = rank.client().Load(rank.LoadRequestFor("step-1"));
  INFO(load.status().ToString());
  REQUIRE(load.ok());
  CHECK(load->source() == "memory");
  CHECK(load->bytes_read() == 0);
  CHECK(rank.Holds(1));
}

TEST_CASE("lifting the cap by SIGHUP lets a staged save's waiting writes go at once",
          "[integration][write-rate][reload]") {
  std::string dir = TempBase() + "/ckptd-conf-XXXXXX";
  REQUIRE(mkdtemp(dir.data()) != nullptr);
  const std::string config = dir + "/ckptd.conf";
  // 1 MiB/s: the 16 MiB would take about 16 s.
  WriteText(config, "write_rate_limit: 1048576\n");
  {
    DaemonProcess daemon({"--config", config});
    TestRank rank(daemon.socket(), "job", kTensors, kTensorBytes);
    rank.Fill(1);
    auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitStaged().ok());
    const auto lifted = Clock::now();
    WriteText(config, "write_rate_limit: 0\n");
    REQUIRE(kill(daemon.pid(), SIGHUP) == 0);
    REQUIRE(WaitForLog(daemon, "reload: write_rate_limit: 1048576 -> 0", 10'000));
    const absl::Status committed = (*save)->WaitCommitted();
    INFO(committed.ToString());
    REQUIRE(committed.ok());
    // Far less than the 12 s and more the old cap still had to go.
    CHECK(Clock::now() - lifted < std::chrono::seconds(8));
    rank.Zero();
    REQUIRE(rank.client().Load(rank.LoadRequestFor("step-1")).ok());
    CHECK(rank.Holds(1));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace ckpt::testing

// The remote tier's commit as the last phase of a save's progress stream
// (WatchSaveRequest.follow_remote, which libckpt's SaveHandle sets): after
// COMMITTED the stream goes on while the checkpoint's upload runs, and
// ends with REMOTE_COMMITTED, or REMOTE_FAILED and the reason, while the
// local commit stands. The remote tier is a directory: no S3 server.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"
#include "support/temp_dir.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kWait = absl::Seconds(60);

}  // namespace

TEST_CASE("with --remote, a save's progress goes on past COMMITTED while the upload runs "
          "and ends with REMOTE_COMMITTED, carrying the upload",
          "[integration][remote][remote_phase]") {
  TempDir remote;
  // 4 MiB at 1 MiB/s: the upload takes seconds, the local commit far less,
  // so COMMITTED is seen with the remote phase still running.
  DaemonProcess daemon({"--remote", remote.path(), "--remote_max_bytes_per_second",
                        std::to_string(1 << 20)});
  TestRank rank(daemon.socket(), "job", 4, 1 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
  const v1::SaveProgress at_commit = (*save)->progress();
  CHECK(at_commit.phase() == v1::PHASE_COMMITTED);
  CHECK(at_commit.remote_phase() == v1::PHASE_REMOTE_UPLOADING);
  CHECK_FALSE(fs::exists(fs::path(remote.path()) / "job" / "step-1" / "COMMIT"));

  const absl::StatusOr<v1::RemoteUpload> upload = (*save)->WaitRemoteCommitted(kWait);
  INFO(upload.status().ToString());
  REQUIRE(upload.ok());
  CHECK(upload->state() == "committed");
  CHECK(upload->checkpoint() == "step-1");
  CHECK(upload->bytes_total() >= 4u << 20);
  CHECK(upload->bytes_uploaded() == upload->bytes_total());
  const v1::SaveProgress last = (*save)->progress();
  CHECK(last.phase() == v1::PHASE_COMMITTED);  // the save's outcome stays
  CHECK(last.remote_phase() == v1::PHASE_REMOTE_COMMITTED);
  CHECK(last.remote_reason().empty());
  CHECK(last.remote_committed_unix_micros() >= last.committed_unix_micros());
  CHECK(fs::exists(fs::path(remote.path()) / "job" / "step-1" / "COMMIT"));
}

TEST_CASE("with --remote, a remote phase that fails ends the save's progress with "
          "REMOTE_FAILED and the reason, and the local commit stands",
          "[integration][remote][remote_phase]") {
  TempDir remote;
  // A file where the job's directory of the remote tier would go: every
  // upload of the job fails at its first object (root ignores modes).
  { std::ofstream(fs::path(remote.path()) / "job") << "not a directory"; }
  DaemonProcess daemon({"--remote", remote.path()});
  TestRank rank(daemon.socket(), "job", 2, 1 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());

  const absl::StatusOr<v1::RemoteUpload> upload = (*save)->WaitRemoteCommitted(kWait);
  REQUIRE_FALSE(upload.ok());
  INFO(upload.status().ToString());
  CHECK(upload.status().code() == absl::StatusCode::kAborted);
  CHECK(absl::StrContains(upload.status().message(), "node 0"));
  const v1::SaveProgress last = (*save)->progress();
  CHECK(last.phase() == v1::PHASE_COMMITTED);
  CHECK(last.remote_phase() == v1::PHASE_REMOTE_FAILED);
  CHECK(absl::StrContains(last.remote_reason(), "node 0"));
  CHECK(absl::StrContains(last.remote_reason(), remote.path()));  // the object
  CHECK(last.remote_upload().state() == "failed");
  CHECK(last.remote_committed_unix_micros() == 0);

  // Committed locally all the same: listed so, and loadable.
  CHECK(fs::exists(fs::path(daemon.root()) / "job" / "step-1" / "COMMIT"));
  const auto listed = rank.client().List("job");
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].committed());
  rank.Zero();
  const auto loaded = rank.client().Load(rank.LoadRequestFor("step-1"));
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(rank.Holds(1));
}

TEST_CASE("with --remote, a daemon stopped while a save's remote phase runs ends it "
          "REMOTE_FAILED, saying so, and exits without waiting for the upload",
          "[integration][remote][remote_phase]") {
  TempDir remote;
  // 8 MiB at 128 KiB/s: the upload would take about a minute, so an exit
  // well within it did not wait for it (the bound below leaves a slow
  // sanitizer build its shutdown).
  DaemonProcess daemon({"--remote", remote.path(), "--remote_max_bytes_per_second",
                        std::to_string(128 << 10)});
  TestRank rank(daemon.socket(), "job", 8, 1 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
  REQUIRE((*save)->progress().remote_phase() == v1::PHASE_REMOTE_UPLOADING);
  const auto stopped = std::chrono::steady_clock::now();
  REQUIRE(kill(daemon.pid(), SIGTERM) == 0);

  const absl::StatusOr<v1::RemoteUpload> upload = (*save)->WaitRemoteCommitted(kWait);
  REQUIRE_FALSE(upload.ok());
  INFO(upload.status().ToString());
  CHECK(upload.status().code() == absl::StatusCode::kAborted);
  // Stopped mid-upload, or (a slow start) before the upload began: queued,
  // or not yet queued when the trainer heard COMMITTED.
  CHECK((absl::StrContains(upload.status().message(), "the daemon is stopping") ||
         absl::StrContains(upload.status().message(), "the daemon stopped before the upload")));
  CHECK((*save)->progress().remote_phase() == v1::PHASE_REMOTE_FAILED);
  const std::optional<int> exit = daemon.WaitForExit(30'000);
  REQUIRE(exit.has_value());
  CHECK(WIFEXITED(*exit));
  CHECK(WEXITSTATUS(*exit) == 0);
  CHECK(std::chrono::steady_clock::now() - stopped < std::chrono::seconds(20));
  CHECK(fs::exists(fs::path(daemon.root()) / "job" / "step-1" / "COMMIT"));
  CHECK_FALSE(fs::exists(fs::path(remote.path()) / "job" / "step-1" / "COMMIT"));
}

TEST_CASE("without a remote tier a save's progress ends at COMMITTED with no remote phase",
          "[integration][remote_phase]") {
  DaemonProcess daemon;
  TestRank rank(daemon.socket(), "job", 1, 1 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  const absl::StatusOr<v1::RemoteUpload> upload = (*save)->WaitRemoteCommitted(kWait);
  INFO(upload.status().ToString());
  CHECK(upload.status().code() == absl::StatusCode::kNotFound);
  CHECK((*save)->progress().phase() == v1::PHASE_COMMITTED);
  CHECK((*save)->progress().remote_phase() == v1::PHASE_UNSPECIFIED);
}

}  // namespace ckpt::testing

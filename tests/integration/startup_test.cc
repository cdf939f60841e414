// Starting ckptd (issue 9, item 7): a second daemon on the same socket, or
// for the same node of a storage root, refuses to start and leaves the
// first one serving; a daemon restarted after a crash removes the crash's
// leftovers, repairs LATEST and logs what it did.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/ckpt_client.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"
#include "support/planted_files.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

// Runs a ckptd that is expected to refuse to start; one that keeps running
// instead is killed after 20 s (its exit code then says so).
ProcessResult RunRefusedDaemon(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {CKPTD_BINARY, "--pool_bytes",
                                   std::to_string(16 << 20), "--buffer_bytes",
                                   std::to_string(4 << 20), "--io_workers", "1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  BackgroundProcess daemon(argv);
  absl::Notification exited;
  std::thread watchdog([&] {
    if (!exited.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      ::kill(daemon.pid(), SIGKILL);
    }
  });
  ProcessResult result = daemon.Wait();
  exited.Notify();
  watchdog.join();
  return result;
}

// The pid the daemon on `socket` reports; 0 if it does not answer.
uint32_t DaemonPid(const std::string& socket) {
  auto stub = v1::Ckptd::NewStub(DaemonChannel(socket));
  v1::DaemonStatusResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!stub->DaemonStatus(&context, v1::DaemonStatusRequest(), &response).ok()) {
    return 0;
  }
  return response.pid();
}

void SaveCommitted(TestRank& rank, uint32_t step) {
  rank.Fill(step);
  auto save = rank.client().Save(rank.SaveRequestFor("step-" + std::to_string(step)));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
}

}  // namespace

TEST_CASE("a second ckptd on the same socket refuses to start, naming the "
          "first, which keeps serving",
          "[integration][startup]") {
  DaemonProcess first;
  const std::string other_root = first.dir() + "/other-root";
  const ProcessResult second =
      RunRefusedDaemon({"--socket", first.socket(), "--root", other_root});
  INFO(second.out);
  CHECK(second.exit_code == 1);
  CHECK(absl::StrContains(
      second.out, absl::StrCat("another ckptd already serves socket ", first.socket(),
                               ": it holds the lock ", first.socket(), ".lock (pid ",
                               first.pid(), ")")));
  // The first daemon's sockets are its own still.
  CHECK(DaemonPid(first.socket()) == static_cast<uint32_t>(first.pid()));
  TestRank rank(first.socket(), "job", 2, 1 << 20);
  SaveCommitted(rank, 1);
}

TEST_CASE("a second ckptd for the same node of a storage root refuses to "
          "start, and a daemon for another node of it starts",
          "[integration][startup][multi-node]") {
  DaemonProcess first;
  const std::string lock = first.root() + "/.ckptd-node-0000.lock";
  const ProcessResult second = RunRefusedDaemon(
      {"--socket", first.dir() + "/second.sock", "--root", first.root()});
  INFO(second.out);
  CHECK(second.exit_code == 1);
  CHECK(absl::StrContains(
      second.out, absl::StrCat("another ckptd already serves node 0 of storage root ",
                               first.root(), ": it holds the lock ", lock, " (pid ",
                               first.pid(), " on host ")));
  CHECK(DaemonPid(first.socket()) == static_cast<uint32_t>(first.pid()));
  // Neither the refused daemon nor its sockets are left behind.
  CHECK_FALSE(fs::exists(first.dir() + "/second.sock"));

  DaemonProcess node1({"--node_id", "1", "--nodes", "2"}, first.root());
  CHECK(DaemonPid(node1.socket()) == static_cast<uint32_t>(node1.pid()));
}

TEST_CASE("ckptd restarted after a crash removes the uncommitted checkpoint "
          "and the temporaries it left, repairs LATEST, keeps what it did "
          "not make, and logs what it did and shows it in ckptctl status",
          "[integration][startup][crash]") {
  // 16 MiB/s makes the 64 MiB save of step-3 last about four seconds.
  DaemonProcess daemon({"--write_rate_limit", std::to_string(16 << 20)});
  const std::string job = daemon.root() + "/job";
  {
    TestRank rank(daemon.socket(), "job", 16, 4 << 20);
    SaveCommitted(rank, 1);
    SaveCommitted(rank, 2);
    rank.Fill(3);
    auto save = rank.client().Save(rank.SaveRequestFor("step-3"));
    REQUIRE(save.ok());
    for (int i = 0; i < 500 && (*save)->progress().bytes_written() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE((*save)->progress().bytes_written() > 0);
    daemon.Kill();
    CHECK_FALSE((*save)->WaitCommitted().ok());
  }
  REQUIRE(fs::exists(job + "/step-3/.ckptd-checkpoint"));
  REQUIRE_FALSE(fs::exists(job + "/step-3/COMMIT"));
  // The crash also fell between step-2's COMMIT and LATEST, and left
  // temporaries of durable writes.
  WriteBytes(job + "/LATEST", "step-1\n");
  const std::vector<std::string> temporaries = {
      job + "/LATEST.tmp.4242.beef.7", job + "/step-2/COMMIT.tmp.4242.beef.8",
      job + "/step-1/node-0000.manifest.tmp.4242.beef.9"};
  for (const std::string& t : temporaries) WriteBytes(t, "partial");
  // What ckptd did not make stays: a DCP checkpoint copied in.
  fs::create_directories(job + "/from-dcp");
  WriteBytes(job + "/from-dcp/.metadata", "dcp");

  daemon.Restart();
  CHECK_FALSE(fs::exists(job + "/step-3"));
  for (const std::string& t : temporaries) CHECK_FALSE(fs::exists(t));
  CHECK(ReadBytes(job + "/LATEST") == "step-2\n");
  CHECK(ReadBytes(job + "/from-dcp/.metadata") == "dcp");
  const std::string log = ReadBytes(daemon.dir() + "/ckptd.log");
  INFO(log);
  CHECK(absl::StrContains(
      log, "startup recovery: removed uncommitted checkpoint job/step-3"));
  CHECK(absl::StrContains(log, "startup recovery: removed temporary job/LATEST.tmp.4242.beef.7"));
  CHECK(absl::StrContains(log, "startup recovery: LATEST of job: step-1 -> step-2"));
  CHECK(absl::StrContains(log, " temporaries, 1 uncommitted checkpoints and "));
  CHECK(absl::StrContains(log, "repaired LATEST of 1 jobs"));
  // ...and says so through ckptctl status.
  const ProcessResult status =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "status"});
  INFO(status.out);
  CHECK(status.exit_code == 0);
  CHECK(absl::StrContains(status.out, "at start:\n"));
  CHECK(absl::StrContains(status.out, "  removed uncommitted job/step-3\n"));
  CHECK(absl::StrContains(status.out, "  removed temporary job/LATEST.tmp.4242.beef.7\n"));
  CHECK(absl::StrContains(status.out, "  repaired LATEST of job: step-1 -> step-2\n"));

  TestRank rank(daemon.socket(), "job", 16, 4 << 20);
  auto list = rank.client().List("job");
  REQUIRE(list.ok());
  std::vector<std::string> names;
  for (const auto& info : *list) {
    if (info.committed()) names.push_back(info.checkpoint());
    if (info.latest()) CHECK(info.checkpoint() == "step-2");
  }
  CHECK(names == std::vector<std::string>{"step-1", "step-2"});
  auto latest = rank.client().Load(rank.LoadRequestFor("latest"));
  REQUIRE(latest.ok());
  CHECK(latest->checkpoint() == "step-2");
  CHECK(rank.Holds(2));
}

}  // namespace ckpt::testing

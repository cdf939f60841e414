// Retention on both tiers with a real daemon and a --remote directory:
// --remote_keep_last keeps the newest checkpoints committed in the remote
// tier and deletes the older ones (never an object ckptd did not write);
// a delete a crash cut short is finished when the daemon starts again;
// `ckptctl list` says where each checkpoint is, `ckptctl status` what the
// remote tier did.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "integration/daemon_fixture.h"
#include "support/temp_dir.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

// Regular files below `dir` (none if it is gone).
int FilesBelow(const fs::path& dir) {
  std::error_code error;
  if (!fs::exists(dir, error)) return 0;
  int files = 0;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) ++files;
  }
  return files;
}

// Waits up to `timeout` for `done` to hold; whether it did.
template <typename Done>
bool WaitUntil(Done done, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return done();
}

ProcessResult Ctl(const DaemonProcess& daemon, std::vector<std::string> args) {
  std::vector<std::string> argv = {CKPTCTL_BINARY, "--socket", daemon.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv);
}

// The line of `out` that names `checkpoint`, "" if none.
std::string LineOf(const std::string& out, const std::string& checkpoint) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StrContains(line, checkpoint)) return std::string(line);
  }
  return "";
}

}  // namespace

TEST_CASE("with --remote_keep_last 2 the remote tier keeps the newest two checkpoints, "
          "ckptctl list shows each one's tiers, and a delete cut short is finished at start",
          "[integration][remote]") {
  TempDir remote;
  DaemonProcess daemon({"--remote", remote.path(), "--remote_keep_last", "2", "--keep_last",
                        "1", "--keep_in_memory_bytes", std::to_string(64 << 20)});
  const ProcessResult run = RunProcess(
      {LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "job", "--nodes", "1",
       "--ranks-per-node", "1", "--replicas", "1", "--layout", "uniform", "--tensors", "4",
       "--bytes-per-rank", std::to_string(1 << 20), "--saves", "4"});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  const fs::path there = fs::path(remote.path()) / "job";
  REQUIRE(WaitUntil([&] { return fs::exists(there / "step-00000004" / "COMMIT"); },
                    std::chrono::seconds(30)));
  // After step-4's commit its pass deletes step-2 (step-1 went after step-3's).
  REQUIRE(WaitUntil(
      [&] {
        return FilesBelow(there / "step-00000001") == 0 &&
               FilesBelow(there / "step-00000002") == 0;
      },
      std::chrono::seconds(30)));
  CHECK(fs::exists(there / "step-00000003" / "COMMIT"));
  std::ifstream latest(there / "LATEST");
  std::string name;
  std::getline(latest, name);
  CHECK(name == "step-00000004");

  const ProcessResult list = Ctl(daemon, {"list", "job"});
  INFO(list.out);
  REQUIRE(list.exit_code == 0);
  CHECK(absl::StrContains(list.out, "WHERE"));
  CHECK(absl::StrContains(LineOf(list.out, "step-00000004"), "memory,local,remote"));
  // step-3 is in the remote tier (and locally until local retention's
  // next pass once its upload has ended).
  CHECK(absl::StrContains(LineOf(list.out, "step-00000003"), "remote"));
  // step-1, if local retention has not taken it yet, is local only.
  const std::string step1 = LineOf(list.out, "step-00000001");
  CHECK_FALSE(absl::StrContains(step1, "remote"));
  const ProcessResult list_json = Ctl(daemon, {"list", "--json", "job"});
  CHECK(absl::StrContains(list_json.out, "\"tiers\""));

  const ProcessResult status = Ctl(daemon, {"status"});
  INFO(status.out);
  REQUIRE(status.exit_code == 0);
  CHECK(absl::StrContains(status.out, "deleted 2 (+0 remnants), keep_last 2"));
  CHECK(absl::StrContains(status.out, "committed 4, failed 0"));

  // A crash mid-delete of step-2, as its DELETING marker and a data file
  // left it, and a file of the operator's beside them.
  {
    fs::create_directories(there / "step-00000002");
    std::ofstream(there / "step-00000002" / "DELETING").flush();
    std::ofstream(there / "step-00000002" / "shard-00000.safetensors") << "partial";
    std::ofstream(there / "step-00000002" / "notes.txt") << "the operator's";
  }
  daemon.Kill();
  daemon.Restart();
  CHECK(WaitUntil([&] { return !fs::exists(there / "step-00000002" / "DELETING"); },
                  std::chrono::seconds(30)));
  CHECK_FALSE(fs::exists(there / "step-00000002" / "shard-00000.safetensors"));
  CHECK(fs::exists(there / "step-00000002" / "notes.txt"));
  CHECK(fs::exists(there / "step-00000003" / "COMMIT"));
  CHECK(fs::exists(there / "step-00000004" / "COMMIT"));
}

}  // namespace ckpt::testing

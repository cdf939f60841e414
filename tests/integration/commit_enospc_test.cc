// A full disk exactly at the COMMIT write, through the real daemon: the
// data files and the node manifest fit, COMMIT does not. (The red team's
// run of a full disk hit the data write; the save coordinator's own tests,
// tests/save/commit_failure_test.cc, fail COMMIT through the FileOps seam
// or fill the disk from inside it.)
//
// The storage root is a small tmpfs the test mounts in a mount namespace
// of its own (tests/support/small_filesystem.h), which the daemon it
// starts inherits. tmpfs counts whole pages per file and nothing for
// directory entries, so the pages one save takes are exact: a save of the
// same shape as the one before takes the same pages. The test measures
// step-2's (after step-1 made the job's first files), leaves one page
// fewer free for step-3, and step-3's COMMIT, its last page, meets ENOSPC
// from the kernel. Skipped (with the reason) where no tmpfs can be
// mounted.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "integration/daemon_fixture.h"
#include "support/skip.h"
#include "support/small_filesystem.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

uint64_t FreeBytes(const std::string& path) {
  struct statvfs st {};
  REQUIRE(::statvfs(path.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

// Writes `bytes` of ballast in a file at `path`; every write checked.
void WriteBallast(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  INFO("open " << path << ": " << std::strerror(errno));
  REQUIRE(fd >= 0);
  const std::vector<char> chunk(64 << 10, 'b');
  uint64_t left = bytes;
  while (left > 0) {
    const size_t n = left < chunk.size() ? static_cast<size_t>(left) : chunk.size();
    const ssize_t written = ::write(fd, chunk.data(), n);
    if (written < 0 && errno == EINTR) continue;
    INFO("write " << path << ": " << (written < 0 ? std::strerror(errno) : "short"));
    REQUIRE(written > 0);
    left -= static_cast<uint64_t>(written);
  }
  REQUIRE(::close(fd) == 0);
}

ProcessResult Save(const DaemonProcess& daemon, int step) {
  return RunProcess({LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "job",
                     "--ranks", "1", "--tensors", "4", "--bytes-per-rank",
                     std::to_string(1 << 20), "--saves", "1", "--first-step",
                     std::to_string(step)});
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE(
    "a save whose COMMIT write alone meets a full disk fails naming ENOSPC, "
    "leaves no COMMIT and none of its files, keeps LATEST, gives the space "
    "back, and commits once there is room",
    "[integration][enospc][mount]") {
  SmallFileSystem small(32 << 20);
  if (!small.mounted()) CKPT_SKIP(small.skip_reason());
  if (small.type() != "tmpfs") {
    CKPT_SKIP("the exact fill needs tmpfs's page accounting; mounted " + small.type());
  }
  const std::string root = small.path() + "/root";
  REQUIRE(::mkdir(root.c_str(), 0755) == 0);
  DaemonProcess daemon({}, root);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

  {
    const ProcessResult first = Save(daemon, 1);
    INFO(first.out);
    REQUIRE(first.exit_code == 0);
  }
  const uint64_t before_step_2 = FreeBytes(small.path());
  {
    const ProcessResult second = Save(daemon, 2);
    INFO(second.out);
    REQUIRE(second.exit_code == 0);
  }
  const uint64_t save_bytes = before_step_2 - FreeBytes(small.path());
  INFO("a save takes " << save_bytes << " bytes of pages");
  REQUIRE(save_bytes % page == 0);
  REQUIRE(save_bytes > 2 * page);

  // Room for step-3's data files, manifest and marker: one page short of
  // the whole save, COMMIT's.
  const uint64_t free_now = FreeBytes(small.path());
  REQUIRE(free_now > save_bytes);
  WriteBallast(small.path() + "/ballast", free_now - (save_bytes - page));
  const uint64_t before_step_3 = FreeBytes(small.path());
  REQUIRE(before_step_3 == save_bytes - page);

  const ProcessResult third = Save(daemon, 3);
  INFO(third.out);
  CHECK(third.exit_code != 0);
  CHECK(JsonField(third.out, "ok") == "false");
  // Exactly at COMMIT: the data and the manifest were written, and the
  // save's reason is the commit's (the client prints "save N of
  // step-00000003 PHASE_FAILED: commit: ... COMMIT.tmp...: No space ...").
  CHECK_THAT(third.out, Catch::Contains("step-00000003 PHASE_FAILED: commit: "));
  CHECK_THAT(third.out, Catch::Contains("/COMMIT.tmp."));
  CHECK_THAT(third.out, Catch::Contains("No space left on device"));
  // One node, the only writer of its COMMIT: the checkpoint's files go, and
  // so does the space they took.
  // (removed by an I/O worker once the save failed: waited for, 10 s at most)
  for (int i = 0; i < 200 && fs::exists(root + "/job/step-00000003"); ++i) {
    ::usleep(50 * 1000);
  }
  CHECK_FALSE(fs::exists(root + "/job/step-00000003"));
  CHECK(FreeBytes(small.path()) == before_step_3);
  const std::vector<std::string> job = Entries(root + "/job");
  INFO("job/: " << absl::StrJoin(job, " "));
  CHECK(std::none_of(job.begin(), job.end(),
                     [](const std::string& n) { return absl::StrContains(n, ".tmp."); }));
  {
    const ProcessResult latest = RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(),
                                             "list", "job"});
    INFO(latest.out);
    REQUIRE(latest.exit_code == 0);
    CHECK_THAT(latest.out, Catch::Contains("step-00000002"));
    CHECK_THAT(latest.out, !Catch::Contains("step-00000003"));
  }
  // step-2 is still what "latest" loads, bit-exact.
  {
    const ProcessResult load = RunProcess(
        {LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "job", "--ranks", "1",
         "--tensors", "4", "--bytes-per-rank", std::to_string(1 << 20), "--saves", "0",
         "--restore", "--first-step", "3"});
    INFO(load.out);
    REQUIRE(load.exit_code == 0);
    CHECK(JsonField(load.out, "verified") == "true");
  }

  // With room again, the same name saves and commits.
  REQUIRE(::unlink((small.path() + "/ballast").c_str()) == 0);
  const ProcessResult again = Save(daemon, 3);
  INFO(again.out);
  CHECK(again.exit_code == 0);
  CHECK(fs::exists(root + "/job/step-00000003/COMMIT"));
}

}  // namespace ckpt::testing

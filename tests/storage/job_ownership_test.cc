// A job is its first saver's (storage/job_ownership.h): the directory is
// created as theirs with mode 0700, another uid is refused, and an empty
// directory a crash left as the daemon's is handed over. Giving a
// directory away takes root; elsewhere the cases that need it are skipped.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "storage/checkpoint_store.h"
#include "storage/job_ownership.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

constexpr uid_t kAlice = 61001;
constexpr uid_t kBob = 61002;

struct stat StatOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st;
}

TEST_CASE("job ownership: a new job is its saver's, mode 0700, others are "
          "refused, the owner and root come back") {
  if (::geteuid() != 0) CKPT_SKIP("giving a directory to another uid needs root");
  TempDir tmp;
  CheckpointStore store(tmp.path());
  REQUIRE(store.status().ok());
  CHECK_FALSE(JobOwner(store, "j").value().has_value());

  REQUIRE(ClaimJob(store, "j", kAlice).ok());
  const struct stat st = StatOf(tmp.File("j"));
  CHECK(st.st_uid == kAlice);
  CHECK((st.st_mode & 07777) == 0700);
  CHECK(JobOwner(store, "j").value() == std::optional<uid_t>(kAlice));

  absl::Status bob = ClaimJob(store, "j", kBob);
  CHECK(absl::IsPermissionDenied(bob));
  CHECK(absl::StrContains(bob.message(), "owned by uid 61001"));
  CHECK(ClaimJob(store, "j", kAlice).ok());
  CHECK(ClaimJob(store, "j", 0).ok());
  CHECK(StatOf(tmp.File("j")).st_uid == kAlice);  // root does not take it over
}

TEST_CASE("job ownership: an empty job directory of the daemon's own is "
          "handed to the first saver, a non-empty one is not") {
  if (::geteuid() != 0) CKPT_SKIP("giving a directory to another uid needs root");
  TempDir tmp;
  CheckpointStore store(tmp.path());
  REQUIRE(store.status().ok());
  REQUIRE(std::filesystem::create_directory(tmp.File("crashed")));
  REQUIRE(ClaimJob(store, "crashed", kAlice).ok());
  CHECK(StatOf(tmp.File("crashed")).st_uid == kAlice);

  REQUIRE(std::filesystem::create_directory(tmp.File("rootjob")));
  std::ofstream(tmp.File("rootjob/LATEST")) << "step-1\n";
  CHECK(absl::IsPermissionDenied(ClaimJob(store, "rootjob", kAlice)));
  CHECK(StatOf(tmp.File("rootjob")).st_uid == 0u);
}

TEST_CASE("job ownership: job names are validated before any directory is made") {
  TempDir tmp;
  CheckpointStore store(tmp.path());
  REQUIRE(store.status().ok());
  CHECK(absl::IsInvalidArgument(ClaimJob(store, "../escape", ::geteuid())));
  CHECK_FALSE(std::filesystem::exists(tmp.path() + "/../escape"));
}

}  // namespace
}  // namespace ckpt

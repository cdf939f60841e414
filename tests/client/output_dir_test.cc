// The export's output directory (client/output_dir.h): which symlinks on
// the way are followed, and what is refused.
#include "client/output_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

constexpr uid_t kOtherUser = 61006;  // made up: no passwd entry is needed

// The device and inode of the directory open on `fd` or at `path`.
std::pair<dev_t, ino_t> Identity(int fd) {
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  return {st.st_dev, st.st_ino};
}
std::pair<dev_t, ino_t> Identity(const std::string& path) {
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return {st.st_dev, st.st_ino};
}

TEST_CASE("OpenOutputDir makes a missing last component with the mode given, and "
          "follows the caller's own symlinks, relative and absolute",
          "[unit][output_dir]") {
  testing::TempDir dir;
  REQUIRE(::mkdir(dir.File("real").c_str(), 0755) == 0);
  REQUIRE(::symlink(dir.File("real").c_str(), dir.File("abs").c_str()) == 0);
  REQUIRE(::symlink("real", dir.File("rel").c_str()) == 0);
  REQUIRE(::symlink("abs/../real/.", dir.File("chain").c_str()) == 0);
  for (const std::string& path :
       {dir.File("real"), dir.File("abs"), dir.File("rel/"), dir.File("chain")}) {
    absl::StatusOr<UniqueFd> fd = OpenOutputDir(path, 0700);
    INFO(path << ": " << fd.status().ToString());
    REQUIRE(fd.ok());
    CHECK(Identity(fd->get()) == Identity(dir.File("real")));
  }
  const mode_t old_umask = ::umask(0);
  absl::StatusOr<UniqueFd> made = OpenOutputDir(dir.File("abs/new"), 0700);
  ::umask(old_umask);
  REQUIRE(made.ok());
  struct stat st;
  REQUIRE(::stat(dir.File("real/new").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  // Only the last component is made.
  CHECK_FALSE(OpenOutputDir(dir.File("a/b"), 0700).ok());
}

TEST_CASE("OpenOutputDir refuses a file on the way and a symlink loop",
          "[unit][output_dir]") {
  testing::TempDir dir;
  REQUIRE(::close(::creat(dir.File("file").c_str(), 0600)) == 0);
  REQUIRE(::symlink("loop", dir.File("loop").c_str()) == 0);
  absl::StatusOr<UniqueFd> file = OpenOutputDir(dir.File("file"), 0700);
  REQUIRE_FALSE(file.ok());
  CHECK(absl::StrContains(file.status().message(), "is not a directory"));
  CHECK_FALSE(OpenOutputDir(dir.File("loop"), 0700).ok());
}

TEST_CASE("OpenOutputDir refuses another user's symlink, and root's in another "
          "user's directory, naming it, and never touches the target",
          "[unit][output_dir]") {
  if (::geteuid() != 0) CKPT_SKIP("needs root to make files of another uid");
  testing::TempDir dir;
  REQUIRE(::mkdir(dir.File("target").c_str(), 0700) == 0);
  REQUIRE(::mkdir(dir.File("home").c_str(), 0755) == 0);
  REQUIRE(::chown(dir.File("home").c_str(), kOtherUser, kOtherUser) == 0);
  // The user's own link in the user's directory; root's link there (moved
  // in by the user); the user's link in root's directory.
  REQUIRE(::symlink(dir.File("target").c_str(), dir.File("home/out").c_str()) == 0);
  REQUIRE(::lchown(dir.File("home/out").c_str(), kOtherUser, kOtherUser) == 0);
  REQUIRE(::symlink(dir.File("target").c_str(), dir.File("home/roots").c_str()) == 0);
  REQUIRE(::symlink(dir.File("target").c_str(), dir.File("users").c_str()) == 0);
  REQUIRE(::lchown(dir.File("users").c_str(), kOtherUser, kOtherUser) == 0);
  for (const std::string& link : {dir.File("home/out"), dir.File("home/roots"),
                                  dir.File("users")}) {
    for (const std::string& path : {link, link + "/new"}) {
      absl::StatusOr<UniqueFd> fd = OpenOutputDir(path, 0700);
      INFO(path << ": " << fd.status().ToString());
      REQUIRE_FALSE(fd.ok());
      CHECK(fd.status().code() == absl::StatusCode::kFailedPrecondition);
      CHECK(absl::StrContains(fd.status().message(),
                              link + " is a symbolic link of uid"));
    }
  }
  CHECK(::rmdir(dir.File("target").c_str()) == 0);  // still empty
}

}  // namespace
}  // namespace ckpt

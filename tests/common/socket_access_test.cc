// Who may connect (common/socket_access.h, common/unix_listener.h): the
// socket files get exactly the mode and group asked for, a file swapped in
// under the socket's name is refused rather than changed, and the
// credential rule admits root, the daemon's user and the socket group only.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "common/socket_access.h"
#include "common/unix_listener.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

TEST_CASE("socket access: a published socket is 0600 without a group, 0660 "
          "with one, and invisible until published") {
  TempDir tmp;
  const std::string path = tmp.File("s");
  {
    absl::StatusOr<UniqueFd> fd = ListenUnpublished(path, SocketAccess{});
    REQUIRE(fd.ok());
    CHECK(::access(path.c_str(), F_OK) != 0);
    CHECK(ModeOf(UnpublishedSocketPath(path)) == 0600);
    REQUIRE(PublishUnixSocket(path).ok());
    CHECK(ModeOf(path) == 0600);
  }
  const gid_t group = ::getegid();
  absl::StatusOr<UniqueFd> fd = ListenUnpublished(path, SocketAccess{.group = group});
  REQUIRE(fd.ok());  // replaces the stale socket of the block above
  REQUIRE(PublishUnixSocket(path).ok());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0660);
  CHECK(st.st_gid == group);
}

TEST_CASE("socket access: a symlink or a file in the socket's place is "
          "refused, and its target keeps its mode") {
  TempDir tmp;
  const std::string target = tmp.File("precious");
  std::ofstream(target) << "x";
  REQUIRE(::chmod(target.c_str(), 0644) == 0);
  const std::string link = tmp.File("link");
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  absl::Status status = RestrictSocketFile(link, SocketAccess{});
  CHECK_FALSE(status.ok());
  CHECK(ModeOf(target) == 0644);
  status = RestrictSocketFile(target, SocketAccess{});
  CHECK(absl::IsFailedPrecondition(status));
  CHECK(absl::StrContains(status.message(), "not the socket"));
  CHECK(ModeOf(target) == 0644);
}

TEST_CASE("socket access: root, the daemon's user and the socket group "
          "connect, nobody else") {
  const uid_t stranger = 61234;
  const gid_t group = 61000;
  CHECK(MayConnect(SocketAccess{}, 0, 0, {}));
  CHECK(MayConnect(SocketAccess{}, ::geteuid(), 5, {}));
  if (::geteuid() != stranger) {
    CHECK_FALSE(MayConnect(SocketAccess{}, stranger, group, {group}));
    CHECK_FALSE(MayConnect(SocketAccess{.group = group}, stranger, 100, {101}));
    CHECK(MayConnect(SocketAccess{.group = group}, stranger, group, {}));
    CHECK(MayConnect(SocketAccess{.group = group}, stranger, 100, {7, group}));
  }
}

TEST_CASE("socket access: groups are named or numbered, an unknown name is "
          "refused by name") {
  CHECK(ResolveGroup("4242").value() == 4242u);
  CHECK(ResolveGroup("root").value() == 0u);
  absl::StatusOr<gid_t> missing = ResolveGroup("no-such-group-ckptd");
  CHECK(absl::IsNotFound(missing.status()));
  CHECK(absl::StrContains(missing.status().message(), "no-such-group-ckptd"));
}

}  // namespace
}  // namespace ckpt

// NodeLock (storage/node_lock.h) and the InstanceLock under it: one daemon
// per node of a storage root, and the temporaries' tags handed from one
// daemon of a node to the next. flock locks belong to the open file
// description, so two acquisitions in this one process conflict just as
// two daemons do.
#include "storage/node_lock.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/instance_lock.h"
#include "storage/durable_file.h"
#include "support/planted_files.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ReadBytes;
using ::ckpt::testing::Symlink;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteBytes;

TEST_CASE(
    "a second NodeLock of the same node of a root is refused, naming the "
    "lock file and the holder's pid, while another node's is granted",
    "[node_lock]") {
  TempDir root;
  absl::StatusOr<NodeLock> first = NodeLock::Acquire(root.path(), 0);
  INFO(first.status());
  REQUIRE(first.ok());

  const absl::StatusOr<NodeLock> second = NodeLock::Acquire(root.path(), 0);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(second.status().message());
  CHECK_THAT(message, Catch::Contains(absl::StrCat(
                          "another ckptd already serves node 0 of storage root ",
                          root.path())));
  CHECK_THAT(message, Catch::Contains(root.File(".ckptd-node-0000.lock")));
  CHECK_THAT(message, Catch::Contains(absl::StrCat("pid ", ::getpid(), " on host ")));

  const absl::StatusOr<NodeLock> other_node = NodeLock::Acquire(root.path(), 1);
  INFO(other_node.status());
  CHECK(other_node.ok());

  // Released with its holder (as when a daemon exits, however it exits).
  first = absl::UnknownError("dropped");
  CHECK(NodeLock::Acquire(root.path(), 0).ok());
}

TEST_CASE(
    "NodeLock hands the temporaries' tags of earlier daemons of the node to "
    "the next one until a recovery is done, never its own and never a "
    "malformed one",
    "[node_lock]") {
  TempDir root;
  // What a crashed daemon left, with one tag it had not recovered itself.
  WriteBytes(root.File(".ckptd-node-0003.lock"),
             "pid 1 on host gone (node 3)\n"
             "unrecovered_temp_tag 98.def\n"
             "unrecovered_temp_tag ../../etc\n"
             "temp_tag 99.abc\n");
  {
    absl::StatusOr<NodeLock> lock = NodeLock::Acquire(root.path(), 3);
    INFO(lock.status());
    REQUIRE(lock.ok());
    CHECK(lock->earlier_temp_tags() == std::vector<std::string>{"98.def", "99.abc"});
    const std::string record = ReadBytes(root.File(".ckptd-node-0003.lock"));
    CHECK_THAT(record, Catch::StartsWith(absl::StrCat("pid ", ::getpid())));
    CHECK_THAT(record, Catch::Contains(absl::StrCat("temp_tag ", TemporaryTag())));
  }  // crashed during its recovery: the tags stay
  {
    absl::StatusOr<NodeLock> lock = NodeLock::Acquire(root.path(), 3);
    REQUIRE(lock.ok());
    // This process's own tag (the holder just before) is never an earlier
    // daemon's: its temporaries may be in use.
    CHECK(lock->earlier_temp_tags() == std::vector<std::string>{"98.def", "99.abc"});
    REQUIRE(lock->RecoveryDone().ok());
    CHECK(lock->earlier_temp_tags().empty());
  }
  absl::StatusOr<NodeLock> lock = NodeLock::Acquire(root.path(), 3);
  REQUIRE(lock.ok());
  CHECK(lock->earlier_temp_tags().empty());
}

TEST_CASE("NodeLock refuses a symlink planted under the lock file's name",
          "[node_lock][hostile]") {
  TempDir tmp;
  REQUIRE(std::filesystem::create_directory(tmp.File("root")));
  WriteBytes(tmp.File("precious"), "keep");
  Symlink(tmp.File("precious"), tmp.File("root/.ckptd-node-0000.lock"));

  const absl::StatusOr<NodeLock> lock = NodeLock::Acquire(tmp.File("root"), 0);
  REQUIRE_FALSE(lock.ok());
  CHECK(lock.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReadBytes(tmp.File("precious")) == "keep");
}

TEST_CASE(
    "InstanceLock at a path refuses a second holder with the first line of "
    "its record, and a symlink under the path",
    "[instance_lock]") {
  TempDir dir;
  absl::StatusOr<InstanceLock> first =
      InstanceLock::AcquireAt(dir.File("ckptd.sock.lock"), "socket S");
  REQUIRE(first.ok());
  CHECK(first->previous_record().empty());
  REQUIRE(first->WriteRecord("pid 12345\nmore\n").ok());

  const absl::StatusOr<InstanceLock> second =
      InstanceLock::AcquireAt(dir.File("ckptd.sock.lock"), "socket S");
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().message() ==
        absl::StrCat("another ckptd already serves socket S: it holds the lock ",
                     dir.File("ckptd.sock.lock"),
                     " (pid 12345); refusing to start a second daemon"));

  first = absl::UnknownError("dropped");
  absl::StatusOr<InstanceLock> third =
      InstanceLock::AcquireAt(dir.File("ckptd.sock.lock"), "socket S");
  REQUIRE(third.ok());
  CHECK(third->previous_record() == "pid 12345\nmore\n");

  WriteBytes(dir.File("target"), "keep");
  Symlink(dir.File("target"), dir.File("linked.lock"));
  const absl::StatusOr<InstanceLock> linked =
      InstanceLock::AcquireAt(dir.File("linked.lock"), "socket L");
  CHECK_FALSE(linked.ok());
  CHECK(ReadBytes(dir.File("target")) == "keep");
}

}  // namespace
}  // namespace ckpt

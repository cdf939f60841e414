// The directory driver: object_store.h's semantics (the conformance suite),
// and what a directory adds: symlinks planted by others are refused, never
// followed; temporaries are never listed and are removed by
// AbortUnfinished only once old; what a directory cannot hold is refused.
#include "storage/posix_object_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "storage/durable_file.h"
#include "storage/object_store_conformance.h"
#include "support/planted_files.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Age;
using ::ckpt::testing::ReadBytes;
using ::ckpt::testing::Symlink;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteBytes;

std::unique_ptr<PosixObjectStore> OpenStore(const std::string& root) {
  auto store = PosixObjectStore::Open(root);
  INFO(store.status());
  REQUIRE(store.ok());
  return *std::move(store);
}

std::vector<std::string> KeysOf(const ObjectListing& listing) {
  std::vector<std::string> keys;
  for (const ObjectInfo& object : listing.objects) keys.push_back(object.key);
  return keys;
}

bool Mentions(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("posix object store: passes the ObjectStore conformance suite", "[object_store]") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  // 50 keys: the many-keys check's concurrent Puts into one new directory
  // (its pagination point is S3's; 1,100 fsynced files would cost seconds).
  testing::RunObjectStoreConformance(*store, {.many_keys = 50, .replacements = 30});
  // Objects are plain files under the root, named by their keys.
  CHECK(ReadBytes(dir.File("conformance/list/job/top")) == "job/top");
  CHECK(store->Describe("a/b") == dir.File("a/b"));
}

TEST_CASE("posix object store: a symlink under a key's path is refused, never followed",
          "[object_store]") {
  TempDir root, outside;
  WriteBytes(outside.File("secret"), "not yours");
  auto store = OpenStore(root.path());
  // A directory of the key's path is a link to a directory outside.
  Symlink(outside.path(), root.File("evil"));
  // The object itself is a link to a file outside.
  REQUIRE(store->Put("job/ok", "fine").ok());
  Symlink(outside.File("secret"), root.File("job/link"));

  absl::Status put = store->Put("evil/planted", "x");
  INFO(put);
  CHECK(absl::IsFailedPrecondition(put));
  CHECK(Mentions(put, root.File("evil")));
  CHECK_FALSE(std::filesystem::exists(outside.File("planted")));

  std::string buffer(64, '\0');
  for (const std::string& key : {std::string("evil/secret"), std::string("job/link")}) {
    INFO(key);
    auto get = store->Get(key, absl::MakeSpan(buffer));
    INFO(get.status());
    CHECK(absl::IsFailedPrecondition(get.status()));
    auto head = store->Head(key);
    INFO(head.status());
    CHECK(absl::IsFailedPrecondition(head.status()));
    CHECK(absl::IsFailedPrecondition(store->Delete(key)));
  }
  CHECK(buffer == std::string(64, '\0'));

  auto listed = store->List("");
  REQUIRE(listed.ok());
  CHECK(KeysOf(*listed) == std::vector<std::string>{"job/ok"});
  auto rolled = store->List("", "/");
  REQUIRE(rolled.ok());
  CHECK(rolled->prefixes == std::vector<std::string>{"job/"});
  auto through = store->List("evil/");
  CHECK_FALSE(through.ok());  // refused, not listed as empty nor followed

  // A Put over the link replaces the link itself.
  REQUIRE(store->Put("job/link", "mine").ok());
  CHECK(ReadBytes(outside.File("secret")) == "not yours");
  struct stat st;
  REQUIRE(::lstat(root.File("job/link").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(ReadBytes(root.File("job/link")) == "mine");
}

TEST_CASE("posix object store: a temporary is never listed, and AbortUnfinished removes it "
          "only once it is old",
          "[object_store]") {
  TempDir root;
  auto store = OpenStore(root.path());
  REQUIRE(store->Put("job/step-1/shard", "done").ok());
  // What crashed writers left: WriteFileDurably temporaries, one old, one
  // being written now, and an old one of a key outside the prefix.
  const std::string old_tmp = root.File("job/step-1/shard.tmp.4242.0a1b2c.7");
  const std::string fresh_tmp = root.File("job/step-1/other.tmp.4343.ffee01.0");
  WriteBytes(old_tmp, "partial");
  WriteBytes(fresh_tmp, "partial");
  Age(old_tmp);
  REQUIRE(store->Put("jobs/x", "y").ok());
  const std::string elsewhere_tmp = root.File("jobs/x.tmp.4242.0a1b2c.8");
  WriteBytes(elsewhere_tmp, "partial");
  Age(elsewhere_tmp);
  REQUIRE(ParseTemporaryName("shard.tmp.4242.0a1b2c.7").has_value());

  auto listed = store->List("job");
  REQUIRE(listed.ok());
  CHECK(KeysOf(*listed) == std::vector<std::string>{"job/step-1/shard", "jobs/x"});
  // A key of a temporary's form is refused: it could never be listed.
  CHECK(absl::IsInvalidArgument(store->Put("job/a.tmp.1.ab.2", "x")));

  auto aborted = store->AbortUnfinished("job/", absl::Now() - absl::Hours(1));
  INFO(aborted.status());
  REQUIRE(aborted.ok());
  CHECK(*aborted == 1);
  CHECK_FALSE(std::filesystem::exists(old_tmp));
  CHECK(std::filesystem::exists(fresh_tmp));  // its writer may still be at work
  CHECK(std::filesystem::exists(elsewhere_tmp));  // not under "job/"

  // Once the writer is known to be gone (a cutoff after it started).
  auto later = store->AbortUnfinished("job/", absl::Now() + absl::Minutes(1));
  REQUIRE(later.ok());
  CHECK(*later == 1);
  CHECK_FALSE(std::filesystem::exists(fresh_tmp));
  CHECK(std::filesystem::exists(elsewhere_tmp));
  // A string prefix: "jobs/x"'s temporary is under "job".
  auto string_prefix = store->AbortUnfinished("job", absl::Now());
  REQUIRE(string_prefix.ok());
  CHECK(*string_prefix == 1);
  CHECK_FALSE(std::filesystem::exists(elsewhere_tmp));
  // The objects are untouched.
  CHECK(ReadBytes(root.File("job/step-1/shard")) == "done");
  CHECK(ReadBytes(root.File("jobs/x")) == "y");
}

TEST_CASE("posix object store: a key cannot be both an object and a directory of objects",
          "[object_store]") {
  TempDir root;
  auto store = OpenStore(root.path());
  REQUIRE(store->Put("a/b", "inner").ok());
  absl::Status over_dir = store->Put("a", "outer");
  INFO(over_dir);
  CHECK(absl::IsFailedPrecondition(over_dir));
  REQUIRE(store->Put("file", "f").ok());
  absl::Status under_file = store->Put("file/x", "x");
  INFO(under_file);
  CHECK(absl::IsFailedPrecondition(under_file));
  CHECK(Mentions(under_file, root.File("file/x")));
  // Reading under a file finds nothing rather than failing.
  CHECK(absl::IsNotFound(store->Head("file/x").status()));
  CHECK(store->Delete("file/x").ok());
  CHECK(ReadBytes(root.File("file")) == "f");
  CHECK(ReadBytes(root.File("a/b")) == "inner");
}

TEST_CASE("posix object store: other files than regular ones are not objects",
          "[object_store]") {
  TempDir root;
  auto store = OpenStore(root.path());
  REQUIRE(::mkfifo(root.File("fifo").c_str(), 0600) == 0);
  std::string buffer(8, '\0');
  // O_NONBLOCK: refused at once, not waiting for a writer.
  auto get = store->Get("fifo", absl::MakeSpan(buffer));
  INFO(get.status());
  CHECK(absl::IsFailedPrecondition(get.status()));
  auto listed = store->List("");
  REQUIRE(listed.ok());
  CHECK(listed->objects.empty());
  // A name no key can have is not listed either.
  WriteBytes(root.File("not a key"), "x");
  listed = store->List("");
  REQUIRE(listed.ok());
  CHECK(listed->objects.empty());
}

TEST_CASE("posix object store: a root that is a symlink is refused", "[object_store]") {
  TempDir dir;
  REQUIRE(::mkdir(dir.File("real").c_str(), 0755) == 0);
  Symlink(dir.File("real"), dir.File("link"));
  auto store = PosixObjectStore::Open(dir.File("link"));
  CHECK(absl::IsFailedPrecondition(store.status()));
  CHECK(absl::IsNotFound(PosixObjectStore::Open(dir.File("missing")).status()));
}

}  // namespace
}  // namespace ckpt

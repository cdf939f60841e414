// The storage root is untrusted input (issue 9, items 3 and 4): symlinks
// planted under it are refused, never followed, by saves, reads and
// deletions; gc and retention delete only what ckptd made (its marker), so
// a DCP checkpoint copied under the root survives.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "format/manifest_file.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "storage/garbage_collector.h"
#include "support/committed_checkpoint.h"
#include "support/planted_files.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Age;
using ::ckpt::testing::CommitInStore;
using ::ckpt::testing::OneNodeCommitRecord;
using ::ckpt::testing::ReadBytes;
using ::ckpt::testing::Symlink;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteBytes;
namespace fs = std::filesystem;

// A root, and beside it (outside) a directory whose files must survive.
struct Fixture {
  static std::string MakeDir(const TempDir& tmp, const char* name) {
    REQUIRE(fs::create_directory(tmp.File(name)));
    return tmp.File(name);
  }
  TempDir tmp;
  std::string root = MakeDir(tmp, "root");
  std::string outside = MakeDir(tmp, "outside");
  CheckpointStore store{root};

  Fixture() { WriteBytes(outside + "/precious", "keep"); }
  bool OutsideIntact() const { return ReadBytes(outside + "/precious") == "keep"; }

  v1::CommitRecord Record(const std::string& job, const std::string& name,
                          int64_t micros) const {
    return OneNodeCommitRecord(job, name, micros);
  }
  void Commit(const std::string& job, const std::string& name, int64_t micros) {
    CommitInStore(store, job, name, micros);
  }
  // A PyTorch DCP checkpoint as a user would copy it in.
  std::string CopyInDcp(const std::string& job, const std::string& name) {
    const std::string dir = absl::StrCat(root, "/", job, "/", name);
    fs::create_directories(dir);
    WriteBytes(dir + "/.metadata", "dcp metadata");
    WriteBytes(dir + "/__0_0.distcp", "dcp data");
    Age(dir);
    return dir;
  }
  // What the last Gc() left, with why.
  std::vector<std::string> left;
  std::vector<std::string> Gc(const std::string& job = "") {
    auto gc = CollectGarbage(store, job, [](const std::string&, const std::string&) {
      return false;
    });
    INFO(gc.status());
    REQUIRE(gc.ok());
    left = gc->left;
    return gc->removed;
  }
};

TEST_CASE("PrepareForSave writes ckptd's marker into the checkpoint directory",
          "[storage_root]") {
  Fixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  const std::string marker =
      f.store.CheckpointDir("job", "step-1") + "/" + std::string(kMarkerFileName);
  CHECK(ReadBytes(marker) == kMarkerContent);
  auto marked = f.store.IsMarked("job", "step-1");
  REQUIRE(marked.ok());
  CHECK(*marked);
}

TEST_CASE("gc leaves a DCP checkpoint copied under the root and removes ckptd's garbage",
          "[storage_root][hostile]") {
  Fixture f;
  REQUIRE(f.store.PrepareForSave("job", "crashed", 0).ok());
  WriteBytes(f.store.CheckpointDir("job", "crashed") + "/shard-00001.safetensors", "x");
  Age(f.store.CheckpointDir("job", "crashed"));
  const std::string dcp = f.CopyInDcp("job", "from-dcp");
  f.Commit("job", "step-2", 2'000'000);

  CHECK(f.Gc() == std::vector<std::string>{"job/crashed"});
  REQUIRE(f.left.size() == 1);
  CHECK(absl::StartsWith(f.left[0], "job/from-dcp: not created by ckptd"));
  CHECK(ReadBytes(dcp + "/.metadata") == "dcp metadata");
  CHECK(ReadBytes(dcp + "/__0_0.distcp") == "dcp data");
  CHECK_FALSE(fs::exists(f.store.CheckpointDir("job", "crashed")));
  // Still there on the next pass, and reported as not committed.
  CHECK(f.Gc().empty());
  CHECK(fs::exists(dcp + "/__0_0.distcp"));
}

TEST_CASE("PrepareForSave refuses to save into a directory ckptd did not create",
          "[storage_root][hostile]") {
  Fixture f;
  const std::string dcp = f.CopyInDcp("job", "step-1");
  CHECK(f.store.PrepareForSave("job", "step-1", 0).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK_FALSE(fs::exists(dcp + "/" + std::string(kMarkerFileName)));
  CHECK(ReadBytes(dcp + "/__0_0.distcp") == "dcp data");
}

TEST_CASE(
    "gc never follows a job or checkpoint directory that is a symlink out of "
    "the root",
    "[storage_root][hostile]") {
  Fixture f;
  // The outside directory looks like a ckptd leftover, marker and all.
  WriteBytes(f.outside + "/" + std::string(kMarkerFileName), std::string(kMarkerContent));
  Age(f.outside);
  f.Commit("job", "step-2", 2'000'000);
  Symlink(f.outside, f.store.CheckpointDir("job", "linked"));
  fs::create_directories(f.tmp.File("outside-job/crashed"));
  WriteBytes(f.tmp.File("outside-job/crashed/") + std::string(kMarkerFileName),
             std::string(kMarkerContent));
  Age(f.tmp.File("outside-job/crashed"));
  Symlink(f.tmp.File("outside-job"), f.store.JobDir("other"));

  CHECK(f.Gc().empty());
  CHECK(f.OutsideIntact());
  CHECK(fs::exists(f.tmp.File("outside-job/crashed")));
  CHECK(fs::is_symlink(f.store.CheckpointDir("job", "linked")));
}

TEST_CASE("DeleteUncommitted and RemoveNodePart refuse a symlinked checkpoint directory",
          "[storage_root][hostile]") {
  Fixture f;
  WriteBytes(f.outside + "/" + std::string(kMarkerFileName), std::string(kMarkerContent));
  WriteBytes(f.outside + "/node-0000.manifest", "keep");
  REQUIRE(fs::create_directory(f.store.JobDir("job")));
  Symlink(f.outside, f.store.CheckpointDir("job", "linked"));

  CHECK(f.store.DeleteUncommitted("job", "linked").code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(f.store.DeleteCommitted("job", "linked").code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(f.store.RemoveNodePart("job", "linked", 0, {"precious"}).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(f.OutsideIntact());
  CHECK(ReadBytes(f.outside + "/node-0000.manifest") == "keep");
}

TEST_CASE("PrepareForSave refuses a job or checkpoint directory that is a symlink",
          "[storage_root][hostile]") {
  Fixture f;
  Symlink(f.outside, f.store.JobDir("linked-job"));
  CHECK(f.store.PrepareForSave("linked-job", "step-1", 0).code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(fs::create_directory(f.store.JobDir("job")));
  Symlink(f.outside, f.store.CheckpointDir("job", "linked"));
  CHECK(f.store.PrepareForSave("job", "linked", 0).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(fs::directory_iterator(f.outside)->path().filename() == "precious");
  CHECK(f.OutsideIntact());
}

TEST_CASE("A symlinked LATEST or COMMIT is refused by readers, not followed",
          "[storage_root][hostile]") {
  Fixture f;
  f.Commit("job", "step-1", 100);
  // A COMMIT outside, framed correctly: following the link would load it.
  WriteBytes(f.outside + "/COMMIT", FrameMessage(kCommitMagic, f.Record("job", "step-2", 200)));
  REQUIRE(fs::create_directory(f.store.CheckpointDir("job", "step-2")));
  Symlink(f.outside + "/COMMIT", f.store.CheckpointDir("job", "step-2") + "/COMMIT");
  CHECK(f.store.ReadCommit("job", "step-2").status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK_FALSE(f.store.IsCommitted("job", "step-2"));

  WriteBytes(f.outside + "/LATEST", "step-2\n");
  REQUIRE(fs::remove(f.store.JobDir("job") + "/LATEST"));
  Symlink(f.outside + "/LATEST", f.store.JobDir("job") + "/LATEST");
  CHECK(f.store.ResolveLatest("job").status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("UpdateLatest replaces a planted LATEST symlink without writing through it",
          "[storage_root][hostile]") {
  Fixture f;
  f.Commit("job", "step-1", 100);
  REQUIRE(fs::remove(f.store.JobDir("job") + "/LATEST"));
  Symlink(f.outside + "/precious", f.store.JobDir("job") + "/LATEST");
  REQUIRE(f.store.PrepareForSave("job", "step-2", 0).ok());
  REQUIRE(f.store.WriteCommit(f.Record("job", "step-2", 200)).ok());
  REQUIRE(f.store.UpdateLatest("job", "step-2", 200).ok());
  CHECK_FALSE(fs::is_symlink(f.store.JobDir("job") + "/LATEST"));
  CHECK(ReadBytes(f.store.JobDir("job") + "/LATEST") == "step-2\n");
  CHECK(f.OutsideIntact());
}

TEST_CASE("A store whose root is a symlink refuses to start",
          "[storage_root][hostile]") {
  Fixture f;
  Symlink(f.outside, f.tmp.File("linked-root"));
  CheckpointStore store(f.tmp.File("linked-root"));
  CHECK(store.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(store.List("").status().code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ckpt

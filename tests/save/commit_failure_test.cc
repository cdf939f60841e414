// A COMMIT that cannot be written, a full disk above all: the save fails
// with the reason, no COMMIT and no temporary of one is left, the previous
// checkpoint and LATEST are untouched, and a single node (the only writer
// of its COMMIT) removes the failed checkpoint's files, so the full disk is
// not left full of a checkpoint that can never commit. Several nodes leave
// them for gc: another node may be committing with them.
//
// The step failures go through the save's FileOps seam; the real ENOSPC
// comes from a small file system the test mounts and fills just before
// COMMIT is written (reported skipped where it cannot mount one).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "save/save_harness.h"
#include "storage/durable_file.h"
#include "support/planted_files.h"
#include "support/skip.h"
#include "support/small_filesystem.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::PathsUnder;
using ::ckpt::testing::ProgressLog;
using ::ckpt::testing::SaveHarness;
using ::ckpt::testing::SaveHarnessOptions;
using ::ckpt::testing::SmallFileSystem;
using ::ckpt::testing::TempDir;

v1::SaveProgress WaitForEnd(const ProgressLog& log) {
  std::optional<v1::SaveProgress> end = log.WaitForEnd();
  INFO(log.Describe());
  REQUIRE(end.has_value());
  return *end;
}

// Paths of COMMIT or of a temporary of one.
bool IsCommitOrItsTemporary(const std::string& path) {
  return absl::EndsWith(path, "/COMMIT") || absl::StrContains(path, "/COMMIT.tmp.");
}

// The real file operations, except that one step of COMMIT's durable write
// fails with ENOSPC, as on a full disk.
class FullDiskAtCommit final : public FileOps {
 public:
  enum class Step { kCreate, kWrite, kFsync, kRename, kFsyncDir };
  explicit FullDiskAtCommit(Step step) : step_(step) {}

  int failures() const { return failures_.load(); }

  absl::StatusOr<int> CreateExclusive(const StorageDir& dir,
                                      const std::string& name) override {
    if (step_ == Step::kCreate && IsCommitTemporary(name)) {
      return Fail(absl::StrCat("create ", dir.PathOf(name)));
    }
    return FileOps::CreateExclusive(dir, name);
  }
  absl::Status WriteAll(int fd, absl::string_view bytes,
                        const std::string& path) override {
    if (step_ == Step::kWrite && IsCommitTemporary(path)) {
      return Fail(absl::StrCat("write ", path));
    }
    return FileOps::WriteAll(fd, bytes, path);
  }
  absl::Status Fsync(int fd, const std::string& path) override {
    if (step_ == Step::kFsync && IsCommitTemporary(path)) {
      return Fail(absl::StrCat("fsync ", path));
    }
    return FileOps::Fsync(fd, path);
  }
  absl::Status Rename(const StorageDir& dir, const std::string& from,
                      const std::string& to) override {
    if (step_ == Step::kRename && to == "COMMIT") {
      return Fail(absl::StrCat("rename ", dir.PathOf(from)));
    }
    absl::Status renamed = FileOps::Rename(dir, from, to);
    // WriteFileDurably fsyncs the directory next, on this thread.
    committed_rename_ = renamed.ok() && to == "COMMIT";
    return renamed;
  }
  absl::Status FsyncDir(const StorageDir& dir) override {
    const bool after_commit = std::exchange(committed_rename_, false);
    if (step_ == Step::kFsyncDir && after_commit) {
      return Fail(absl::StrCat("fsync ", dir.path()));
    }
    return FileOps::FsyncDir(dir);
  }

 private:
  static bool IsCommitTemporary(absl::string_view name_or_path) {
    return absl::StrContains(name_or_path, "COMMIT.tmp.");
  }
  absl::Status Fail(absl::string_view what) {
    ++failures_;
    return ::ckpt::ErrnoToStatus(ENOSPC, what);
  }

  const Step step_;
  std::atomic<int> failures_{0};
  static thread_local bool committed_rename_;
};

thread_local bool FullDiskAtCommit::committed_rename_ = false;

const char* StepName(FullDiskAtCommit::Step step) {
  switch (step) {
    case FullDiskAtCommit::Step::kCreate: return "create";
    case FullDiskAtCommit::Step::kWrite: return "write";
    case FullDiskAtCommit::Step::kFsync: return "fsync";
    case FullDiskAtCommit::Step::kRename: return "rename";
    case FullDiskAtCommit::Step::kFsyncDir: return "directory fsync";
  }
  return "?";
}

// Commits `checkpoint` of a one-rank job through a fresh harness.
void SaveCommitted(const std::string& root, const std::string& checkpoint) {
  SaveHarness harness(root);
  const std::shared_ptr<ProgressLog> log =
      harness.Save(harness.AddRank(0, 1, 1), checkpoint);
  const v1::SaveProgress end = WaitForEnd(*log);
  INFO(log->Describe());
  REQUIRE(end.phase() == v1::PHASE_COMMITTED);
}

TEST_CASE(
    "SaveCoordinator on one node fails the save when any step of COMMIT's "
    "write meets a full disk, and leaves neither COMMIT, a temporary of it "
    "nor any file of the checkpoint, with the previous one still LATEST",
    "[save_coordinator][commit][enospc]") {
  using Step = FullDiskAtCommit::Step;
  const Step step = GENERATE(Step::kCreate, Step::kWrite, Step::kFsync,
                             Step::kRename, Step::kFsyncDir);
  INFO("failing COMMIT's " << StepName(step));
  TempDir root;
  SaveCommitted(root.path(), "step-1");
  const std::vector<std::string> before = PathsUnder(root.path());

  FullDiskAtCommit ops(step);
  SaveHarnessOptions options;
  options.file_ops = &ops;
  SaveHarness harness(root.path(), options);
  const std::shared_ptr<ProgressLog> log =
      harness.Save(harness.AddRank(0, 1, 1), "step-2");
  const v1::SaveProgress end = WaitForEnd(*log);
  INFO(log->Describe());
  CHECK(end.phase() == v1::PHASE_FAILED);
  CHECK_THAT(end.reason(), Catch::StartsWith("commit: "));
  CHECK_THAT(end.reason(), Catch::Contains("No space left on device"));
  CHECK(ops.failures() == 1);

  harness.StopWorkers();  // the removal of the files runs on a worker
  const std::vector<std::string> after = PathsUnder(root.path());
  INFO("before: " << absl::StrJoin(before, " ") << "\nafter: "
                  << absl::StrJoin(after, " "));
  CHECK(after == before);
  CHECK_FALSE(harness.store().IsCommitted(SaveHarness::kJob, "step-2"));
  const absl::StatusOr<std::string> latest =
      harness.store().ResolveLatest(SaveHarness::kJob);
  REQUIRE(latest.ok());
  CHECK(*latest == "step-1");
  CHECK(harness.pool().free_bytes() == harness.pool().pool_bytes());
}

TEST_CASE(
    "SaveCoordinator on two nodes fails the save when COMMIT's write meets a "
    "full disk, leaves no COMMIT or temporary of it, and leaves the nodes' "
    "files for gc",
    "[save_coordinator][commit][enospc][multi-node]") {
  TempDir root;
  FullDiskAtCommit ops0(FullDiskAtCommit::Step::kWrite);
  FullDiskAtCommit ops1(FullDiskAtCommit::Step::kWrite);
  SaveHarnessOptions options0, options1;
  options0.node_id = 0;
  options1.node_id = 1;
  options0.nodes = options1.nodes = 2;
  options0.file_ops = &ops0;
  options1.file_ops = &ops1;
  SaveHarness node0(root.path(), options0);
  SaveHarness node1(root.path(), options1);
  const std::shared_ptr<ProgressLog> first =
      node0.Save(node0.AddRank(0, 2, 1), "step-1");
  REQUIRE(first->WaitForPhase(v1::PHASE_DURABLE).has_value());
  const std::shared_ptr<ProgressLog> last =
      node1.Save(node1.AddRank(1, 2, 1), "step-1");

  for (const auto& log : {first, last}) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_FAILED);
    CHECK_THAT(end.reason(), Catch::Contains("No space left on device"));
  }
  node0.StopWorkers();
  node1.StopWorkers();
  const std::vector<std::string> paths = PathsUnder(root.path());
  INFO(absl::StrJoin(paths, " "));
  CHECK(std::none_of(paths.begin(), paths.end(), IsCommitOrItsTemporary));
  // Either node may have been the one to commit with the other's manifest.
  CHECK(std::count(paths.begin(), paths.end(), "job/step-1/node-0000.manifest") == 1);
  CHECK(std::count(paths.begin(), paths.end(), "job/step-1/node-0001.manifest") == 1);
  CHECK_FALSE(node0.store().IsCommitted(SaveHarness::kJob, "step-1"));
}

// The real file operations; the first write of a COMMIT temporary first
// fills the file system, so that the write itself meets the kernel's
// ENOSPC.
class FillBeforeCommit final : public FileOps {
 public:
  explicit FillBeforeCommit(SmallFileSystem* fs) : fs_(fs) {}

  absl::Status WriteAll(int fd, absl::string_view bytes,
                        const std::string& path) override {
    if (absl::StrContains(path, "/COMMIT.tmp.") && !filled_.exchange(true)) {
      std::string error;
      if (!fs_->Fill(&error)) return absl::InternalError(error);
    }
    return FileOps::WriteAll(fd, bytes, path);
  }
  bool filled() const { return filled_.load(); }

 private:
  SmallFileSystem* const fs_;
  std::atomic<bool> filled_{false};
};

TEST_CASE(
    "SaveCoordinator on a file system that is full when COMMIT is written "
    "fails the save with ENOSPC, leaves nothing of it behind, and saves the "
    "same checkpoint once there is room",
    "[save_coordinator][commit][enospc][mount]") {
  SmallFileSystem fs(8 << 20);
  if (!fs.mounted()) CKPT_SKIP(fs.skip_reason());
  INFO("file system: " << fs.type() << " at " << fs.path());
  const std::string root = fs.path() + "/root";
  REQUIRE(::mkdir(root.c_str(), 0755) == 0);
  SaveCommitted(root, "step-1");
  const std::vector<std::string> before = PathsUnder(root);

  {
    FillBeforeCommit ops(&fs);
    SaveHarnessOptions options;
    options.file_ops = &ops;
    SaveHarness harness(root, options);
    const std::shared_ptr<ProgressLog> log =
        harness.Save(harness.AddRank(0, 1, 1), "step-2");
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    REQUIRE(ops.filled());
    CHECK(end.phase() == v1::PHASE_FAILED);
    CHECK_THAT(end.reason(), Catch::StartsWith("commit: "));
    CHECK_THAT(end.reason(), Catch::Contains("No space left on device"));
    harness.StopWorkers();  // removes the files, on the full disk
    const std::vector<std::string> after = PathsUnder(root);
    INFO("before: " << absl::StrJoin(before, " ") << "\nafter: "
                    << absl::StrJoin(after, " "));
    CHECK(after == before);
    const absl::StatusOr<std::string> latest =
        harness.store().ResolveLatest(SaveHarness::kJob);
    REQUIRE(latest.ok());
    CHECK(*latest == "step-1");
  }

  // No dead end: with room again, the same name saves and commits.
  REQUIRE(fs.Unfill());
  SaveCommitted(root, "step-2");
}

}  // namespace
}  // namespace ckpt

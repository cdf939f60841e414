// Tests of the durable small-file write protocol (write temp -> fsync ->
// rename -> fsync dir). A FileOps that fails one chosen step on purpose
// checks, for every step, the Status that comes back, that no later step
// ran, that the old content of the target survives every failure before the
// rename, and that no temporary is left behind.
#include "storage/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <atomic>
#include <thread>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

enum class Step {
  kNone,
  kCreateExclusive,
  kWriteAll,
  kFsync,
  kRename,
  kFsyncDir
};

const char* StepName(Step step) {
  switch (step) {
    case Step::kNone:
      return "none";
    case Step::kCreateExclusive:
      return "CreateExclusive";
    case Step::kWriteAll:
      return "WriteAll";
    case Step::kFsync:
      return "Fsync";
    case Step::kRename:
      return "Rename";
    case Step::kFsyncDir:
      return "FsyncDir";
  }
  return "?";
}

// The real syscalls, except that step `fail` returns a distinctive error
// instead (WriteAll first writes half the bytes, like a disk filling up
// mid-write). Records the steps called and their arguments.
class FailingFileOps final : public FileOps {
 public:
  explicit FailingFileOps(Step fail) : fail_(fail) {}

  std::vector<Step> calls;
  std::string created_path;
  int created_fd = -1;
  int written_fd = -1;
  int synced_fd = -1;
  std::string renamed_from, renamed_to, synced_dir;

  // The error the failing step returns.
  absl::Status Injected() const {
    return absl::DataLossError(
        absl::StrCat("injected failure of ", StepName(fail_)));
  }

  absl::StatusOr<int> CreateExclusive(const StorageDir& dir,
                                      const std::string& name) override {
    calls.push_back(Step::kCreateExclusive);
    created_path = dir.PathOf(name);
    if (fail_ == Step::kCreateExclusive) return Injected();
    absl::StatusOr<int> fd = FileOps::CreateExclusive(dir, name);
    if (fd.ok()) created_fd = *fd;
    return fd;
  }
  absl::Status WriteAll(int fd, absl::string_view bytes,
                        const std::string& path) override {
    calls.push_back(Step::kWriteAll);
    written_fd = fd;
    if (fail_ == Step::kWriteAll) {
      FileOps::WriteAll(fd, bytes.substr(0, bytes.size() / 2), path)
          .IgnoreError();
      return Injected();
    }
    return FileOps::WriteAll(fd, bytes, path);
  }
  absl::Status Fsync(int fd, const std::string& path) override {
    calls.push_back(Step::kFsync);
    synced_fd = fd;
    if (fail_ == Step::kFsync) return Injected();
    return FileOps::Fsync(fd, path);
  }
  absl::Status Rename(const StorageDir& dir, const std::string& from,
                      const std::string& to) override {
    calls.push_back(Step::kRename);
    renamed_from = dir.PathOf(from);
    renamed_to = dir.PathOf(to);
    if (fail_ == Step::kRename) return Injected();
    return FileOps::Rename(dir, from, to);
  }
  absl::Status FsyncDir(const StorageDir& dir) override {
    calls.push_back(Step::kFsyncDir);
    synced_dir = dir.path();
    if (fail_ == Step::kFsyncDir) return Injected();
    return FileOps::FsyncDir(dir);
  }

 private:
  const Step fail_;
};

std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string MustRead(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadSmallFile(path);
  REQUIRE(bytes.ok());
  return *bytes;
}

const std::vector<Step> kProtocol = {Step::kCreateExclusive, Step::kWriteAll,
                                     Step::kFsync, Step::kRename,
                                     Step::kFsyncDir};

TEST_CASE(
    "WriteFileDurably runs the steps in protocol order on a temporary "
    "in the same directory",
    "[durable_file]") {
  TempDir dir;
  FailingFileOps ops(Step::kNone);
  REQUIRE(WriteFileDurably(dir.path(), "COMMIT", "new bytes", ops).ok());

  CHECK(ops.calls == kProtocol);
  const std::string target = dir.File("COMMIT");
  CHECK(absl::StartsWith(ops.created_path,
                         absl::StrCat(target, ".tmp.", ::getpid(), ".")));
  CHECK(ops.written_fd == ops.created_fd);
  CHECK(ops.synced_fd == ops.created_fd);
  CHECK(ops.renamed_from == ops.created_path);
  CHECK(ops.renamed_to == target);
  CHECK(ops.synced_dir == dir.path());
  CHECK(MustRead(target) == "new bytes");
  CHECK(DirEntries(dir.path()) == std::vector<std::string>{"COMMIT"});
}

TEST_CASE("WriteFileDurably replaces the content of an existing file",
          "[durable_file]") {
  TempDir dir;
  REQUIRE(WriteFileDurably(dir.path(), "LATEST", "old, longer content\n").ok());
  REQUIRE(WriteFileDurably(dir.path(), "LATEST", "new\n").ok());
  CHECK(MustRead(dir.File("LATEST")) == "new\n");
  CHECK(DirEntries(dir.path()) == std::vector<std::string>{"LATEST"});
}

TEST_CASE("WriteFileDurably writes an empty file", "[durable_file]") {
  TempDir dir;
  REQUIRE(WriteFileDurably(dir.path(), "empty", "").ok());
  CHECK(MustRead(dir.File("empty")).empty());
}

TEST_CASE(
    "WriteFileDurably returns a failing step's error, runs no later "
    "step and keeps the old content when the failure is before the "
    "rename",
    "[durable_file]") {
  const Step fail = GENERATE(Step::kCreateExclusive, Step::kWriteAll,
                             Step::kFsync, Step::kRename);
  INFO("failing step: " << StepName(fail));
  TempDir dir;
  REQUIRE(WriteFileDurably(dir.path(), "COMMIT", "old content").ok());

  FailingFileOps ops(fail);
  const absl::Status status =
      WriteFileDurably(dir.path(), "COMMIT", "new content, longer", ops);

  CHECK(status == ops.Injected());
  // The protocol stopped at the failing step.
  REQUIRE(!ops.calls.empty());
  CHECK(ops.calls.back() == fail);
  const auto upto = std::find(kProtocol.begin(), kProtocol.end(), fail) + 1;
  CHECK(ops.calls == std::vector<Step>(kProtocol.begin(), upto));
  // Readers still see the old, complete file and nothing else.
  CHECK(MustRead(dir.File("COMMIT")) == "old content");
  CHECK(DirEntries(dir.path()) == std::vector<std::string>{"COMMIT"});
}

TEST_CASE(
    "WriteFileDurably returns the error of a failing directory fsync "
    "after the new content is in place",
    "[durable_file]") {
  TempDir dir;
  REQUIRE(WriteFileDurably(dir.path(), "COMMIT", "old content").ok());

  FailingFileOps ops(Step::kFsyncDir);
  const absl::Status status =
      WriteFileDurably(dir.path(), "COMMIT", "new content", ops);

  CHECK(status == ops.Injected());
  CHECK(ops.calls == kProtocol);
  // The rename happened, so the file is the new one (the caller must treat
  // the write as failed anyway: the rename may not survive a power loss).
  CHECK(MustRead(dir.File("COMMIT")) == "new content");
  CHECK(DirEntries(dir.path()) == std::vector<std::string>{"COMMIT"});
}

TEST_CASE(
    "WriteFileDurably keeps old content and leaves no temporary when "
    "the first write of a file fails",
    "[durable_file]") {
  const Step fail = GENERATE(Step::kWriteAll, Step::kFsync, Step::kRename);
  INFO("failing step: " << StepName(fail));
  TempDir dir;
  FailingFileOps ops(fail);
  CHECK(WriteFileDurably(dir.path(), "COMMIT", "bytes", ops) == ops.Injected());
  // No target appeared, not even a partial one.
  CHECK(DirEntries(dir.path()).empty());
}

TEST_CASE(
    "concurrent WriteFileDurably calls for one name use distinct "
    "temporaries and leave one whole content",
    "[durable_file]") {
  TempDir dir;
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const std::string content(1000 + t, static_cast<char>('a' + t));
        if (!WriteFileDurably(dir.path(), "LATEST", content).ok()) ++failures;
      }
    });
  }
  for (auto& w : writers) w.join();
  CHECK(failures == 0);
  const std::string content = MustRead(dir.File("LATEST"));
  REQUIRE(content.size() >= 1000);
  CHECK(content == std::string(content.size(), content[0]));
  CHECK(DirEntries(dir.path()) == std::vector<std::string>{"LATEST"});
}

TEST_CASE("WriteFileDurably into a missing directory is NotFound",
          "[durable_file]") {
  TempDir dir;
  CHECK(WriteFileDurably(dir.File("missing"), "COMMIT", "x").code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("ReadSmallFile of a missing file is NotFound naming the path",
          "[durable_file]") {
  TempDir dir;
  const absl::StatusOr<std::string> bytes = ReadSmallFile(dir.File("nope"));
  REQUIRE(bytes.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(bytes.status().message()),
             Catch::Contains(dir.File("nope")));
}

TEST_CASE(
    "ReadSmallFile returns every byte of a file larger than its read "
    "chunk",
    "[durable_file]") {
  TempDir dir;
  std::string data(200000, '\0');
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<char>((i * 7 + (i >> 16)) & 0xff);
  }
  REQUIRE(WriteFileDurably(dir.path(), "big", data).ok());
  CHECK(MustRead(dir.File("big")) == data);
}

TEST_CASE(
    "MakeDirDurably creates a directory and succeeds again when it "
    "exists",
    "[durable_file]") {
  TempDir dir;
  REQUIRE(MakeDirDurably(dir.path(), "job").ok());
  CHECK(std::filesystem::is_directory(dir.File("job")));
  // A file inside must survive the second call.
  REQUIRE(WriteFileDurably(dir.File("job"), "keep", "x").ok());
  REQUIRE(MakeDirDurably(dir.path(), "job").ok());
  CHECK(std::filesystem::is_directory(dir.File("job")));
  CHECK(MustRead(dir.File("job") + "/keep") == "x");
}

TEST_CASE("MakeDirDurably under a missing parent is NotFound",
          "[durable_file]") {
  TempDir dir;
  CHECK(MakeDirDurably(dir.File("missing"), "job").code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE(
    "RemoveTree removes a directory with files and subdirectories and "
    "accepts a missing path",
    "[durable_file]") {
  TempDir dir;
  REQUIRE(MakeDirDurably(dir.path(), "ckpt").ok());
  REQUIRE(MakeDirDurably(dir.File("ckpt"), "sub").ok());
  REQUIRE(WriteFileDurably(dir.File("ckpt"), "a", "1").ok());
  REQUIRE(WriteFileDurably(dir.File("ckpt") + "/sub", "b", "2").ok());
  absl::StatusOr<StorageDir> root = StorageDir::OpenRoot(dir.path());
  REQUIRE(root.ok());

  REQUIRE(root->RemoveTree("ckpt").ok());
  CHECK_FALSE(std::filesystem::exists(dir.File("ckpt")));
  CHECK(root->RemoveTree("ckpt").ok());
}

// A directory outside the "root" with one file, and a TempDir root.
struct OutsideFixture {
  TempDir root, outside;
  OutsideFixture() { REQUIRE(WriteFileDurably(outside.path(), "precious", "keep").ok()); }
  void Link(const std::string& name, const std::string& target) {
    REQUIRE(::symlink(target.c_str(), root.File(name).c_str()) == 0);
  }
};

TEST_CASE(
    "RemoveTree unlinks a symlink inside the tree and at its top as a link "
    "and never deletes what it points to",
    "[durable_file][hostile]") {
  OutsideFixture f;
  REQUIRE(MakeDirDurably(f.root.path(), "ckpt").ok());
  REQUIRE(::symlink(f.outside.path().c_str(), (f.root.File("ckpt") + "/sub").c_str()) == 0);
  f.Link("linked", f.outside.path());
  absl::StatusOr<StorageDir> root = StorageDir::OpenRoot(f.root.path());
  REQUIRE(root.ok());

  REQUIRE(root->RemoveTree("ckpt").ok());
  REQUIRE(root->RemoveTree("linked").ok());
  CHECK_FALSE(std::filesystem::exists(f.root.File("ckpt")));
  CHECK_FALSE(std::filesystem::is_symlink(f.root.File("linked")));
  CHECK(MustRead(f.outside.File("precious")) == "keep");
}

TEST_CASE(
    "WriteFileDurably replaces a symlink planted under the target name "
    "and never writes through it",
    "[durable_file][hostile]") {
  OutsideFixture f;
  f.Link("LATEST", f.outside.File("precious"));
  REQUIRE(WriteFileDurably(f.root.path(), "LATEST", "step-2\n").ok());
  CHECK_FALSE(std::filesystem::is_symlink(f.root.File("LATEST")));
  CHECK(MustRead(f.root.File("LATEST")) == "step-2\n");
  CHECK(MustRead(f.outside.File("precious")) == "keep");
}

TEST_CASE(
    "StorageDir refuses to open, read or enter through a symlink, and "
    "refuses names that climb out",
    "[durable_file][hostile]") {
  OutsideFixture f;
  f.Link("file", f.outside.File("precious"));
  f.Link("dir", f.outside.path());
  absl::StatusOr<StorageDir> root = StorageDir::OpenRoot(f.root.path());
  REQUIRE(root.ok());

  CHECK(root->ReadFile("file", 1 << 20).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(root->OpenSubdir("dir").status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(root->ReadFile("dir/precious", 1 << 20).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(root->MakeSubdir("dir").status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(root->OpenFile("../x", O_RDONLY).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(StorageDir::OpenRoot(f.root.File("dir")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<bool> has = root->HasFile("file");
  CHECK(has.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MustRead(f.outside.File("precious")) == "keep");
}

TEST_CASE("StorageDir::ReadFile refuses a file larger than its limit",
          "[durable_file][hostile]") {
  TempDir dir;
  REQUIRE(WriteFileDurably(dir.path(), "big", std::string(5000, 'x')).ok());
  absl::StatusOr<StorageDir> root = StorageDir::OpenRoot(dir.path());
  REQUIRE(root.ok());
  CHECK(root->ReadFile("big", 4096).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(root->ReadFile("big", 5000).ok());
}

}  // namespace
}  // namespace ckpt

// Tests of when ShardWriter touches the file system and of a write of
// several files (the material is ShardFixture's,
// tests/support/shard_fixture.h): a file is created only when its first
// write is due, after every copy that completes later (a GPU's) was
// enqueued, in a directory asked for then; several files are one stream of
// windows, staged without waiting for each other's writes, trimmed and
// fsynced after every write, at most kMaxOpenDataFiles open at a time; any
// failure leaves none of them.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"
#include "save/shard_writer.h"
#include "session/memory_source.h"
#include "storage/durable_file.h"
#include "storage/storage_dir.h"
#include "support/shard_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::CheckLeftNoFile;
using ::ckpt::testing::FileExists;
using ::ckpt::testing::PoolHoldingTheFile;
using ::ckpt::testing::ReadWholeFile;
using ::ckpt::testing::ShardFixture;
using ::ckpt::testing::WriteOne;

constexpr uint32_t kQueueDepth = ShardFixture::kQueueDepth;

// Copies that complete only when waited for, the way a GPU's D2H copies
// complete on their stream later: Enqueue only records the spans, Ready is
// false until a Wait, and Wait (or Drain) copies everything enqueued up to
// its ticket from `source`.
class DeferredCopyOut final : public CopyOutBatch {
 public:
  explicit DeferredCopyOut(MemorySource* source) : source_(source) {}
  absl::StatusOr<uint64_t> Enqueue(absl::Span<const CopySpan> spans) override {
    pending_.emplace_back(spans.begin(), spans.end());
    return ++enqueued_;
  }
  absl::StatusOr<bool> Ready(uint64_t ticket) override { return ticket <= completed_; }
  absl::Status Wait(uint64_t ticket) override {
    while (completed_ < ticket) {
      RETURN_IF_ERROR(source_->Read(pending_[completed_]));
      ++completed_;
    }
    return absl::OkStatus();
  }
  absl::Status AllEnqueued() override {
    all_enqueued = true;
    return absl::OkStatus();
  }
  absl::Status Drain() override { return Wait(enqueued_); }

  bool all_enqueued = false;

 private:
  MemorySource* const source_;
  std::vector<std::vector<CopySpan>> pending_;  // by ticket - 1
  uint64_t enqueued_ = 0, completed_ = 0;
};

// The directory the fixture's file goes in, opened.
StorageDir OpenFixtureDir(const ShardFixture& f) {
  absl::StatusOr<StorageDir> dir =
      StorageDir::OpenRoot(f.path().substr(0, f.path().rfind('/')));
  INFO(dir.status());
  REQUIRE(dir.ok());
  return *std::move(dir);
}

TEST_CASE(
    "ShardWriter with copies that complete later (a GPU's) and a pool that "
    "holds the file enqueues every copy before it touches the file system",
    "[shard_io][shard_writer]") {
  ShardFixture f;
  std::unique_ptr<StagingPool> pool = PoolHoldingTheFile(f);
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  DeferredCopyOut batch(f.memory());
  StorageDir dir = OpenFixtureDir(f);
  ShardWriteRequest req = f.WriteRequest();
  req.files[0].name = f.path().substr(f.path().rfind('/') + 1);
  req.batch = &batch;
  bool enqueued = false, file_existed_at_enqueue = true;
  int open_dir_calls = 0;
  bool dir_opened_after_enqueue = false;
  req.on_enqueued = [&] {
    enqueued = true;
    CHECK(batch.all_enqueued);
    file_existed_at_enqueue = FileExists(f.path());
  };
  req.files[0].open_dir = [&]() -> absl::StatusOr<const StorageDir*> {
    ++open_dir_calls;
    dir_opened_after_enqueue = enqueued;
    return &dir;
  };

  ShardWriter writer(pool.get(), queue.get());
  absl::StatusOr<ShardWriteResult> result = WriteOne(writer, req);
  INFO(result.status());
  REQUIRE(result.ok());
  CHECK(enqueued);
  CHECK_FALSE(file_existed_at_enqueue);
  CHECK(open_dir_calls == 1);
  CHECK(dir_opened_after_enqueue);
  CHECK(result->enqueued_at <= result->staged_at);
  CHECK(result->staged_at <= result->first_write_at);
  f.CheckFileMatchesSources(*result);
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

TEST_CASE(
    "ShardWriter whose directory cannot be had when its first write is due "
    "returns that error, creates no file and has every buffer back",
    "[shard_io][shard_writer]") {
  const bool deferred = GENERATE(false, true);
  INFO("copies complete later: " << deferred);
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  DeferredCopyOut batch(f.memory());
  ShardWriteRequest req = f.WriteRequest();
  req.files[0].name = "never.safetensors";
  if (deferred) req.batch = &batch;
  int open_dir_calls = 0;
  req.files[0].open_dir = [&]() -> absl::StatusOr<const StorageDir*> {
    ++open_dir_calls;
    return absl::FailedPreconditionError("checkpoint directory not ckptd's");
  };

  ShardWriter writer(f.pool(), queue.get());
  const absl::Status status = writer.Write(req).status();
  CHECK(status == absl::FailedPreconditionError("checkpoint directory not ckptd's"));
  CHECK(open_dir_calls == 1);
  CheckLeftNoFile(f);
  CHECK_FALSE(FileExists(f.path().substr(0, f.path().rfind('/') + 1) + req.files[0].name));
}

// The fixture's file written under `n` names (first, second, file-2, ...)
// in one request; their paths in `paths`.
ShardWriteRequest ManyFileRequest(ShardFixture& f, size_t n, std::vector<std::string>* paths) {
  const std::string dir = f.path().substr(0, f.path().rfind('/') + 1);
  ShardWriteRequest req = f.WriteRequest();
  req.files.clear();
  paths->clear();
  for (size_t i = 0; i < n; ++i) {
    const std::string name = i == 0 ? "first" : i == 1 ? "second" : "file-" + std::to_string(i);
    paths->push_back(dir + name + ".safetensors");
    req.files.push_back(f.File(paths->back()));
  }
  return req;
}

ShardWriteRequest TwoFileRequest(ShardFixture& f, std::string* first, std::string* second) {
  std::vector<std::string> paths;
  ShardWriteRequest req = ManyFileRequest(f, 2, &paths);
  *first = paths[0];
  *second = paths[1];
  return req;
}

TEST_CASE(
    "ShardWriter writes several files as one stream: with copies that complete "
    "later and a pool that holds them all, every copy of every file is "
    "enqueued before the first file is created, and each file is exact",
    "[shard_io][shard_writer]") {
  ShardFixture f;
  std::unique_ptr<StagingPool> pool = PoolHoldingTheFile(f, 2);
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  DeferredCopyOut batch(f.memory());
  std::string first, second;
  ShardWriteRequest req = TwoFileRequest(f, &first, &second);
  req.batch = &batch;
  bool enqueued = false, any_file_at_enqueue = true;
  req.on_enqueued = [&] {
    enqueued = true;
    any_file_at_enqueue = FileExists(first) || FileExists(second);
  };
  std::vector<ShardWriteProgress> seen;
  req.on_progress = [&](const ShardWriteProgress& p) { seen.push_back(p); };

  ShardWriter writer(pool.get(), queue.get());
  absl::StatusOr<std::vector<ShardWriteResult>> results = writer.Write(req);
  INFO(results.status());
  REQUIRE(results.ok());
  CHECK(enqueued);
  CHECK_FALSE(any_file_at_enqueue);
  REQUIRE(results->size() == 2);
  f.CheckFileMatchesSources((*results)[0], first);
  f.CheckFileMatchesSources((*results)[1], second);
  // Progress counts the bytes of both files.
  REQUIRE(!seen.empty());
  CHECK(seen.back().bytes_staged == 2 * f.layout().file_size);
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

TEST_CASE(
    "ShardWriter whose second file cannot be created removes the first one it "
    "wrote, whatever the copies and the pool",
    "[shard_io][shard_writer]") {
  const bool deferred = GENERATE(false, true);
  INFO("copies complete later (and the pool holds both): " << deferred);
  ShardFixture f;
  std::unique_ptr<StagingPool> big_pool = PoolHoldingTheFile(f, 2);
  StagingPool* pool = deferred ? big_pool.get() : f.pool();
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  DeferredCopyOut batch(f.memory());
  std::string first, second;
  ShardWriteRequest req = TwoFileRequest(f, &first, &second);
  if (deferred) req.batch = &batch;
  {
    std::ofstream out(second, std::ios::binary);
    out << "precious";  // not the writer's: O_EXCL refuses it
  }

  ShardWriter writer(pool, queue.get());
  const absl::Status status = writer.Write(req).status();
  CHECK(status.code() == absl::StatusCode::kAlreadyExists);
  CHECK_FALSE(FileExists(first));
  CHECK(ReadWholeFile(second) == "precious");
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

// Records the data-file steps, in order, as "create NAME", "trim PATH",
// "fsync PATH"; fails the fsync of `fail_fsync_of` (a path) if set.
class RecordingDataFileOps final : public FileOps {
 public:
  std::vector<std::string> steps;
  std::string fail_fsync_of;

  absl::StatusOr<int> CreateDirect(const StorageDir& dir, const std::string& name) override {
    steps.push_back("create " + name);
    return FileOps::CreateDirect(dir, name);
  }
  absl::Status Truncate(int fd, uint64_t size, const std::string& path) override {
    steps.push_back("trim " + path);
    return FileOps::Truncate(fd, size, path);
  }
  absl::Status Fsync(int fd, const std::string& path) override {
    steps.push_back("fsync " + path);
    if (path == fail_fsync_of) return absl::DataLossError("injected fsync failure");
    return FileOps::Fsync(fd, path);
  }
};

TEST_CASE(
    "ShardWriter writing several files trims and fsyncs them after every write, "
    "holds at most kMaxOpenDataFiles open, and a failing fsync of the first "
    "leaves none",
    "[shard_io][shard_writer]") {
  const bool deferred = GENERATE(false, true);
  const size_t n_files = GENERATE(size_t{2}, kMaxOpenDataFiles + 2);
  const bool fail_first = GENERATE(false, true);
  INFO("copies complete later (and the pool holds all): " << deferred << ", files: "
                                                          << n_files << ", first fsync fails: "
                                                          << fail_first);
  ShardFixture f;
  std::unique_ptr<StagingPool> big_pool = PoolHoldingTheFile(f, static_cast<int>(n_files));
  StagingPool* pool = deferred ? big_pool.get() : f.pool();
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  DeferredCopyOut batch(f.memory());
  std::vector<std::string> paths;
  ShardWriteRequest req = ManyFileRequest(f, n_files, &paths);
  if (deferred) req.batch = &batch;
  RecordingDataFileOps ops;
  if (fail_first) ops.fail_fsync_of = paths[0];

  ShardWriter writer(pool, queue.get(), ops);
  const absl::StatusOr<std::vector<ShardWriteResult>> results = writer.Write(req);
  auto name = [](const std::string& path) { return path.substr(path.rfind('/') + 1); };
  // Open files: created and not yet fsynced (a file is closed after its fsync).
  size_t open = 0, most_open = 0;
  for (const std::string& step : ops.steps) {
    if (step.rfind("create ", 0) == 0) most_open = std::max(most_open, ++open);
    if (step.rfind("fsync ", 0) == 0) --open;
  }
  CHECK(most_open <= kMaxOpenDataFiles);
  if (fail_first) {
    CHECK(results.status() == absl::DataLossError("injected fsync failure"));
    for (const std::string& path : paths) CHECK_FALSE(FileExists(path));
  } else {
    INFO(results.status());
    REQUIRE(results.ok());
    REQUIRE(results->size() == n_files);
    for (size_t i = 0; i < n_files; ++i) f.CheckFileMatchesSources((*results)[i], paths[i]);
  }
  if (n_files == 2) {
    // Both created before either is finished: no fsync while staging.
    std::vector<std::string> expected = {"create " + name(paths[0]),
                                         "create " + name(paths[1]), "trim " + paths[0],
                                         "fsync " + paths[0]};
    if (!fail_first) {
      expected.push_back("trim " + paths[1]);
      expected.push_back("fsync " + paths[1]);
    }
    CHECK(ops.steps == expected);
  }
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

}  // namespace
}  // namespace ckpt

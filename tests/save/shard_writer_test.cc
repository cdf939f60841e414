// Tests of ShardWriter on real files (the material is ShardFixture's,
// tests/support/shard_fixture.h): the exact file and its block checksums,
// progress, and what every failure leaves behind — no file, every staging
// buffer back in the pool and none returned while a write on it was in
// flight — whether the source, a write, the queue, the ftruncate or the
// fsync fails, or the save is cancelled; and, under a write rate cap and
// with a memory-tier image to fill, that neither holds up staging; that
// the file is created only when its first write is due, after every copy
// that completes later (a GPU's) was enqueued; and that several files are
// one stream of windows, staged without waiting for each other's writes,
// written and finished one at a time.
#include "save/shard_writer.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/io_queue.h"
#include "io/rate_limiter.h"
#include "io/staging_pool.h"
#include "session/memory_source.h"
#include "storage/durable_file.h"
#include "storage/storage_dir.h"
#include "support/fault_injecting_queue.h"
#include "support/shard_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::AlignUp4096;
using ::ckpt::testing::FailingSource;
using ::ckpt::testing::Fault;
using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::FaultName;
using ::ckpt::testing::FileExists;
using ::ckpt::testing::ReadWholeFile;
using ::ckpt::testing::ShardFixture;
using ::ckpt::testing::WriteOne;

constexpr uint32_t kBufferBytes = ShardFixture::kBufferBytes;
constexpr uint64_t kPoolBytes = ShardFixture::kPoolBytes;
constexpr uint32_t kQueueDepth = ShardFixture::kQueueDepth;

// What a failed or cancelled write must leave: no file (not even a partial
// one) and every staging buffer back in the pool.
void CheckLeftNoFile(ShardFixture& f) {
  CHECK_FALSE(FileExists(f.path()));
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardWriter writes the exact safetensors file with the sources' "
    "bytes and their block checksums",
    "[shard_io][shard_writer]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult result = f.WriteOrFail(queue.get());
  f.CheckFileMatchesSources(result);
}

TEST_CASE(
    "ShardWriter reports staging once and progress that only grows to "
    "the whole file",
    "[shard_io][shard_writer]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  ShardWriteRequest req = f.WriteRequest();
  int staged_calls = 0;
  uint64_t staged_when_notified = 0;
  std::vector<ShardWriteProgress> seen;
  req.on_staged = [&] {
    ++staged_calls;
    staged_when_notified = seen.empty() ? 0 : seen.back().bytes_staged;
  };
  req.on_progress = [&](const ShardWriteProgress& p) { seen.push_back(p); };

  ShardWriter writer(f.pool(), queue.get());
  absl::StatusOr<ShardWriteResult> result = WriteOne(writer, req);
  INFO(result.status());
  REQUIRE(result.ok());

  CHECK(staged_calls == 1);
  // The last window was not yet reported when on_staged ran, but every
  // window before it was.
  CHECK(staged_when_notified < f.layout().file_size);
  CHECK(staged_when_notified + kBufferBytes >= f.layout().file_size);
  REQUIRE(!seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) {
    CHECK(seen[i].bytes_staged >= seen[i - 1].bytes_staged);
    CHECK(seen[i].bytes_written >= seen[i - 1].bytes_written);
  }
  CHECK(seen.back().bytes_staged == f.layout().file_size);
  // Writes include the zero padding of the last window.
  CHECK(seen.back().bytes_written >= f.layout().file_size);
  CHECK(seen.back().bytes_written <= AlignUp4096(f.layout().file_size));
}

TEST_CASE("ShardWriter refuses to overwrite an existing file",
          "[shard_io][shard_writer]") {
  ShardFixture f;
  {
    std::ofstream out(f.path(), std::ios::binary);
    out << "precious";
  }
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  ShardWriter writer(f.pool(), queue.get());
  CHECK(writer.Write(f.WriteRequest()).status().code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(ReadWholeFile(f.path()) == "precious");
}

TEST_CASE(
    "ShardWriter cancelled before it starts returns Cancelled and "
    "leaves no file",
    "[shard_io][shard_writer]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  std::atomic<bool> cancelled{true};
  ShardWriteRequest req = f.WriteRequest();
  req.cancelled = &cancelled;

  ShardWriter writer(f.pool(), queue.get());
  CHECK(writer.Write(req).status().code() == absl::StatusCode::kCancelled);
  CheckLeftNoFile(f);
}

TEST_CASE(
    "ShardWriter cancelled part-way returns Cancelled and leaves no "
    "file",
    "[shard_io][shard_writer]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  std::atomic<bool> cancelled{false};
  ShardWriteRequest req = f.WriteRequest();
  req.cancelled = &cancelled;
  // Cancel once a few windows are staged (some writes are then in flight).
  req.on_progress = [&](const ShardWriteProgress& p) {
    if (p.bytes_staged >= 3 * kBufferBytes) cancelled.store(true);
  };

  ShardWriter writer(f.pool(), queue.get());
  CHECK(writer.Write(req).status().code() == absl::StatusCode::kCancelled);
  CheckLeftNoFile(f);
}

TEST_CASE("ShardWriter returns a failing source's error and leaves no file",
          "[shard_io][shard_writer]") {
  // First window (nothing written yet) and a later one (writes in flight).
  const int fail_on = GENERATE(1, 5);
  INFO("source fails on read " << fail_on);
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  FailingSource source(fail_on, 0);
  ShardWriteRequest req = f.WriteRequest();
  req.source = &source;

  ShardWriter writer(f.pool(), queue.get());
  const absl::Status status = writer.Write(req).status();
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("injected source failure"));
  CHECK(source.reads == fail_on);  // nothing staged after the failure
  CheckLeftNoFile(f);
}

TEST_CASE("ShardWriter returns a failing write's error and leaves no file",
          "[shard_io][shard_writer]") {
  // The first window's write, and one after the pool has wrapped around.
  const int fail_nth = GENERATE(1, 10);
  INFO("write " << fail_nth << " fails with EIO");
  ShardFixture f;
  FaultInjectingQueue queue(kQueueDepth);
  queue.eio_nth = fail_nth;

  ShardWriter writer(f.pool(), &queue);
  const absl::Status status = writer.Write(f.WriteRequest()).status();
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
  CHECK(queue.submissions >= static_cast<uint32_t>(fail_nth));
  CheckLeftNoFile(f);
}

TEST_CASE(
    "ShardWriter, after a write error with several writes in flight, has "
    "every buffer back in the pool, returned none while its write was "
    "outstanding, and leaves no file",
    "[shard_io][shard_writer]") {
  const Fault fault = GENERATE(Fault::kTransferEio, Fault::kReapFails);
  INFO(FaultName(fault));
  ShardFixture f;
  FaultInjectingQueue queue(kQueueDepth);
  queue.WatchPool(f.pool());
  queue.lazy = true;  // polls find nothing: writes pile up in flight
  if (fault == Fault::kTransferEio) {
    queue.eio_nth = 3;
  } else {
    // The poll after the fifth write fails, and the first wait after it:
    // the writer has to retry before any buffer may go back.
    queue.failing_reap = 5;
    queue.failing_reaps = 2;
  }

  ShardWriter writer(f.pool(), &queue);
  const absl::Status status = writer.Write(f.WriteRequest()).status();

  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
  REQUIRE(queue.in_flight_at_fault.has_value());
  CHECK(*queue.in_flight_at_fault > 1);
  CHECK(queue.in_flight == 0);
  CHECK(queue.returned_while_outstanding == 0);
  CheckLeftNoFile(f);
}

// A pool that holds the whole of the fixture's file (`copies` times), with
// buffers of the fixture's size, so that nothing but the cap or the tier
// could hold staging up.
std::unique_ptr<StagingPool> PoolHoldingTheFile(const ShardFixture& f, int copies = 1) {
  const uint64_t windows = (f.layout().file_size + kBufferBytes - 1) / kBufferBytes;
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create((copies * windows + 2) * kBufferBytes, kBufferBytes);
  INFO(pool.status());
  REQUIRE(pool.ok());
  return std::move(pool).value();
}

TEST_CASE(
    "ShardWriter under a write rate cap stages the whole file its pool holds "
    "without waiting for a write's turn, and writes it all",
    "[shard_io][shard_writer][rate_limiter]") {
  ShardFixture f;
  std::unique_ptr<StagingPool> pool = PoolHoldingTheFile(f);
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  // One window per second: every write after the first waits a second for
  // its turn, so writing the whole file would take over ten seconds.
  RateLimiter limiter(kBufferBytes);
  ShardWriteRequest req = f.WriteRequest();
  req.limiter = &limiter;
  ShardWriteProgress last;
  req.on_progress = [&](const ShardWriteProgress& p) { last = p; };
  std::optional<ShardWriteProgress> at_staged;
  req.on_staged = [&] {
    at_staged = last;
    limiter.SetRate(0);  // the rest of the file goes at once
  };

  ShardWriter writer(pool.get(), queue.get());
  absl::StatusOr<ShardWriteResult> result = WriteOne(writer, req);
  INFO(result.status());
  REQUIRE(result.ok());
  REQUIRE(at_staged.has_value());
  // Staging finished while only the first write, whose turn was free, could
  // have gone: the others were still waiting for theirs.
  CHECK(at_staged->bytes_written <= kBufferBytes);
  f.CheckFileMatchesSources(*result);
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

TEST_CASE(
    "ShardWriter fills the memory-tier image with the whole file by the time "
    "Write returns, and never before STAGED when the pool holds the file",
    "[shard_io][shard_writer][memory_tier]") {
  const bool pool_holds_file = GENERATE(false, true);
  const bool capped = GENERATE(false, true);
  INFO("pool holds the file: " << pool_holds_file << ", capped: " << capped);
  ShardFixture f;
  std::unique_ptr<StagingPool> big_pool;
  StagingPool* pool = f.pool();  // smaller than the file: back-pressure
  if (pool_holds_file) {
    big_pool = PoolHoldingTheFile(f);
    pool = big_pool.get();
  }
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  RateLimiter limiter(capped ? 16 * kBufferBytes : 0);  // the file in ~1 s
  constexpr char kUntouched = '\x5a';
  std::string image(f.layout().file_size, kUntouched);
  ShardWriteRequest req = f.WriteRequest();
  req.limiter = &limiter;
  req.files[0].capture = image.data();
  bool untouched_at_staged = false;
  req.on_staged = [&] {
    untouched_at_staged =
        image.find_first_not_of(kUntouched) == std::string::npos;
  };

  ShardWriter writer(pool, queue.get());
  absl::StatusOr<ShardWriteResult> result = WriteOne(writer, req);
  INFO(result.status());
  REQUIRE(result.ok());
  f.CheckFileMatchesSources(*result);
  CHECK(image == ReadWholeFile(f.path()));
  // With every window in the pool, the tier copies wait until STAGED.
  if (pool_holds_file) CHECK(untouched_at_staged);
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

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

TEST_CASE(
    "ShardWriter cancelled while its staged windows wait for their write turn "
    "stops waiting, returns Cancelled and leaves no file",
    "[shard_io][shard_writer][rate_limiter]") {
  ShardFixture f;
  std::unique_ptr<StagingPool> pool = PoolHoldingTheFile(f);
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  RateLimiter limiter(kBufferBytes);  // over ten seconds of turns
  std::atomic<bool> cancelled{false};
  ShardWriteRequest req = f.WriteRequest();
  req.limiter = &limiter;
  req.cancelled = &cancelled;
  req.on_staged = [&] { cancelled.store(true); };

  ShardWriter writer(pool.get(), queue.get());
  CHECK(writer.Write(req).status().code() == absl::StatusCode::kCancelled);
  CHECK_FALSE(FileExists(f.path()));
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

// The real file operations, except that `fail` (Truncate or Fsync) returns
// an injected error; records the calls.
class FailingDataFileOps final : public FileOps {
 public:
  enum class Step { kNone, kTruncate, kFsync };
  explicit FailingDataFileOps(Step fail) : fail_(fail) {}

  std::vector<Step> calls;
  uint64_t truncated_to = 0;

  absl::Status Injected() const {
    return absl::DataLossError(fail_ == Step::kTruncate
                                   ? "injected ftruncate failure"
                                   : "injected fsync failure");
  }
  absl::Status Truncate(int fd, uint64_t size,
                        const std::string& path) override {
    calls.push_back(Step::kTruncate);
    truncated_to = size;
    if (fail_ == Step::kTruncate) return Injected();
    return FileOps::Truncate(fd, size, path);
  }
  absl::Status Fsync(int fd, const std::string& path) override {
    calls.push_back(Step::kFsync);
    if (fail_ == Step::kFsync) return Injected();
    return FileOps::Fsync(fd, path);
  }

 private:
  const Step fail_;
};

TEST_CASE(
    "ShardWriter trims and fsyncs the data file through its FileOps, and a "
    "failing ftruncate or fsync ends the write with that error and no file",
    "[shard_io][shard_writer]") {
  using Step = FailingDataFileOps::Step;
  const Step fail = GENERATE(Step::kNone, Step::kTruncate, Step::kFsync);
  INFO("failing step " << static_cast<int>(fail));
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  FailingDataFileOps ops(fail);

  ShardWriter writer(f.pool(), queue.get(), ops);
  absl::StatusOr<ShardWriteResult> result = WriteOne(writer, f.WriteRequest());

  CHECK(ops.truncated_to == f.layout().file_size);
  if (fail == Step::kNone) {
    INFO(result.status());
    REQUIRE(result.ok());
    CHECK(ops.calls == std::vector<Step>{Step::kTruncate, Step::kFsync});
    f.CheckFileMatchesSources(*result);
    return;
  }
  CHECK(result.status() == ops.Injected());
  // The protocol stopped at the failing step.
  CHECK(ops.calls.back() == fail);
  CHECK(ops.calls.size() == (fail == Step::kTruncate ? 1u : 2u));
  CheckLeftNoFile(f);
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

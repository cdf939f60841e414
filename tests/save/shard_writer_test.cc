// Tests of ShardWriter on real files (the material is ShardFixture's,
// tests/support/shard_fixture.h): the exact file and its block checksums,
// progress, and what every failure leaves behind — no file, every staging
// buffer back in the pool and none returned while a write on it was in
// flight — whether the source, a write, the queue, the ftruncate or the
// fsync fails, or the save is cancelled; and, under a write rate cap and
// with a memory-tier image to fill, that neither holds up staging. When
// files are created and how several go in one write:
// shard_writer_files_test.cc.
#include "save/shard_writer.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "session/pool_share.h"

#include "io/io_queue.h"
#include "io/rate_limiter.h"
#include "io/staging_pool.h"
#include "session/memory_source.h"
#include "storage/durable_file.h"
#include "support/fault_injecting_queue.h"
#include "support/shard_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::AlignUp4096;
using ::ckpt::testing::CheckLeftNoFile;
using ::ckpt::testing::FailingSource;
using ::ckpt::testing::Fault;
using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::FaultName;
using ::ckpt::testing::FileExists;
using ::ckpt::testing::PoolHoldingTheFile;
using ::ckpt::testing::ReadWholeFile;
using ::ckpt::testing::ShardFixture;
using ::ckpt::testing::WriteOne;

constexpr uint32_t kBufferBytes = ShardFixture::kBufferBytes;
constexpr uint32_t kQueueDepth = ShardFixture::kQueueDepth;

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

// Copies that never end while the test holds them (a GPU's D2H copies
// behind a trainer stream that does not get to the save's ready event):
// Wait and Drain fail, and the buffers handed to KeepUntilCopiesEnd stay
// in `kept` until the test lets them go.
class StuckCopyOut final : public CopyOutBatch {
 public:
  absl::StatusOr<uint64_t> Enqueue(absl::Span<const CopySpan>) override {
    return ++enqueued_;
  }
  absl::StatusOr<bool> Ready(uint64_t) override { return false; }
  absl::Status Wait(uint64_t) override {
    return absl::DeadlineExceededError("injected: the copies did not end");
  }
  absl::Status AllEnqueued() override { return absl::OkStatus(); }
  absl::Status Drain() override {
    return absl::DeadlineExceededError("injected: the copies still run");
  }
  void KeepUntilCopiesEnd(std::vector<StagingLease> buffers) override {
    for (StagingLease& b : buffers) kept.push_back(std::move(b));
  }

  std::vector<StagingLease> kept;

 private:
  uint64_t enqueued_ = 0;
};

// StuckCopyOut's copies, as a session's GPU copies with a share of the
// pool (session/pool_share.h): each window claims a buffer of `share`, and
// the buffers kept after the copies failed stay claimed with them.
class SharedStuckCopyOut final : public CopyOutBatch {
 public:
  explicit SharedStuckCopyOut(std::shared_ptr<PoolShare> share) : share_(std::move(share)) {}
  absl::StatusOr<uint64_t> Enqueue(absl::Span<const CopySpan> spans) override {
    return stuck_.Enqueue(spans);
  }
  absl::StatusOr<bool> Ready(uint64_t ticket) override { return stuck_.Ready(ticket); }
  absl::Status Wait(uint64_t ticket) override { return stuck_.Wait(ticket); }
  absl::Status AllEnqueued() override { return absl::OkStatus(); }
  absl::Status Drain() override { return stuck_.Drain(); }
  void KeepUntilCopiesEnd(std::vector<StagingLease> buffers) override {
    kept_claims.push_back(PoolShare::Force(share_, buffers.size()));
    stuck_.KeepUntilCopiesEnd(std::move(buffers));
  }
  absl::StatusOr<PoolShare::Claim> ClaimBuffer(bool may_wait) override {
    return PoolShare::Take(share_, may_wait ? absl::Milliseconds(50) : absl::ZeroDuration());
  }
  std::vector<StagingLease>& kept() { return stuck_.kept; }

  std::vector<PoolShare::Claim> kept_claims;

 private:
  const std::shared_ptr<PoolShare> share_;
  StuckCopyOut stuck_;
};

TEST_CASE("ShardWriter whose copies do not end holds at most the session's share "
          "of the pool, and fails naming the bound",
          "[shard_io][shard_writer][pool_share]") {
  ShardFixture f;
  std::unique_ptr<StagingPool> pool = PoolHoldingTheFile(f);
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const std::shared_ptr<PoolShare> share =
      PoolShare::OfPool(pool->iovecs().size(), /*percent=*/50);
  REQUIRE(share->limit() == pool->iovecs().size() / 2);
  SharedStuckCopyOut batch(share);
  ShardWriteRequest req = f.WriteRequest();
  req.batch = &batch;
  ShardWriter writer(pool.get(), queue.get());

  SECTION("the save's own copies fill the share") {
    const absl::Status status = writer.Write(req).status();
    INFO(status.ToString());
    CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK_THAT(std::string(status.message()), Catch::Contains("--gpu_pool_share_percent=50"));
    CheckLeftNoFile(f);
    // The share, never the pool: the rest stayed free for other saves.
    CHECK(batch.kept().size() == share->limit());
    CHECK(pool->free_bytes() == pool->pool_bytes() - share->limit() * pool->buffer_bytes());
    CHECK(share->held() == share->limit());
    batch.kept().clear();  // the copies ended
    batch.kept_claims.clear();
    CHECK(share->held() == 0);
    CHECK(pool->free_bytes() == pool->pool_bytes());
  }
  SECTION("the session's other saves hold the share") {
    PoolShare::Claim others = PoolShare::Force(share, share->limit());
    const absl::Status status = writer.Write(req).status();
    INFO(status.ToString());
    CHECK(status.code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(status.message()),
               Catch::Contains("the most one session may (--gpu_pool_share_percent=50)"));
    CheckLeftNoFile(f);
    CHECK(batch.kept().empty());
    CHECK(pool->free_bytes() == pool->pool_bytes());
    CHECK(share->held() == share->limit());
  }
}

TEST_CASE("PoolShare lends at most its limit, at least one buffer, and takes "
          "claims back when they end",
          "[pool_share]") {
  CHECK(PoolShare::OfPool(10, 50)->limit() == 5);
  CHECK(PoolShare::OfPool(1, 50)->limit() == 1);
  CHECK(PoolShare::OfPool(10, 100)->limit() == 10);
  const std::shared_ptr<PoolShare> share = PoolShare::OfPool(4, 50);
  absl::StatusOr<PoolShare::Claim> a = PoolShare::Take(share, absl::ZeroDuration());
  absl::StatusOr<PoolShare::Claim> b = PoolShare::Take(share, absl::ZeroDuration());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(share->held() == 2);
  absl::StatusOr<PoolShare::Claim> c = PoolShare::Take(share, absl::Milliseconds(20));
  CHECK(absl::IsResourceExhausted(c.status()));
  // A claim that ends makes room for a waiter.
  std::thread ender([&a] {
    absl::SleepFor(absl::Milliseconds(20));
    a->Reset();
  });
  c = PoolShare::Take(share, absl::Seconds(10));
  ender.join();
  CHECK(c.ok());
  // The wait runs from the last buffer given back: a waiter is not failed
  // while the session's copies keep ending, even if the session's other
  // save takes the room again first each time.
  {
    PoolShare::Claim other = *std::move(c);  // with `b`: the share is full
    const absl::Duration churn_for = absl::Milliseconds(300);
    std::thread churn([&] {
      for (const absl::Time end = absl::Now() + churn_for; absl::Now() < end;) {
        absl::SleepFor(absl::Milliseconds(10));
        other.Reset();
        other = PoolShare::Force(share, 1);
      }
    });
    const absl::Time start = absl::Now();
    absl::StatusOr<PoolShare::Claim> waiter = PoolShare::Take(share, absl::Milliseconds(50));
    const absl::Duration waited = absl::Now() - start;
    churn.join();
    INFO("waited " << absl::FormatDuration(waited));
    CHECK((waiter.ok() || waited >= churn_for));
  }
  CHECK(share->held() == 1);  // `b`
  PoolShare::Claim moved = *std::move(b);
  CHECK(share->held() == 1);
  moved = PoolShare::Claim();
  CHECK(share->held() == 0);
}

TEST_CASE("ShardWriter whose copies do not end leaves their buffers with the "
          "copy batch, out of the pool until the batch lets them go, and no file",
          "[shard_io][shard_writer]") {
  ShardFixture f;
  std::unique_ptr<StagingPool> pool = PoolHoldingTheFile(f);
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  StuckCopyOut batch;
  ShardWriteRequest req = f.WriteRequest();
  req.batch = &batch;

  ShardWriter writer(pool.get(), queue.get());
  const absl::Status status = writer.Write(req).status();
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CheckLeftNoFile(f);
  // Every staged window's buffer, none of them lent again meanwhile.
  REQUIRE_FALSE(batch.kept.empty());
  CHECK(pool->free_bytes() == pool->pool_bytes() - batch.kept.size() * pool->buffer_bytes());
  CHECK(pool->withheld_buffers() == 0);
  batch.kept.clear();  // the copies ended
  CHECK(pool->free_bytes() == pool->pool_bytes());
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

}  // namespace
}  // namespace ckpt

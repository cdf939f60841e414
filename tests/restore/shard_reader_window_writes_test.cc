// ShardReader's window writes into a destination that takes whole windows
// (GPU memory: MemorySource::PrefersLargeWrites) through StartWrite, whose
// copies may still run when it returns. From a memory image a window's
// copies run while the next window is hashed; from a staging buffer they
// end before the buffer goes back. On every path (a finished read, a
// checksum mismatch, copies that did not end) every copy started has ended
// when Read returns, and copies that did not end say so (HostMemoryInUse),
// so the caller keeps the memory.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/io_queue.h"
#include "restore/shard_reader.h"
#include "support/shard_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ReadWholeFile;
using ::ckpt::testing::ShardFixture;

constexpr uint64_t kPoolBytes = ShardFixture::kPoolBytes;
constexpr uint32_t kQueueDepth = ShardFixture::kQueueDepth;

// Takes whole windows and copies each one only when it is waited for: a
// reader that let a window's bytes change, or returned, before waiting
// delivers wrong or missing bytes. Logs "+N" when write N starts and "-N"
// when it is waited for; write `stuck_write` (from 1) reports copies that
// did not end instead of copying.
class DeferredWriteMemory final : public MemorySource {
 public:
  explicit DeferredWriteMemory(int stuck_write = 0) : stuck_write_(stuck_write) {}

  std::vector<std::string> log;
  int started = 0, ended = 0;

  absl::Status Read(absl::Span<const CopySpan> spans) override { return real_.Read(spans); }
  absl::Status Write(absl::Span<const CopySpan> spans) override {
    return StartWrite(spans)->Wait();
  }
  bool PrefersLargeWrites() const override { return true; }

  std::unique_ptr<CopiesInFlight> StartWrite(absl::Span<const CopySpan> spans) override {
    const int n = ++started;
    log.push_back("+" + std::to_string(n));
    return std::make_unique<Deferred>(this, n, std::vector<CopySpan>(spans.begin(), spans.end()));
  }

 private:
  class Deferred final : public CopiesInFlight {
   public:
    Deferred(DeferredWriteMemory* memory, int n, std::vector<CopySpan> spans)
        : memory_(memory), n_(n), spans_(std::move(spans)) {}
    absl::Status Wait() override {
      ++memory_->ended;
      memory_->log.push_back("-" + std::to_string(n_));
      if (n_ == memory_->stuck_write_) {
        return MarkHostMemoryInUse(absl::DeadlineExceededError("copies did not end"));
      }
      return memory_->real_.Write(spans_);
    }

   private:
    DeferredWriteMemory* const memory_;
    const int n_;
    const std::vector<CopySpan> spans_;
  };

  const int stuck_write_;
  HostProcessMemory real_{::getpid()};
};

// "+1 -1 +2 -2 ..." (each write ends before the next starts) or, with
// `overlapped`, "+1 +2 -1 +3 -2 ... -n" (each ends once the next started).
std::vector<std::string> ExpectedLog(int writes, bool overlapped) {
  std::vector<std::string> log;
  for (int n = 1; n <= writes; ++n) {
    log.push_back("+" + std::to_string(n));
    if (!overlapped) {
      log.push_back("-" + std::to_string(n));
    } else if (n > 1) {
      log.push_back("-" + std::to_string(n - 1));
    }
  }
  if (overlapped && writes > 0) log.push_back("-" + std::to_string(writes));
  return log;
}

// The fixture's file written, and a read of every entry of it into a
// DeferredWriteMemory, from the file or from a memory image of it.
struct WindowWritesRead {
  ShardFixture f;
  DeferredWriteMemory gpu_like;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  ShardWriteResult written;  // the request's checksums point into it
  std::vector<std::string> got;
  std::string image;
  ShardReadRequest req;

  explicit WindowWritesRead(bool from_memory, int stuck_write = 0) : gpu_like(stuck_write) {
    f.set_destination(&gpu_like);
    written = f.WriteOrFail(queue.get());
    req = f.ReadAllRequest(written, &got);
    if (from_memory) image = ReadWholeFile(f.path());
  }
  absl::Status Read() {
    if (!image.empty()) req.memory_image = image.data();
    ShardReader reader(f.pool(), queue.get());
    return reader.Read(req).status();
  }
};

TEST_CASE("ShardReader overlaps a memory image's window copies with hashing the "
          "next window, and ends a staging buffer's before the buffer goes back",
          "[shard_io][shard_reader]") {
  const bool from_memory = GENERATE(false, true);
  INFO((from_memory ? "from a memory image" : "from the file"));
  WindowWritesRead r(from_memory);
  const absl::Status status = r.Read();
  INFO(status);
  REQUIRE(status.ok());
  for (size_t i = 0; i < r.f.entries().size(); ++i) {
    INFO("entry " << r.f.entries()[i].fqn);
    CHECK(r.got[i] == r.f.source(i));
  }
  // Many windows, each one write.
  CHECK(r.gpu_like.started >= 10);
  CHECK(r.gpu_like.log == ExpectedLog(r.gpu_like.started, /*overlapped=*/from_memory));
  CHECK(r.f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE("ShardReader ends every window copy it started before it reports a "
          "checksum mismatch found in a later window of a memory image",
          "[shard_io][shard_reader]") {
  WindowWritesRead r(/*from_memory=*/true);
  // Past the middle of the biggest item: several windows come before it.
  const size_t big = r.f.IndexOf("c.big");
  r.image[r.f.ItemOffset(big) + r.f.source(big).size() * 3 / 4] ^= 0x10;
  const absl::Status status = r.Read();
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(HostMemoryInUse(status));
  CHECK(r.gpu_like.started >= 2);
  CHECK(r.gpu_like.ended == r.gpu_like.started);
}

TEST_CASE("ShardReader reports window copies that did not end so that their "
          "memory is kept: a memory image's read fails marked, a staging "
          "buffer is withheld",
          "[shard_io][shard_reader]") {
  const bool from_memory = GENERATE(false, true);
  INFO((from_memory ? "from a memory image" : "from the file"));
  WindowWritesRead r(from_memory, /*stuck_write=*/2);
  const absl::Status status = r.Read();
  INFO(status);
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(HostMemoryInUse(status));
  CHECK(r.gpu_like.ended == r.gpu_like.started);
  // From the file, the window's buffer is the memory kept.
  CHECK(r.f.pool()->withheld_buffers() == (from_memory ? 0u : 1u));
}

}  // namespace
}  // namespace ckpt

// Tests of ShardReader on files ShardWriter wrote (the material is
// ShardFixture's, tests/support/shard_fixture.h): whole items, sub-ranges
// and fanned-out deliveries arrive bit-exactly, from the file and from a
// memory image; damage (a flipped byte, a truncated file) is DataLoss naming
// the item and the file, and no byte of a damaged block reaches a
// destination; blocks up to a staging buffer less a page verify wherever
// they start, larger ones are refused; a failing read, queue or destination
// is reported with every staging buffer back in the pool.
#include "restore/shard_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"
#include "support/fault_injecting_queue.h"
#include "support/shard_fixture.h"
#include "support/skip.h"

namespace ckpt {
namespace {

using ::ckpt::testing::AddressOf;
using ::ckpt::testing::AlignUp4096;
using ::ckpt::testing::FailingSource;
using ::ckpt::testing::Fault;
using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::FaultName;
using ::ckpt::testing::ReadWholeFile;
using ::ckpt::testing::ShardFixture;

constexpr uint64_t kPoolBytes = ShardFixture::kPoolBytes;
constexpr uint32_t kQueueDepth = ShardFixture::kQueueDepth;

// Flips one bit of the byte at `offset` with a buffered write (no O_DIRECT),
// durably, so the reader's O_DIRECT reads see it.
void FlipByte(const std::string& path, uint64_t offset) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  REQUIRE(fd.valid());
  char byte = 0;
  REQUIRE(::pread(fd.get(), &byte, 1, static_cast<off_t>(offset)) == 1);
  byte = static_cast<char>(byte ^ 0x10);
  REQUIRE(::pwrite(fd.get(), &byte, 1, static_cast<off_t>(offset)) == 1);
  REQUIRE(::fsync(fd.get()) == 0);
}

void CheckReadAllMatchesSources(ShardFixture& f, IoQueue* queue,
                                const ShardWriteResult& written) {
  std::vector<std::string> got;
  absl::StatusOr<uint64_t> bytes = f.ReadAll(queue, written, &got);
  INFO(bytes.status());
  REQUIRE(bytes.ok());
  // The items tile the data section, so exactly that was read.
  CHECK(*bytes == f.layout().file_size - f.layout().data_start);
  for (size_t i = 0; i < f.entries().size(); ++i) {
    INFO("entry " << f.entries()[i].fqn);
    CHECK(got[i] == f.source(i));
  }
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardReader delivers every whole item bit-exactly after a "
    "ShardWriter save",
    "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  CheckReadAllMatchesSources(f, queue.get(), written);
}

TEST_CASE(
    "ShardReader delivers a sub-range in the middle of a big item and "
    "writes nothing outside it",
    "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  const size_t big = f.IndexOf("c.big");
  // Neither end on a block, buffer or page boundary.
  const uint64_t begin = 123457, end = 654321;
  constexpr size_t kGuard = 64;
  std::string destination(kGuard + (end - begin) + kGuard, '\x5a');

  ShardReader reader(f.pool(), queue.get());
  absl::StatusOr<uint64_t> bytes = reader.Read(f.ReadRequest(
      {f.Range(big, written, begin, end, destination.data() + kGuard)}));
  INFO(bytes.status());
  REQUIRE(bytes.ok());

  CHECK(destination.substr(kGuard, end - begin) ==
        f.source(big).substr(begin, end - begin));
  CHECK(destination.substr(0, kGuard) == std::string(kGuard, '\x5a'));
  CHECK(destination.substr(kGuard + (end - begin)) ==
        std::string(kGuard, '\x5a'));
  // Only the blocks around the range were read, not the whole item.
  CHECK(*bytes >= end - begin);
  CHECK(*bytes < f.entries()[big].length);
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardReader fans one read out to overlapping and scattered deliveries, "
    "from the file and from a memory image",
    "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  const size_t big = f.IndexOf("c.big");
  const std::string& source = f.source(big);
  // Windows of 1 MiB, so that one window is consumed in several slices.
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(4 << 20, 1 << 20);
  REQUIRE(pool.ok());
  const std::string image = ReadWholeFile(f.path());
  const bool from_memory = GENERATE(false, true);
  INFO((from_memory ? "from a memory image" : "from the file"));

  // The whole item; an overlapping range of it; and 10 bytes of every 1000
  // (a gather, as when a column shard is restored), packed together.
  std::string whole(source.size(), '\0');
  const uint64_t begin = 100, end = 700000;
  std::string part(end - begin, '\0');
  std::string expected_gather;
  for (uint64_t at = 0; at + 10 <= source.size(); at += 1000) {
    expected_gather += source.substr(at, 10);
  }
  std::string gathered(expected_gather.size(), '\0');
  ItemRead read = f.Range(big, written, 0, source.size(), whole.data());
  read.deliveries.push_back({begin, end, f.memory(), AddressOf(part.data())});
  for (uint64_t i = 0; i < gathered.size() / 10; ++i) {
    read.deliveries.push_back({i * 1000, i * 1000 + 10, f.memory(),
                               AddressOf(gathered.data() + i * 10)});
  }
  ShardReadRequest req = f.ReadRequest({read});
  if (from_memory) req.memory_image = image.data();

  ShardReader reader(pool->get(), queue.get());
  absl::StatusOr<uint64_t> bytes = reader.Read(req);
  INFO(bytes.status());
  REQUIRE(bytes.ok());
  CHECK(*bytes == (from_memory ? 0
                               : AlignUp4096(f.ItemOffset(big) + source.size()) -
                                     f.ItemOffset(big) / 4096 * 4096));
  CHECK(whole == source);
  CHECK(part == source.substr(begin, end - begin));
  CHECK(gathered == expected_gather);
  CHECK((*pool)->free_bytes() == 4 << 20);
}

TEST_CASE(
    "ShardReader reports DataLoss naming the item and the file when a "
    "byte of the item is flipped",
    "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());

  for (size_t i = 0; i < f.entries().size(); ++i) {
    const uint64_t length = f.entries()[i].length;
    if (length == 0) continue;
    const uint64_t offset = f.ItemOffset(i) + length / 2;
    INFO("entry " << f.entries()[i].fqn << ", file offset " << offset);
    FlipByte(f.path(), offset);

    std::vector<std::string> got;
    const absl::Status status = f.ReadAll(queue.get(), written, &got).status();
    CHECK(status.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(status.message()),
               Catch::Contains(f.entries()[i].fqn));
    CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
    CHECK(f.pool()->free_bytes() == kPoolBytes);

    FlipByte(f.path(), offset);  // restore for the next entry
  }
  // With every byte restored the file verifies again.
  CheckReadAllMatchesSources(f, queue.get(), written);
}

TEST_CASE("ShardReader verifies the blocks of a sub-range it delivers",
          "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  const size_t big = f.IndexOf("c.big");
  const uint64_t begin = 200000, end = 300000;
  FlipByte(f.path(), f.ItemOffset(big) + 250001);

  std::string destination(end - begin, '\0');
  ShardReader reader(f.pool(), queue.get());
  const absl::Status status =
      reader
          .Read(f.ReadRequest(
              {f.Range(big, written, begin, end, destination.data())}))
          .status();
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(status.message()), Catch::Contains("c.big"));
}

// A destination that takes whole windows in few large writes, as GPU
// memory does (MemorySource::PrefersLargeWrites), into this process.
class LargeWriteMemory final : public MemorySource {
 public:
  absl::Status Read(absl::Span<const CopySpan> spans) override { return real_.Read(spans); }
  absl::Status Write(absl::Span<const CopySpan> spans) override {
    return real_.Write(spans);
  }
  bool PrefersLargeWrites() const override { return true; }

 private:
  HostProcessMemory real_{::getpid()};
};

TEST_CASE(
    "ShardReader delivers no byte of a block whose checksum fails, even when "
    "the flipped byte is the block's last but one, and names file and block",
    "[shard_io][shard_reader]") {
  const bool from_memory = GENERATE(false, true);
  const bool large_writes = GENERATE(false, true);
  INFO((from_memory ? "from a memory image" : "from the file")
       << (large_writes ? ", to a destination that takes whole windows" : ""));
  ShardFixture f;
  LargeWriteMemory gpu_like;
  if (large_writes) f.set_destination(&gpu_like);
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  const size_t big = f.IndexOf("c.big");
  const std::string& source = f.source(big);
  constexpr uint64_t kBlock = ShardFixture::kBlockBytes;
  // A block past the item's middle that a grid of buffer-sized windows from
  // the item's first page (where its read starts) would cut in two, so the
  // reader must end a window before it. Every byte of the block before the
  // flipped one matches.
  const uint64_t first_page = f.ItemOffset(big) / 4096 * 4096;
  auto grid_cuts = [&](uint64_t block) {
    const uint64_t begin = f.ItemOffset(big) + block * kBlock - first_page;
    return begin / ShardFixture::kBufferBytes !=
           (begin + kBlock - 1) / ShardFixture::kBufferBytes;
  };
  uint64_t bad = source.size() / kBlock / 2;
  while (!grid_cuts(bad)) ++bad;
  REQUIRE((bad + 1) * kBlock < source.size());
  const uint64_t bad_begin = bad * kBlock, bad_end = bad_begin + kBlock;
  FlipByte(f.path(), f.ItemOffset(big) + bad_end - 2);

  constexpr char kSentinel = '\x5a';
  std::string destination(source.size(), kSentinel);
  ShardReadRequest req =
      f.ReadRequest({f.Range(big, written, 0, source.size(), destination.data())});
  const std::string image = from_memory ? ReadWholeFile(f.path()) : std::string();
  if (from_memory) req.memory_image = image.data();

  ShardReader reader(f.pool(), queue.get());
  const absl::Status status = reader.Read(req).status();
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
  CHECK_THAT(std::string(status.message()), Catch::Contains("c.big"));
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("block " + std::to_string(bad) + ":"));
  // Nothing of the damaged block nor of any block after it arrived.
  CHECK(destination.find_first_not_of(kSentinel, bad_begin) == std::string::npos);
  // The verified blocks before it arrived whole or not at all.
  for (uint64_t at = 0; at < bad_begin; at += kBlock) {
    INFO("block at item byte " << at);
    const std::string got = destination.substr(at, kBlock);
    CHECK((got == std::string(kBlock, kSentinel) || got == source.substr(at, kBlock)));
  }
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardReader verifies checksum blocks as large as a staging buffer less "
    "one page wherever they start, and refuses larger ones before reading",
    "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> pwrite = CreatePwriteQueue(kQueueDepth);
  const uint64_t largest = MaxChecksumBlockBytes(ShardFixture::kBufferBytes);
  REQUIRE(largest == ShardFixture::kBufferBytes - 4096);
  ShardWriteRequest write = f.WriteRequest();
  write.checksum_block_bytes = largest;
  ShardWriter writer(f.pool(), pwrite.get());
  const absl::StatusOr<ShardWriteResult> written = testing::WriteOne(writer, write);
  INFO(written.status());
  REQUIRE(written.ok());
  FaultInjectingQueue queue(kQueueDepth);
  ShardReader reader(f.pool(), &queue);
  std::vector<std::string> got;

  SECTION("the largest blocks arrive bit-exactly, each page read once") {
    ShardReadRequest req = f.ReadAllRequest(*written, &got);
    req.checksum_block_bytes = largest;
    const absl::StatusOr<uint64_t> bytes = reader.Read(req);
    INFO(bytes.status());
    REQUIRE(bytes.ok());
    // Windows end before the block they would cut and the next starts on
    // that block's page: the page read twice is counted once.
    CHECK(*bytes == f.layout().file_size - f.layout().data_start);
    for (size_t i = 0; i < f.entries().size(); ++i) {
      INFO("entry " << f.entries()[i].fqn);
      CHECK(got[i] == f.source(i));
    }
  }
  SECTION("a block one byte larger is refused, nothing read or delivered") {
    ShardReadRequest req = f.ReadAllRequest(*written, &got);
    req.checksum_block_bytes = largest + 1;
    const absl::Status status = reader.Read(req).status();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
    CHECK_THAT(std::string(status.message()), Catch::Contains("--buffer_bytes"));
    CHECK(queue.submissions == 0);
    for (size_t i = 0; i < f.entries().size(); ++i) {
      CHECK(got[i] == std::string(f.entries()[i].length, '\0'));
    }
  }
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE("ShardReader reports DataLoss for a truncated file",
          "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  const size_t big = f.IndexOf("c.big");
  // Cut the file inside the big item, at an odd place.
  REQUIRE(::truncate(f.path().c_str(),
                     static_cast<off_t>(f.ItemOffset(big) + 300003)) == 0);

  std::vector<std::string> got;
  const absl::Status status = f.ReadAll(queue.get(), written, &got).status();
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
  CHECK_THAT(std::string(status.message()), Catch::Contains("c.big"));
  // The 3 bytes of the cut block that are in the file were not delivered
  // (its checksum cannot be matched), nor was anything after them.
  const uint64_t cut_block = 300000 / ShardFixture::kBlockBytes * ShardFixture::kBlockBytes;
  REQUIRE(f.source(big).substr(cut_block, 3) != std::string(3, '\0'));
  CHECK(got[big].find_first_not_of('\0', cut_block) == std::string::npos);
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE("ShardReader returns a failing read's error naming the file",
          "[shard_io][shard_reader]") {
  const int fail_nth = GENERATE(1, 4);
  INFO("read " << fail_nth << " fails with EIO");
  ShardFixture f;
  std::unique_ptr<IoQueue> pwrite = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(pwrite.get());
  FaultInjectingQueue queue(kQueueDepth);
  queue.eio_nth = fail_nth;

  std::vector<std::string> got;
  const absl::Status status = f.ReadAll(&queue, written, &got).status();
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE("ShardReader returns a failing destination's error",
          "[shard_io][shard_reader]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  FailingSource destination(0, 3);
  std::vector<std::string> got;
  f.set_destination(&destination);
  ShardReadRequest req = f.ReadAllRequest(written, &got);

  ShardReader reader(f.pool(), queue.get());
  const absl::Status status = reader.Read(req).status();
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("injected destination failure"));
  CHECK(destination.writes == 3);  // nothing delivered after the failure
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardReader, after a read error with several reads in flight, has every "
    "buffer back in the pool and returned none while its read was outstanding",
    "[shard_io][shard_reader]") {
  const Fault fault = GENERATE(Fault::kTransferEio, Fault::kReapFails);
  INFO(FaultName(fault));
  ShardFixture f;
  std::unique_ptr<IoQueue> pwrite = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(pwrite.get());
  FaultInjectingQueue queue(kQueueDepth);
  queue.WatchPool(f.pool());
  if (fault == Fault::kTransferEio) {
    queue.eio_nth = 4;
  } else {
    queue.failing_reap = 2;  // after the first windows were consumed
  }

  std::vector<std::string> got;
  const absl::Status status = f.ReadAll(&queue, written, &got).status();

  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
  REQUIRE(queue.in_flight_at_fault.has_value());
  CHECK(*queue.in_flight_at_fault > 1);
  CHECK(queue.in_flight == 0);
  CHECK(queue.returned_while_outstanding == 0);
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardWriter and ShardReader round-trip through io_uring with "
    "registered buffers",
    "[shard_io][io_uring]") {
  ShardFixture f;
  absl::StatusOr<std::unique_ptr<IoQueue>> queue =
      CreateUringQueue(kQueueDepth, f.pool()->iovecs());
  if (!queue.ok()) {
    CKPT_SKIP("io_uring unavailable here: " << queue.status());
  }
  const ShardWriteResult written = f.WriteOrFail(queue->get());
  f.CheckFileMatchesSources(written);
  CheckReadAllMatchesSources(f, queue->get(), written);

  // And a flipped byte is caught on this path too.
  const size_t big = f.IndexOf("c.big");
  FlipByte(f.path(), f.ItemOffset(big) + 777777);
  std::vector<std::string> got;
  const absl::Status status = f.ReadAll(queue->get(), written, &got).status();
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(status.message()), Catch::Contains("c.big"));
  CHECK_THAT(std::string(status.message()), Catch::Contains(f.path()));
}

}  // namespace
}  // namespace ckpt

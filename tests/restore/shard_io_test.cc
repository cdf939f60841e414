// End-to-end tests of ShardWriter and ShardReader on real files, with this
// process's own memory as the peer (HostProcessMemory(getpid())), a staging
// pool smaller than the file (so the writer must wait for its own writes to
// free buffers) and a checksum block size that is not a power of two (so
// blocks straddle staging windows and items at odd places).
//
// Every check is made against values computed here independently: the
// layout's header bytes, the source bytes, and XXH3-64 of each block.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "format/safetensors_layout.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"
#include "restore/shard_reader.h"
#include "save/shard_writer.h"
#include "session/memory_source.h"
#include "storage/durable_file.h"
#include "support/fault_injecting_queue.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::TempDir;

constexpr uint32_t kBufferBytes = 64 * 1024;
constexpr uint64_t kPoolBytes = 8 * kBufferBytes;
constexpr uint64_t kBlockBytes = 10000;  // not a power of two on purpose
constexpr uint32_t kQueueDepth = 8;

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
uint64_t AlignUp4096(uint64_t n) { return (n + 4095) / 4096 * 4096; }

// Bytes that differ at every position and between entries.
std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + seed * 29 + (i >> 9) + 1) & 0xff);
  }
  return data;
}

std::vector<uint64_t> ReferenceBlocks(const std::string& data) {
  std::vector<uint64_t> out;
  for (uint64_t at = 0; at < data.size(); at += kBlockBytes) {
    out.push_back(XXH3_64bits(
        data.data() + at, std::min<uint64_t>(kBlockBytes, data.size() - at)));
  }
  if (out.empty()) out.push_back(XXH3_64bits(nullptr, 0));
  return out;
}

SafetensorsEntry Entry(std::string fqn, v1::DType dtype,
                       std::vector<uint64_t> shape, uint64_t element_size) {
  SafetensorsEntry e;
  e.fqn = std::move(fqn);
  e.dtype = dtype;
  e.local_shape = shape;
  e.offsets.assign(shape.size(), 0);
  e.length = element_size;
  for (uint64_t d : shape) e.length *= d;
  return e;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

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

// A source that fails its `fail_read_on`-th Read or `fail_write_on`-th
// Write (1-based; 0 never) and otherwise copies this process's memory.
class FailingSource final : public MemorySource {
 public:
  FailingSource(int fail_read_on, int fail_write_on)
      : fail_read_on_(fail_read_on), fail_write_on_(fail_write_on) {}
  int reads = 0;
  int writes = 0;
  absl::Status Read(absl::Span<const CopySpan> spans) override {
    if (++reads == fail_read_on_) {
      return absl::UnavailableError("injected source failure");
    }
    return real_.Read(spans);
  }
  absl::Status Write(absl::Span<const CopySpan> spans) override {
    if (++writes == fail_write_on_) {
      return absl::UnavailableError("injected destination failure");
    }
    return real_.Write(spans);
  }

 private:
  const int fail_read_on_;
  const int fail_write_on_;
  HostProcessMemory real_{::getpid()};
};

// One shard: entries of varied sizes, their source bytes, its layout, a
// pool smaller than the file and a temp dir for the file.
class ShardFixture {
 public:
  ShardFixture() {
    entries_ = {
        Entry("a.tiny", v1::DTYPE_U8, {1}, 1),
        Entry("b.not_aligned", v1::DTYPE_F32, {1000}, 4),  // 4000 bytes
        Entry("c.big", v1::DTYPE_BF16, {400001}, 2),       // 800002 bytes
        Entry("d.empty", v1::DTYPE_F32, {0}, 4),           // 0 bytes
        Entry("e.odd", v1::DTYPE_I64, {3, 37}, 8),         // 888 bytes
        Entry("f.window_plus", v1::DTYPE_U8, {kBufferBytes + 7}, 1),
        Entry("g.last", v1::DTYPE_U8, {4097}, 1),
    };
    absl::StatusOr<SafetensorsLayout> layout = BuildSafetensorsLayout(entries_);
    INFO(layout.status());
    REQUIRE(layout.ok());
    layout_ = *std::move(layout);
    REQUIRE(layout_.file_size > kPoolBytes);  // back-pressure is exercised
    for (size_t i = 0; i < entries_.size(); ++i) {
      sources_.push_back(Pattern(entries_[i].length, static_cast<uint32_t>(i)));
    }
    absl::StatusOr<std::unique_ptr<StagingPool>> pool =
        StagingPool::Create(kPoolBytes, kBufferBytes);
    INFO(pool.status());
    REQUIRE(pool.ok());
    pool_ = std::move(pool).value();
    path_ = dir_.File("shard-00001-model-00001-of-00001.safetensors");
  }

  const std::string& path() const { return path_; }
  const SafetensorsLayout& layout() const { return layout_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::string& source(size_t i) const { return sources_[i]; }
  StagingPool* pool() { return pool_.get(); }
  MemorySource* memory() { return &memory_; }
  void set_destination(MemorySource* destination) { destination_ = destination; }
  uint64_t ItemOffset(size_t i) const {
    return layout_.data_start + layout_.data_offsets[i];
  }
  size_t IndexOf(const std::string& fqn) const {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].fqn == fqn) return i;
    }
    FAIL("no entry " << fqn);
    return 0;
  }

  ShardWriteRequest WriteRequest() {
    ShardWriteRequest req;
    req.path = path_;
    req.layout = &layout_;
    for (const std::string& s : sources_) {
      // An empty std::string's data() is still a valid address.
      req.remote.push_back(Addr(s.data()));
      req.lengths.push_back(s.size());
    }
    req.checksum_block_bytes = kBlockBytes;
    req.source = &memory_;
    return req;
  }

  // Writes the shard or fails the test.
  ShardWriteResult WriteOrFail(IoQueue* queue) {
    ShardWriter writer(pool(), queue);
    absl::StatusOr<ShardWriteResult> result = writer.Write(WriteRequest());
    INFO(result.status());
    REQUIRE(result.ok());
    return *std::move(result);
  }

  // A read of [begin, end) of entry i into `destination` + `at`.
  ItemRead Range(size_t i, const ShardWriteResult& written, uint64_t begin,
                 uint64_t end, char* destination) const {
    ItemRead r;
    r.fqn = entries_[i].fqn;
    r.item_file_offset = ItemOffset(i);
    r.item_length = entries_[i].length;
    r.block_xxh3 = written.block_xxh3[i].data();
    r.block_count = written.block_xxh3[i].size();
    r.deliveries.push_back({begin, end, destination_, Addr(destination)});
    return r;
  }

  ShardReadRequest ReadRequest(std::vector<ItemRead> items) {
    ShardReadRequest req;
    req.path = path_;
    req.file_size = layout_.file_size;
    req.checksum_block_bytes = kBlockBytes;
    req.items = std::move(items);
    return req;
  }

  // A read of every entry whole, each into its own zeroed buffer in `out`.
  ShardReadRequest ReadAllRequest(const ShardWriteResult& written,
                                  std::vector<std::string>* out) {
    out->clear();
    for (const auto& e : entries_) out->emplace_back(e.length, '\0');
    std::vector<ItemRead> items;
    for (size_t i = 0; i < entries_.size(); ++i) {
      items.push_back(
          Range(i, written, 0, entries_[i].length, (*out)[i].data()));
    }
    return ReadRequest(std::move(items));
  }

  // Reads every entry whole into zeroed buffers (returned in `out`).
  absl::StatusOr<uint64_t> ReadAll(IoQueue* queue,
                                   const ShardWriteResult& written,
                                   std::vector<std::string>* out) {
    ShardReader reader(pool(), queue);
    return reader.Read(ReadAllRequest(written, out));
  }

 private:
  TempDir dir_;
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  SafetensorsLayout layout_;
  std::vector<std::string> sources_;
  std::unique_ptr<StagingPool> pool_;
  HostProcessMemory memory_{::getpid()};
  MemorySource* destination_ = &memory_;  // where reads deliver
};

// The checks shared by the pwrite and io_uring round trips.
void CheckFileMatchesSources(ShardFixture& f, const ShardWriteResult& result) {
  const SafetensorsLayout& layout = f.layout();
  CHECK(result.file_size == layout.file_size);
  CHECK(FileSize(f.path()) == layout.file_size);
  const std::string file = ReadWholeFile(f.path());
  REQUIRE(file.size() == layout.file_size);
  CHECK(file.compare(0, layout.data_start, layout.header) == 0);
  REQUIRE(result.block_xxh3.size() == f.entries().size());
  for (size_t i = 0; i < f.entries().size(); ++i) {
    INFO("entry " << f.entries()[i].fqn);
    CHECK(file.compare(f.ItemOffset(i), f.source(i).size(), f.source(i)) == 0);
    CHECK(result.block_xxh3[i] == ReferenceBlocks(f.source(i)));
  }
  CHECK(f.pool()->free_bytes() == kPoolBytes);  // every buffer came back
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

// What a failed or cancelled write must leave: no file (not even a partial
// one) and every staging buffer back in the pool.
void CheckLeftNoFile(ShardFixture& f) {
  CHECK_FALSE(FileExists(f.path()));
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardWriter writes the exact safetensors file with the sources' "
    "bytes and their block checksums",
    "[shard_io]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult result = f.WriteOrFail(queue.get());
  CheckFileMatchesSources(f, result);
}

TEST_CASE(
    "ShardWriter reports staging once and progress that only grows to "
    "the whole file",
    "[shard_io]") {
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
  absl::StatusOr<ShardWriteResult> result = writer.Write(req);
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

TEST_CASE("ShardWriter refuses to overwrite an existing file", "[shard_io]") {
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
    "ShardReader delivers every whole item bit-exactly after a "
    "ShardWriter save",
    "[shard_io]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  CheckReadAllMatchesSources(f, queue.get(), written);
}

TEST_CASE(
    "ShardReader delivers a sub-range in the middle of a big item and "
    "writes nothing outside it",
    "[shard_io]") {
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
    "[shard_io]") {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  const ShardWriteResult written = f.WriteOrFail(queue.get());
  const size_t big = f.IndexOf("c.big");
  const std::string& source = f.source(big);
  // Windows of 1 MiB, so that one window is consumed in several slices.
  absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(4 << 20, 1 << 20);
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
  read.deliveries.push_back({begin, end, f.memory(), Addr(part.data())});
  for (uint64_t i = 0; i < gathered.size() / 10; ++i) {
    read.deliveries.push_back(
        {i * 1000, i * 1000 + 10, f.memory(), Addr(gathered.data() + i * 10)});
  }
  ShardReadRequest req = f.ReadRequest({read});
  if (from_memory) req.memory_image = image.data();

  ShardReader reader(pool->get(), queue.get());
  absl::StatusOr<uint64_t> bytes = reader.Read(req);
  INFO(bytes.status());
  REQUIRE(bytes.ok());
  CHECK(*bytes == (from_memory ? 0 : AlignUp4096(f.ItemOffset(big) + source.size()) -
                                         f.ItemOffset(big) / 4096 * 4096));
  CHECK(whole == source);
  CHECK(part == source.substr(begin, end - begin));
  CHECK(gathered == expected_gather);
  CHECK((*pool)->free_bytes() == 4 << 20);
}

TEST_CASE(
    "ShardReader reports DataLoss naming the item and the file when a "
    "byte of the item is flipped",
    "[shard_io]") {
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
          "[shard_io]") {
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

TEST_CASE("ShardReader reports DataLoss for a truncated file", "[shard_io]") {
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
  CHECK(f.pool()->free_bytes() == kPoolBytes);
}

TEST_CASE(
    "ShardWriter cancelled before it starts returns Cancelled and "
    "leaves no file",
    "[shard_io]") {
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
    "[shard_io]") {
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
          "[shard_io]") {
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
          "[shard_io]") {
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

TEST_CASE("ShardReader returns a failing read's error naming the file",
          "[shard_io]") {
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

TEST_CASE("ShardReader returns a failing destination's error", "[shard_io]") {
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

// A queue failure (its Reap fails) or a failed transfer, with several
// transfers in flight when it hits.
enum class Fault { kTransferEio, kReapFails };

const char* FaultName(Fault fault) {
  return fault == Fault::kTransferEio ? "a transfer fails with EIO"
                                      : "the queue's Reap fails";
}

TEST_CASE(
    "ShardReader, after a read error with several reads in flight, has every "
    "buffer back in the pool and returned none while its read was outstanding",
    "[shard_io]") {
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
    "ShardWriter, after a write error with several writes in flight, has "
    "every buffer back in the pool, returned none while its write was "
    "outstanding, and leaves no file",
    "[shard_io]") {
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

// The real file operations, except that `fail` (Truncate or Fsync) returns
// an injected error; records the calls.
class FailingDataFileOps final : public FileOps {
 public:
  enum class Step { kNone, kTruncate, kFsync };
  explicit FailingDataFileOps(Step fail) : fail_(fail) {}

  std::vector<Step> calls;
  uint64_t truncated_to = 0;

  absl::Status Injected() const {
    return absl::DataLossError(
        fail_ == Step::kTruncate ? "injected ftruncate failure" : "injected fsync failure");
  }
  absl::Status Truncate(int fd, uint64_t size, const std::string& path) override {
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
    "[shard_io]") {
  using Step = FailingDataFileOps::Step;
  const Step fail = GENERATE(Step::kNone, Step::kTruncate, Step::kFsync);
  INFO("failing step " << static_cast<int>(fail));
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(kQueueDepth);
  FailingDataFileOps ops(fail);

  ShardWriter writer(f.pool(), queue.get(), ops);
  absl::StatusOr<ShardWriteResult> result = writer.Write(f.WriteRequest());

  CHECK(ops.truncated_to == f.layout().file_size);
  if (fail == Step::kNone) {
    INFO(result.status());
    REQUIRE(result.ok());
    CHECK(ops.calls == std::vector<Step>{Step::kTruncate, Step::kFsync});
    CheckFileMatchesSources(f, *result);
    return;
  }
  CHECK(result.status() == ops.Injected());
  // The protocol stopped at the failing step.
  CHECK(ops.calls.back() == fail);
  CHECK(ops.calls.size() == (fail == Step::kTruncate ? 1u : 2u));
  CheckLeftNoFile(f);
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
  CheckFileMatchesSources(f, written);
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

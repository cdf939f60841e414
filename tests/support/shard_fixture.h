// ShardFixture: one data file's worth of test material for ShardWriter
// (tests/save/shard_writer_test.cc) and ShardReader
// (tests/restore/shard_reader_test.cc), with this process's own memory as
// the peer (HostProcessMemory(getpid())).
//
// The shard has entries of varied sizes (empty, one byte, not 4-aligned,
// one window plus a few bytes, larger than the pool), a staging pool
// smaller than the file (so the writer must wait for its own writes to free
// buffers) and a checksum block size that is not a power of two (so blocks
// straddle staging windows and items sit at odd places). Every check is
// made against values computed here independently: the layout's header
// bytes, the source bytes, and XXH3-64 of each block.
//
// Thread-safety: none; one test owns a fixture.
#pragma once

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/safetensors_layout.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"
#include "restore/shard_reader.h"
#include "save/shard_writer.h"
#include "session/memory_source.h"
#include "support/temp_dir.h"

namespace ckpt::testing {

inline uint64_t AddressOf(const void* p) { return reinterpret_cast<uint64_t>(p); }
inline uint64_t AlignUp4096(uint64_t n) { return (n + 4095) / 4096 * 4096; }

// Bytes that differ at every position and between seeds.
inline std::string ShardPattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + seed * 29 + (i >> 9) + 1) & 0xff);
  }
  return data;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline uint64_t FileSize(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

inline bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
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

// A queue failure (its Reap fails) or a failed transfer, with several
// transfers in flight when it hits.
enum class Fault { kTransferEio, kReapFails };

inline const char* FaultName(Fault fault) {
  return fault == Fault::kTransferEio ? "a transfer fails with EIO"
                                      : "the queue's Reap fails";
}

// The result of a write of one file (the request must have one).
inline absl::StatusOr<ShardWriteResult> WriteOne(ShardWriter& writer,
                                                 const ShardWriteRequest& req) {
  REQUIRE(req.files.size() == 1);
  absl::StatusOr<std::vector<ShardWriteResult>> results = writer.Write(req);
  if (!results.ok()) return results.status();
  REQUIRE(results->size() == 1);
  return std::move(results->front());
}

class ShardFixture {
 public:
  static constexpr uint32_t kBufferBytes = 64 * 1024;
  static constexpr uint64_t kPoolBytes = 8 * kBufferBytes;
  static constexpr uint64_t kBlockBytes = 10000;  // not a power of two
  static constexpr uint32_t kQueueDepth = 8;

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
      sources_.push_back(
          ShardPattern(entries_[i].length, static_cast<uint32_t>(i)));
    }
    absl::StatusOr<std::unique_ptr<StagingPool>> pool =
        StagingPool::Create(kPoolBytes, kBufferBytes);
    INFO(pool.status());
    REQUIRE(pool.ok());
    pool_ = std::move(pool).value();
    path_ = dir_.File("shard-00001-model-00001-of-00001.safetensors");
  }

  // XXH3-64 of each kBlockBytes block of `data` (one of nothing if empty).
  static std::vector<uint64_t> ReferenceBlocks(const std::string& data) {
    std::vector<uint64_t> out;
    for (uint64_t at = 0; at < data.size(); at += kBlockBytes) {
      out.push_back(XXH3_64bits(
          data.data() + at, std::min<uint64_t>(kBlockBytes, data.size() - at)));
    }
    if (out.empty()) out.push_back(XXH3_64bits(nullptr, 0));
    return out;
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

  // The fixture's file, at `path` (the fixture's own by default).
  ShardFile File(const std::string& path = "") const {
    ShardFile file;
    file.path = path.empty() ? path_ : path;
    file.layout = &layout_;
    for (const std::string& s : sources_) {
      // An empty std::string's data() is still a valid address.
      file.remote.push_back(AddressOf(s.data()));
      file.lengths.push_back(s.size());
    }
    return file;
  }

  // A write of the fixture's one file.
  ShardWriteRequest WriteRequest() {
    ShardWriteRequest req;
    req.files.push_back(File());
    req.checksum_block_bytes = kBlockBytes;
    req.source = &memory_;
    return req;
  }

  // Writes the shard or fails the test.
  ShardWriteResult WriteOrFail(IoQueue* queue) {
    ShardWriter writer(pool(), queue);
    absl::StatusOr<ShardWriteResult> result = WriteOne(writer, WriteRequest());
    INFO(result.status());
    REQUIRE(result.ok());
    return *std::move(result);
  }

  // A read of [begin, end) of entry i into `destination`.
  ItemRead Range(size_t i, const ShardWriteResult& written, uint64_t begin,
                 uint64_t end, char* destination) const {
    ItemRead r;
    r.fqn = entries_[i].fqn;
    r.item_file_offset = ItemOffset(i);
    r.item_length = entries_[i].length;
    r.block_xxh3 = written.block_xxh3[i].data();
    r.block_count = written.block_xxh3[i].size();
    r.deliveries.push_back({begin, end, destination_, AddressOf(destination)});
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

  // The file (the fixture's, or `path`) holds exactly the header and the
  // sources' bytes, `result` their block checksums, and every buffer is
  // back in the pool.
  void CheckFileMatchesSources(const ShardWriteResult& result,
                               const std::string& path = "") {
    const std::string& at = path.empty() ? path_ : path;
    INFO("file " << at);
    CHECK(result.file_size == layout_.file_size);
    CHECK(FileSize(at) == layout_.file_size);
    const std::string file = ReadWholeFile(at);
    REQUIRE(file.size() == layout_.file_size);
    CHECK(file.compare(0, layout_.data_start, layout_.header) == 0);
    REQUIRE(result.block_xxh3.size() == entries_.size());
    for (size_t i = 0; i < entries_.size(); ++i) {
      INFO("entry " << entries_[i].fqn);
      CHECK(file.compare(ItemOffset(i), sources_[i].size(), sources_[i]) == 0);
      CHECK(result.block_xxh3[i] == ReferenceBlocks(sources_[i]));
    }
    CHECK(pool_->free_bytes() == kPoolBytes);  // every buffer came back
  }

 private:
  static SafetensorsEntry Entry(std::string fqn, v1::DType dtype,
                                std::vector<uint64_t> shape,
                                uint64_t element_size) {
    SafetensorsEntry e;
    e.fqn = std::move(fqn);
    e.dtype = dtype;
    e.local_shape = shape;
    e.offsets.assign(shape.size(), 0);
    e.length = element_size;
    for (uint64_t d : shape) e.length *= d;
    return e;
  }

  TempDir dir_;
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  SafetensorsLayout layout_;
  std::vector<std::string> sources_;
  std::unique_ptr<StagingPool> pool_;
  HostProcessMemory memory_{::getpid()};
  MemorySource* destination_ = &memory_;  // where reads deliver
};

// What a failed or cancelled write of the fixture's file must leave: no
// file (not even a partial one) and every staging buffer back in the pool.
inline void CheckLeftNoFile(ShardFixture& f) {
  CHECK_FALSE(FileExists(f.path()));
  CHECK(f.pool()->free_bytes() == ShardFixture::kPoolBytes);
}

// A pool that holds the whole of the fixture's file (`copies` times), with
// buffers of the fixture's size, so that nothing but the cap or the tier
// could hold staging up.
inline std::unique_ptr<StagingPool> PoolHoldingTheFile(const ShardFixture& f,
                                                       int copies = 1) {
  constexpr uint64_t kBuffer = ShardFixture::kBufferBytes;
  const uint64_t windows = (f.layout().file_size + kBuffer - 1) / kBuffer;
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create((copies * windows + 2) * kBuffer, kBuffer);
  INFO(pool.status());
  REQUIRE(pool.ok());
  return std::move(pool).value();
}

}  // namespace ckpt::testing

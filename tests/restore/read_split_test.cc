// Tests of SplitShardRead on files ShardWriter wrote (ShardFixture's
// material, tests/support/shard_fixture.h): the parts of a read, each read
// by its own ShardReader from a memory image, deliver exactly what the
// whole read delivers; every piece of a cut item starts on one of its
// blocks with that block's checksums; the header is checked by one part; a
// damaged block fails the one part that holds it with the error the whole
// read gives; and reads that are small, or that ShardReader would refuse,
// come back whole.
#include "restore/read_split.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/io_queue.h"
#include "restore/shard_reader.h"
#include "support/shard_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::AddressOf;
using ::ckpt::testing::ReadWholeFile;
using ::ckpt::testing::ShardFixture;

constexpr uint64_t kBlock = ShardFixture::kBlockBytes;

// The whole of every entry, each into its own zeroed buffer, plus into
// c.big an overlapping range and a gather of 10 bytes in every 1000, so
// that cuts fall inside deliveries of every shape.
struct Material {
  ShardFixture f;
  std::unique_ptr<IoQueue> queue = CreatePwriteQueue(ShardFixture::kQueueDepth);
  ShardWriteResult written = f.WriteOrFail(queue.get());
  std::string image = ReadWholeFile(f.path());
  std::vector<std::string> whole;
  std::string part, gathered;
  static constexpr uint64_t kPartBegin = 100, kPartEnd = 700000;

  ShardReadRequest Request() {
    ShardReadRequest req = f.ReadAllRequest(written, &whole);
    part.assign(kPartEnd - kPartBegin, '\0');
    gathered.assign(f.source(f.IndexOf("c.big")).size() / 1000 * 10, '\0');
    ItemRead& big = req.items[f.IndexOf("c.big")];
    big.deliveries.push_back({kPartBegin, kPartEnd, f.memory(), AddressOf(part.data())});
    for (uint64_t i = 0; i < gathered.size() / 10; ++i) {
      big.deliveries.push_back(
          {i * 1000, i * 1000 + 10, f.memory(), AddressOf(gathered.data() + i * 10)});
    }
    req.expected_header = f.layout().header;
    req.memory_image = image.data();
    return req;
  }

  void CheckDelivered() {
    for (size_t i = 0; i < f.entries().size(); ++i) {
      INFO("entry " << f.entries()[i].fqn);
      CHECK(whole[i] == f.source(i));
    }
    const std::string& big = f.source(f.IndexOf("c.big"));
    CHECK(part == big.substr(kPartBegin, kPartEnd - kPartBegin));
    std::string expected_gather;
    for (uint64_t at = 0; at + 10 <= big.size(); at += 1000) {
      expected_gather += big.substr(at, 10);
    }
    CHECK(gathered == expected_gather);
  }
};

// Bytes of widened range in `part`.
uint64_t PartBytes(const ShardReadRequest& part) {
  uint64_t bytes = 0;
  for (const ItemRead& item : part.items) {
    const FileRange r = WidenedItemRange(item, kBlock);
    bytes += r.end - r.begin;
  }
  return bytes;
}

TEST_CASE("the parts of a split read deliver exactly what the whole read delivers, "
          "each piece of a cut item on one of its blocks",
          "[shard_io][read_split]") {
  const size_t parts = GENERATE(2, 3, 7);
  INFO(parts << " parts");
  Material m;
  const uint64_t min_part = 3 * kBlock;
  std::vector<ShardReadRequest> split = SplitShardRead(m.Request(), parts, min_part);
  REQUIRE(split.size() > 1);
  REQUIRE(split.size() <= parts);

  CHECK(split.front().expected_header == m.f.layout().header);
  uint64_t previous_end = 0;
  for (size_t p = 0; p < split.size(); ++p) {
    INFO("part " << p);
    const ShardReadRequest& part = split[p];
    if (p > 0) CHECK(part.expected_header.empty());
    CHECK(part.memory_image == m.image.data());
    CHECK(part.file_size == m.f.layout().file_size);
    REQUIRE_FALSE(part.items.empty());
    if (p + 1 < split.size()) CHECK(PartBytes(part) >= min_part);
    for (const ItemRead& item : part.items) {
      INFO("item " << item.fqn << " from item byte " << item.offset_in_item);
      const size_t i = m.f.IndexOf(item.fqn);
      // Parts follow each other in file order.
      CHECK(item.item_file_offset >= previous_end);
      previous_end = item.item_file_offset + item.item_length;
      CHECK(item.offset_in_item % kBlock == 0);
      CHECK(item.item_file_offset == m.f.ItemOffset(i) + item.offset_in_item);
      CHECK(item.block_xxh3 == m.written.block_xxh3[i].data() + item.offset_in_item / kBlock);
      CHECK(item.block_count == m.written.block_xxh3[i].size() - item.offset_in_item / kBlock);
      CHECK(item.offset_in_item + item.item_length <= m.f.entries()[i].length);
    }
  }
  // c.big is far larger than a part: it was cut.
  size_t big_pieces = 0;
  for (const ShardReadRequest& part : split) {
    for (const ItemRead& item : part.items) big_pieces += item.fqn == "c.big";
  }
  CHECK(big_pieces > 1);

  for (ShardReadRequest& part : split) {
    ShardReader reader(m.f.pool(), m.queue.get());
    absl::StatusOr<uint64_t> bytes = reader.Read(part);
    INFO(bytes.status());
    REQUIRE(bytes.ok());
    CHECK(*bytes == 0);  // from memory
  }
  m.CheckDelivered();
  CHECK(m.f.pool()->free_bytes() == ShardFixture::kPoolBytes);
}

TEST_CASE("a damaged block of a cut item fails the one part that holds it, with the "
          "error of the whole read",
          "[shard_io][read_split]") {
  Material m;
  const size_t big = m.f.IndexOf("c.big");
  const uint64_t bad_block = m.f.source(big).size() / kBlock * 2 / 3;
  m.image[m.f.ItemOffset(big) + bad_block * kBlock + 17] ^= 0x10;

  absl::Status whole_error;
  {
    ShardReader reader(m.f.pool(), m.queue.get());
    whole_error = reader.Read(m.Request()).status();
  }
  REQUIRE(whole_error.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(whole_error.message()),
             Catch::Contains("block " + std::to_string(bad_block) + ":"));

  std::vector<ShardReadRequest> split = SplitShardRead(m.Request(), 5, 3 * kBlock);
  REQUIRE(split.size() > 1);
  std::vector<absl::Status> failed;
  for (ShardReadRequest& part : split) {
    ShardReader reader(m.f.pool(), m.queue.get());
    absl::Status status = reader.Read(part).status();
    if (!status.ok()) failed.push_back(status);
  }
  REQUIRE(failed.size() == 1);
  CHECK(failed[0] == whole_error);
}

TEST_CASE("a read too small to split, or one ShardReader refuses, comes back whole",
          "[shard_io][read_split]") {
  Material m;
  ShardReadRequest req = m.Request();
  const size_t items = req.items.size();
  uint64_t total = 0;
  for (const ItemRead& item : req.items) {
    const FileRange r = WidenedItemRange(item, kBlock);
    total += r.end - r.begin;
  }

  SECTION("one part asked for") {
    CHECK(SplitShardRead(std::move(req), 1, kBlock).size() == 1);
  }
  SECTION("less than two parts' worth") {
    std::vector<ShardReadRequest> split = SplitShardRead(std::move(req), 8, total / 2 + 1);
    REQUIRE(split.size() == 1);
    CHECK(split[0].items.size() == items);
    CHECK(split[0].expected_header == m.f.layout().header);
  }
  SECTION("an item beyond the file's end") {
    req.items.back().item_length = m.f.layout().file_size;
    std::vector<ShardReadRequest> split = SplitShardRead(std::move(req), 4, kBlock);
    REQUIRE(split.size() == 1);
    ShardReader reader(m.f.pool(), m.queue.get());
    const absl::Status status = reader.Read(split[0]).status();
    CHECK(status.code() == absl::StatusCode::kInternal);
    CHECK_THAT(std::string(status.message()), Catch::Contains("bad read range for item"));
  }
  SECTION("items out of file order") {
    std::swap(req.items[1], req.items[2]);
    CHECK(SplitShardRead(std::move(req), 4, kBlock).size() == 1);
  }
}

}  // namespace
}  // namespace ckpt

// Tests of BlockHasher: its digests must equal XXH3-64 of each fixed-size
// block of an item however the item's bytes are cut into pieces.
#include "format/block_hasher.h"

#include <xxhash.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {
namespace {

// Bytes that differ at every position, so a misplaced byte changes a digest.
std::string Pattern(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + (i >> 8) * 7 + 3) & 0xff);
  }
  return data;
}

// The reference: XXH3-64 of each block, computed in one shot per block.
std::vector<uint64_t> Reference(const std::string& data, uint64_t block) {
  std::vector<uint64_t> out;
  for (uint64_t at = 0; at < data.size(); at += block) {
    const uint64_t n = std::min<uint64_t>(block, data.size() - at);
    out.push_back(XXH3_64bits(data.data() + at, n));
  }
  if (out.empty()) out.push_back(XXH3_64bits(nullptr, 0));
  return out;
}

// Feeds `data` in pieces whose sizes cycle through `sizes`.
std::vector<uint64_t> HashInPieces(BlockHasher& hasher, const std::string& data,
                                   const std::vector<uint64_t>& sizes) {
  uint64_t at = 0;
  for (size_t i = 0; at < data.size(); ++i) {
    const uint64_t n =
        std::min<uint64_t>(sizes[i % sizes.size()], data.size() - at);
    hasher.Update(data.data() + at, n);
    at += n;
  }
  return hasher.Finish();
}

TEST_CASE(
    "BlockHasher digests equal XXH3 of each block whatever the piece "
    "sizes",
    "[block_hasher]") {
  constexpr uint64_t kBlock = 1000;
  const std::string data = Pattern(10 * kBlock + 337);
  const std::vector<uint64_t> expected = Reference(data, kBlock);
  REQUIRE(expected.size() == 11);

  const std::vector<std::vector<uint64_t>> piece_plans = {
      {1},                 // byte at a time
      {7, 13, 999, 1001},  // odd sizes, straddling block boundaries
      {kBlock},            // exactly one block per piece
      {kBlock - 1},        // always one short of a boundary
      {2 * kBlock + 1},    // several blocks in one piece
      {data.size()},       // everything at once
      {0, 5, 0, 3000},     // empty pieces mixed in
  };
  for (const auto& plan : piece_plans) {
    INFO("first piece size " << plan[0] << ", " << plan.size() << " sizes");
    BlockHasher hasher(kBlock);
    CHECK(HashInPieces(hasher, data, plan) == expected);
  }
}

TEST_CASE(
    "BlockHasher gives no extra digest for an exact multiple of the "
    "block size",
    "[block_hasher]") {
  constexpr uint64_t kBlock = 4096;
  const std::string data = Pattern(3 * kBlock);
  BlockHasher hasher(kBlock);
  const std::vector<uint64_t> got = HashInPieces(hasher, data, {100});
  REQUIRE(got.size() == 3);
  CHECK(got == Reference(data, kBlock));
}

TEST_CASE("BlockHasher gives an empty item one digest of zero bytes",
          "[block_hasher]") {
  BlockHasher hasher(64);
  const std::vector<uint64_t> got = hasher.Finish();
  REQUIRE(got.size() == 1);
  CHECK(got[0] == XXH3_64bits(nullptr, 0));
}

TEST_CASE(
    "BlockHasher gives an item shorter than a block one digest of its "
    "bytes",
    "[block_hasher]") {
  const std::string data = Pattern(17);
  BlockHasher hasher(1 << 20);
  hasher.Update(data.data(), 10);
  hasher.Update(data.data() + 10, 7);
  const std::vector<uint64_t> got = hasher.Finish();
  REQUIRE(got.size() == 1);
  CHECK(got[0] == XXH3_64bits(data.data(), data.size()));
}

TEST_CASE("BlockHasher starts the next item afresh after Finish",
          "[block_hasher]") {
  constexpr uint64_t kBlock = 100;
  const std::string first = Pattern(250);              // ends mid-block
  const std::string second = Pattern(431).substr(31);  // different bytes
  BlockHasher hasher(kBlock);
  CHECK(HashInPieces(hasher, first, {33}) == Reference(first, kBlock));
  CHECK(HashInPieces(hasher, second, {71}) == Reference(second, kBlock));
  // And an empty item right after a non-empty one.
  const std::vector<uint64_t> empty = hasher.Finish();
  REQUIRE(empty.size() == 1);
  CHECK(empty[0] == XXH3_64bits(nullptr, 0));
}

}  // namespace
}  // namespace ckpt

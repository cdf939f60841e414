// The in-memory tier holds at most its budget, serves only complete
// checkpoints, and evicts the oldest unused checkpoint to make room.
#include "storage/memory_tier.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

namespace ckpt {
namespace {

TEST_CASE("a tier serves an image only once its checkpoint is complete", "[memory_tier]") {
  MemoryTier tier(1 << 20);
  auto image = tier.Reserve("job", "a", "f", 4096);
  REQUIRE(image != nullptr);
  std::memset(image->data(), 7, 4096);
  CHECK(tier.Find("job", "a", "f", 4096) == nullptr);
  tier.MarkComplete("job", "a");
  auto found = tier.Find("job", "a", "f", 4096);
  REQUIRE(found != nullptr);
  CHECK(found->data()[4095] == 7);
  CHECK(tier.Find("job", "a", "f", 4097) == nullptr);  // size must match
  CHECK(tier.Find("job", "a", "g", 4096) == nullptr);
}

TEST_CASE("a tier evicts the oldest other checkpoint to stay within budget",
          "[memory_tier]") {
  MemoryTier tier(3 * 4096);
  REQUIRE(tier.Reserve("job", "a", "f", 2 * 4096) != nullptr);
  tier.MarkComplete("job", "a");
  REQUIRE(tier.Reserve("job", "b", "f", 2 * 4096) != nullptr);
  CHECK(tier.used_bytes() == 2 * 4096);
  CHECK(tier.Find("job", "a", "f", 2 * 4096) == nullptr);  // evicted
  // The checkpoint being reserved for is never evicted for itself.
  CHECK(tier.Reserve("job", "b", "g", 2 * 4096) == nullptr);
  CHECK(tier.Reserve("job", "c", "f", 4 * 4096) == nullptr);  // over budget
}

TEST_CASE("a tier does not evict an image a load is reading", "[memory_tier]") {
  MemoryTier tier(2 * 4096);
  REQUIRE(tier.Reserve("job", "a", "f", 2 * 4096) != nullptr);
  tier.MarkComplete("job", "a");
  auto reading = tier.Find("job", "a", "f", 2 * 4096);
  REQUIRE(reading != nullptr);
  CHECK(tier.Reserve("job", "b", "f", 4096) == nullptr);
  reading.reset();
  CHECK(tier.Reserve("job", "b", "f", 4096) != nullptr);
}

TEST_CASE("dropping a checkpoint frees its budget", "[memory_tier]") {
  MemoryTier tier(4096);
  REQUIRE(tier.Reserve("job", "a", "f", 4096) != nullptr);
  tier.Drop("job", "a");
  CHECK(tier.used_bytes() == 0);
  CHECK(tier.Reserve("job", "b", "f", 4096) != nullptr);
}

TEST_CASE("a tier with no budget keeps nothing", "[memory_tier]") {
  MemoryTier tier(0);
  CHECK(tier.Reserve("job", "a", "f", 1) == nullptr);
}

TEST_CASE("shrinking a tier's budget evicts the oldest checkpoints nobody holds "
          "until the rest fit",
          "[memory_tier]") {
  MemoryTier tier(4 * 4096);
  REQUIRE(tier.Reserve("job", "a", "f", 2 * 4096) != nullptr);
  tier.MarkComplete("job", "a");
  REQUIRE(tier.Reserve("job", "b", "f", 4096) != nullptr);
  tier.MarkComplete("job", "b");
  REQUIRE(tier.Reserve("job", "c", "f", 4096) != nullptr);
  tier.MarkComplete("job", "c");
  auto reading = tier.Find("job", "b", "f", 4096);  // a load holds b
  REQUIRE(reading != nullptr);

  // 1 page must go: a (the oldest, 2 pages) goes; b is held, c fits then.
  CHECK(tier.SetBudget(3 * 4096) == 2 * 4096);
  CHECK(tier.budget() == 3 * 4096);
  CHECK(tier.used_bytes() == 2 * 4096);
  CHECK(tier.Find("job", "a", "f", 2 * 4096) == nullptr);
  CHECK(tier.Find("job", "c", "f", 4096) != nullptr);

  // To 0: c goes now; b, still being read, stays until its reader is done
  // and the next shrink (or reservation) comes.
  CHECK(tier.SetBudget(0) == 4096);
  CHECK(tier.Find("job", "b", "f", 4096) != nullptr);
  reading.reset();
  CHECK(tier.SetBudget(0) == 4096);
  CHECK(tier.used_bytes() == 0);
  CHECK(tier.Reserve("job", "d", "f", 4096) == nullptr);  // off now

  // Growing it turns it on again.
  CHECK(tier.SetBudget(4096) == 0);
  CHECK(tier.Reserve("job", "d", "f", 4096) != nullptr);
}

TEST_CASE("every image of an evicted checkpoint serves a later file of its size, and "
          "spares give way to images of other sizes within the budget",
          "[memory_tier]") {
  constexpr uint64_t kFile = 4 * 4096;
  MemoryTier tier(4 * kFile);
  // A checkpoint of four ranks' files, each filled; then the next save.
  for (int rank = 0; rank < 4; ++rank) {
    auto image = tier.Reserve("job", "a", "rank" + std::to_string(rank), kFile);
    REQUIRE(image != nullptr);
    std::memset(image->data(), 0xAB, kFile);
  }
  tier.MarkComplete("job", "a");
  for (int rank = 0; rank < 4; ++rank) {
    auto image = tier.Reserve("job", "b", "rank" + std::to_string(rank), kFile);
    REQUIRE(image != nullptr);
    // An evicted image, not a fresh (zero-filled) mapping.
    CHECK(static_cast<unsigned char>(image->data()[0]) == 0xAB);
    CHECK(static_cast<unsigned char>(image->data()[kFile - 1]) == 0xAB);
    CHECK(tier.used_bytes() <= 4 * kFile);
  }
  CHECK(tier.Find("job", "a", "rank0", kFile) == nullptr);
  CHECK(tier.used_bytes() == 4 * kFile);

  // b evicted for one larger file: the three spares it does not reuse are
  // unmapped to make room, and the budget holds throughout.
  tier.MarkComplete("job", "b");
  auto big = tier.Reserve("job", "c", "whole", 2 * kFile);
  REQUIRE(big != nullptr);
  CHECK(static_cast<unsigned char>(big->data()[0]) == 0);  // fresh
  CHECK(tier.used_bytes() <= 4 * kFile);
  CHECK(tier.Find("job", "b", "rank0", kFile) == nullptr);
  // What is left of b's images still serves files of their size.
  auto small = tier.Reserve("job", "c", "extra", kFile);
  REQUIRE(small != nullptr);
  CHECK(tier.used_bytes() <= 4 * kFile);
  // Shrinking to nothing unmaps the spares too.
  big.reset();
  small.reset();
  tier.SetBudget(0);
  CHECK(tier.used_bytes() == 0);
}

}  // namespace
}  // namespace ckpt

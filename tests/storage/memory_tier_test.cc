// The in-memory tier holds at most its budget, serves only committed
// checkpoints, and evicts the oldest unused checkpoint to make room.
#include "storage/memory_tier.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace ckpt {
namespace {

TEST_CASE("a tier serves an image only once its checkpoint committed", "[memory_tier]") {
  MemoryTier tier(1 << 20);
  auto image = tier.Reserve("job", "a", "f", 4096);
  REQUIRE(image != nullptr);
  std::memset(image->data(), 7, 4096);
  CHECK(tier.Find("job", "a", "f", 4096) == nullptr);
  tier.MarkCommitted("job", "a");
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
  tier.MarkCommitted("job", "a");
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
  tier.MarkCommitted("job", "a");
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
  tier.MarkCommitted("job", "a");
  REQUIRE(tier.Reserve("job", "b", "f", 4096) != nullptr);
  tier.MarkCommitted("job", "b");
  REQUIRE(tier.Reserve("job", "c", "f", 4096) != nullptr);
  tier.MarkCommitted("job", "c");
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

}  // namespace
}  // namespace ckpt

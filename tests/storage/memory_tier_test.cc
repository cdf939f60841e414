// The in-memory tier holds at most its budget, serves only complete
// checkpoints, evicts the oldest unused checkpoint to make room, and,
// once a GPU trainer is connected, serves only pinned images.
#include "storage/memory_tier.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"

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

TEST_CASE("a dropped checkpoint's images nobody holds serve the next file of "
          "their size, and give way to one of another size",
          "[memory_tier]") {
  MemoryTier tier(2 * 4096);
  auto image = tier.Reserve("job", "a", "f", 4096);
  REQUIRE(image != nullptr);
  std::memset(image->data(), 0xAB, 4096);
  image.reset();
  auto held = tier.Reserve("job", "a", "g", 4096);  // a writer still holds it
  REQUIRE(held != nullptr);
  tier.MarkComplete("job", "a");
  tier.Drop("job", "a");  // deleted by retention
  CHECK(tier.Find("job", "a", "f", 4096) == nullptr);
  CHECK(tier.used_bytes() == 4096);  // f, a spare; g left the budget
  auto reused = tier.Reserve("job", "b", "f", 4096);
  REQUIRE(reused != nullptr);
  CHECK(static_cast<unsigned char>(reused->data()[4095]) == 0xAB);  // not a fresh mapping
  CHECK(tier.used_bytes() == 4096);
  held.reset();

  tier.Drop("job", "b");  // failed
  CHECK(tier.used_bytes() == 0);  // dropped while held: gone from the budget
  reused.reset();
  REQUIRE(tier.Reserve("job", "c", "f", 4096) != nullptr);
  tier.Drop("job", "c");
  CHECK(tier.used_bytes() == 4096);
  auto other = tier.Reserve("job", "d", "f", 2 * 4096);  // the spare is unmapped
  REQUIRE(other != nullptr);
  CHECK(static_cast<unsigned char>(other->data()[0]) == 0);
  CHECK(tier.used_bytes() == 2 * 4096);
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

// Counts pins and unpins; a pin can be held until the test lets it end,
// or fail.
class CountingPinner final : public ImagePinner {
 public:
  absl::StatusOr<bool> Pin(char* /*data*/, uint64_t /*size*/) override {
    entered.Notify();
    if (hold) release.WaitForNotification();
    pins.fetch_add(1);
    if (fail) return absl::ResourceExhaustedError("no memory to lock");
    return true;
  }
  void Unpin(char* /*data*/, uint64_t /*size*/) override { unpins.fetch_add(1); }

  bool hold = false;
  bool fail = false;
  absl::Notification entered;
  absl::Notification release;
  std::atomic<int> pins{0};
  std::atomic<int> unpins{0};
};

TEST_CASE("a load that comes before the pin after the commit gets the image "
          "pinned, once",
          "[memory_tier]") {
  CountingPinner pinner;
  {
    MemoryTier tier(1 << 20);
    REQUIRE(tier.Reserve("job", "a", "f", 4096) != nullptr);
    tier.MarkComplete("job", "a");
    // No GPU trainer yet: nothing is pinned.
    REQUIRE(tier.Find("job", "a", "f", 4096) != nullptr);
    CHECK(pinner.pins == 0);

    tier.SetPinner(&pinner);
    REQUIRE(tier.Find("job", "a", "f", 4096) != nullptr);
    CHECK(pinner.pins == 1);
    tier.Pin("job", "a");  // the pin after the commit finds it done
    REQUIRE(tier.Find("job", "a", "f", 4096) != nullptr);
    CHECK(pinner.pins == 1);
    // Dropped, it stays pinned as a spare; the next checkpoint's file of
    // its size takes it pinned.
    tier.Drop("job", "a");
    CHECK(pinner.unpins == 0);
    REQUIRE(tier.Reserve("job", "b", "f", 4096) != nullptr);
    tier.MarkComplete("job", "b");
    tier.Pin("job", "b");
    REQUIRE(tier.Find("job", "b", "f", 4096) != nullptr);
    CHECK(pinner.pins == 1);
  }
  CHECK(pinner.unpins == 1);  // unpinned when it is unmapped
}

// A tier whose pinner is set, holding checkpoint "a" (complete) with the
// one-page file "f".
struct TierWithPinner {
  CountingPinner pinner;
  MemoryTier tier{1 << 20};

  TierWithPinner(bool hold, bool fail) {
    pinner.hold = hold;
    pinner.fail = fail;
    tier.SetPinner(&pinner);
    REQUIRE(tier.Reserve("job", "a", "f", 4096) != nullptr);
    tier.MarkComplete("job", "a");
  }
};

TEST_CASE("a load waits for the pin in progress of the image it reads",
          "[memory_tier]") {
  TierWithPinner t(/*hold=*/true, /*fail=*/false);
  CountingPinner& pinner = t.pinner;
  MemoryTier& tier = t.tier;
  std::thread committer([&] { tier.Pin("job", "a"); });
  pinner.entered.WaitForNotification();

  std::atomic<bool> found{false};
  std::thread loader([&] { found = tier.Find("job", "a", "f", 4096) != nullptr; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(found);  // still waiting for the pin
  pinner.release.Notify();
  loader.join();
  committer.join();
  CHECK(found);
  CHECK(pinner.pins == 1);
}

TEST_CASE("an image whose pin failed is served unpinned and not pinned again",
          "[memory_tier]") {
  TierWithPinner t(/*hold=*/false, /*fail=*/true);
  CountingPinner& pinner = t.pinner;
  MemoryTier& tier = t.tier;
  tier.Pin("job", "a");
  CHECK(pinner.pins == 1);
  CHECK(tier.Find("job", "a", "f", 4096) != nullptr);
  CHECK(tier.Find("job", "a", "f", 4096) != nullptr);
  CHECK(pinner.pins == 1);
  tier.Drop("job", "a");
  CHECK(pinner.unpins == 0);
}

}  // namespace
}  // namespace ckpt

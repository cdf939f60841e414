// PartSlots (storage/s3/part_slots.h): the parts-in-flight bound that
// uploads running side by side share, with the part buffers it lends.
#include "storage/s3/part_slots.h"

#include <atomic>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"

namespace ckpt::s3 {
namespace {

TEST_CASE("part slots: no more than the bound are taken, a wait ends at its deadline or "
          "when the caller gives up, and a slot given back lets a waiter in",
          "[part_slots]") {
  PartSlots slots(2, 1 << 20);
  absl::StatusOr<PartSlots::Slot> a = slots.Acquire(true, absl::InfiniteFuture());
  absl::StatusOr<PartSlots::Slot> b = slots.Acquire(false, absl::InfiniteFuture());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(slots.taken() == 2);
  CHECK(a->scratch().size() >= (1u << 20));
  CHECK(b->scratch().empty());
  CHECK(slots.buffers() == 1);

  const absl::Time start = absl::Now();
  absl::StatusOr<PartSlots::Slot> late =
      slots.Acquire(false, absl::Now() + absl::Milliseconds(200));
  CHECK(absl::IsDeadlineExceeded(late.status()));
  CHECK(absl::Now() - start >= absl::Milliseconds(190));

  std::atomic<bool> give_up{false};
  std::thread stop([&] {
    absl::SleepFor(absl::Milliseconds(100));
    give_up = true;
  });
  absl::StatusOr<PartSlots::Slot> abandoned =
      slots.Acquire(false, absl::InfiniteFuture(), &give_up);
  stop.join();
  CHECK(absl::IsCancelled(abandoned.status()));
  CHECK(slots.taken() == 2);

  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(100));
    *a = PartSlots::Slot();  // gives a's slot, and its buffer, back
  });
  absl::StatusOr<PartSlots::Slot> waited = slots.Acquire(true, absl::InfiniteFuture());
  release.join();
  REQUIRE(waited.ok());
  CHECK(waited->scratch().size() >= (1u << 20));
  CHECK(slots.buffers() == 1);  // a's buffer, lent again
  CHECK(slots.taken() == 2);
}

TEST_CASE("part slots: the buffers are freed once every slot is back and nobody waits",
          "[part_slots]") {
  PartSlots slots(3, 1 << 20);
  {
    absl::StatusOr<PartSlots::Slot> a = slots.Acquire(true, absl::InfiniteFuture());
    absl::StatusOr<PartSlots::Slot> b = slots.Acquire(true, absl::InfiniteFuture());
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(slots.buffers() == 2);
    *a = PartSlots::Slot();
    CHECK(slots.buffers() == 2);  // b still out: a's buffer kept for the next part
  }
  CHECK(slots.taken() == 0);
  CHECK(slots.buffers() == 0);
}

}  // namespace
}  // namespace ckpt::s3

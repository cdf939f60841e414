#include "session/layout_budget.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "session/session.h"
#include "support/own_process_session.h"

namespace ckpt {
namespace {

using ::ckpt::testing::OpenOwnProcessSession;
using ::ckpt::testing::RegisterHostRegion;

// A layout of `items` one-page float tensors in region `region`, unplanned
// (AddLayout takes what PlanTensorLayout built; the plan's size counts
// like the items').
std::shared_ptr<TensorLayout> LayoutOf(uint32_t items, uint64_t region) {
  auto layout = std::make_shared<TensorLayout>();
  for (uint32_t i = 0; i < items; ++i) {
    v1::TensorItem item;
    item.set_fqn(absl::StrCat("model.layers.", i, ".weight"));
    item.set_dtype(v1::DTYPE_F32);
    item.add_global_shape(1024);
    item.add_offsets(0);
    item.add_local_shape(1024);
    item.mutable_memory()->set_region_id(region);
    item.mutable_memory()->set_offset(0);
    item.mutable_memory()->set_length(4096);
    layout->items.push_back(item);
    layout->remote.push_back(0);
  }
  PlannedFile file;
  file.name = "shard-00001.safetensors";
  file.layout.header = std::string(300 * items, ' ');
  layout->plan.files.push_back(file);
  return layout;
}

}  // namespace

TEST_CASE(
    "LayoutBudget refuses a layout past the per-session or the daemon's "
    "limit, naming it, and a dropped charge gives its bytes back",
    "[layout_budget]") {
  auto budget = LayoutBudget::Create({.per_session = 100, .total = 150});
  auto a = budget->Reserve(1, 60);
  REQUIRE(a.ok());
  auto too_much = budget->Reserve(1, 50);
  CHECK(absl::IsResourceExhausted(too_much.status()));
  CHECK(absl::StrContains(
      too_much.status().message(),
      "--layout_bytes_per_session 100): session 1's layouts (with those being built) hold 60"));
  auto b = budget->Reserve(2, 80);
  REQUIRE(b.ok());
  auto over_total = budget->Reserve(2, 20);
  CHECK(absl::IsResourceExhausted(over_total.status()));
  CHECK(absl::StrContains(
      over_total.status().message(),
      "--layout_bytes_total 150): the layouts of all sessions (with those being built) hold 140"));
  // Sizes near the top of uint64_t are refused, not wrapped into room.
  CHECK(!budget->Reserve(3, std::numeric_limits<uint64_t>::max()).ok());
  CHECK(budget->used() == 140);
  CHECK(budget->used_by(1) == 60);

  { LayoutBudget::Charge dropped = *std::move(a); }
  CHECK(budget->used() == 80);
  CHECK(budget->used_by(1) == 0);
  CHECK(budget->Reserve(2, 20).ok());  // that charge is dropped at once too
  CHECK(budget->used() == 80);
}

TEST_CASE(
    "a session's layout stays charged until the session has ended and no "
    "save uses it any more",
    "[layout_budget]") {
  auto budget =
      LayoutBudget::Create({.per_session = 64 << 20, .total = 64 << 20});
  auto session = OpenOwnProcessSession({.session_id = 7, .layouts = budget});
  std::vector<char> memory(4096);
  const uint64_t region =
      RegisterHostRegion(*session, memory.data(), memory.size());

  std::shared_ptr<TensorLayout> layout = LayoutOf(1000, region);
  const uint64_t bytes = LayoutBytes(*layout);
  // At least its items' encoded size, and the plan's header.
  CHECK(bytes > 1000 * (layout->items[0].ByteSizeLong() + 100));
  absl::StatusOr<uint64_t> id = session->AddLayout(std::move(layout));
  REQUIRE(id.ok());
  CHECK(budget->used() == bytes);
  CHECK(budget->used_by(7) == bytes);

  absl::StatusOr<std::shared_ptr<const TensorLayout>> in_use =
      session->FindLayout(*id);
  REQUIRE(in_use.ok());
  session->MarkClosed();
  CHECK(budget->used() == bytes);  // a save still holds it
  in_use->reset();
  CHECK(budget->used() == 0);
  CHECK(absl::IsFailedPrecondition(
      session->AddLayout(LayoutOf(1, region)).status()));
  CHECK(budget->used() == 0);
}

TEST_CASE("a layout past a session's budget is refused and charges nothing",
          "[layout_budget]") {
  auto budget =
      LayoutBudget::Create({.per_session = 1 << 20, .total = 64 << 20});
  auto session = OpenOwnProcessSession({.session_id = 8, .layouts = budget});
  std::vector<char> memory(4096);
  const uint64_t region =
      RegisterHostRegion(*session, memory.data(), memory.size());
  REQUIRE(session->AddLayout(LayoutOf(1000, region)).ok());  // ~0.7 MB
  const uint64_t used = budget->used();
  const absl::StatusOr<uint64_t> second =
      session->AddLayout(LayoutOf(1000, region));
  CHECK(absl::IsResourceExhausted(second.status()));
  CHECK(absl::StrContains(second.status().message(),
                          "--layout_bytes_per_session"));
  CHECK(budget->used() == used);
  CHECK(absl::IsResourceExhausted(session->ReserveLayout(1 << 20).status()));
  CHECK(budget->used() == used);
  {
    absl::StatusOr<LayoutBudget::Charge> small = session->ReserveLayout(1024);
    CHECK(small.ok());
    CHECK(budget->used() == used + 1024);
  }
  CHECK(budget->used() == used);
}

TEST_CASE(
    "a charge resized down gives the difference back, and resized up takes "
    "it only if it fits",
    "[layout_budget]") {
  auto budget = LayoutBudget::Create({.per_session = 100, .total = 150});
  absl::StatusOr<LayoutBudget::Charge> charge = budget->Reserve(1, 90);
  REQUIRE(charge.ok());
  REQUIRE(charge->Resize(40).ok());
  CHECK(charge->bytes() == 40);
  CHECK(budget->used_by(1) == 40);
  const absl::Status too_much = charge->Resize(101);
  CHECK(absl::IsResourceExhausted(too_much));
  CHECK(absl::StrContains(too_much.message(), "--layout_bytes_per_session 100"));
  CHECK(charge->bytes() == 40);
  CHECK(budget->used() == 40);
  REQUIRE(charge->Resize(100).ok());
  CHECK(budget->used() == 100);
  CHECK(!LayoutBudget::Charge().Resize(1).ok());
}

TEST_CASE(
    "a layout added with the bound reserved for it is charged its real size, and "
    "reservations of builds in flight count against the budget",
    "[layout_budget]") {
  auto budget =
      LayoutBudget::Create({.per_session = 4 << 20, .total = 5 << 20});
  auto a = OpenOwnProcessSession({.session_id = 9, .layouts = budget});
  auto b = OpenOwnProcessSession({.session_id = 10, .layouts = budget});
  std::vector<char> memory(4096);
  const uint64_t region = RegisterHostRegion(*a, memory.data(), memory.size());

  // A build in flight in session a holds 3 MiB of the daemon's 5: b cannot
  // reserve 3 MiB more until it is done.
  absl::StatusOr<LayoutBudget::Charge> in_flight = a->ReserveLayout(3 << 20);
  REQUIRE(in_flight.ok());
  const absl::StatusOr<LayoutBudget::Charge> refused = b->ReserveLayout(3 << 20);
  CHECK(absl::IsResourceExhausted(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), "--layout_bytes_total"));

  std::shared_ptr<TensorLayout> layout = LayoutOf(1000, region);
  const uint64_t bytes = LayoutBytes(*layout);
  REQUIRE(bytes < (3u << 20));
  REQUIRE(a->AddLayout(std::move(layout), *std::move(in_flight)).ok());
  CHECK(budget->used() == bytes);
  CHECK(b->ReserveLayout(3 << 20).ok());
}

}  // namespace ckpt

#include "session/layout_bytes.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "save/save_plan.h"
#include "session/session.h"
#include "support/own_process_session.h"

namespace ckpt {
namespace {

using ::ckpt::testing::OpenOwnProcessSession;
using ::ckpt::testing::RegisterHostRegion;

using Items = google::protobuf::RepeatedPtrField<v1::TensorItem>;

// A float box `local` at `offsets` of a tensor `global`, its memory at the
// start of `region`.
v1::TensorItem Box(const std::string& fqn, const std::vector<uint64_t>& global,
                   const std::vector<uint64_t>& offsets,
                   const std::vector<uint64_t>& local, uint64_t region,
                   const std::vector<uint32_t>& replicas = {}) {
  v1::TensorItem item;
  item.set_fqn(fqn);
  item.set_dtype(v1::DTYPE_F32);
  uint64_t numel = 1;
  for (size_t d = 0; d < global.size(); ++d) {
    item.add_global_shape(global[d]);
    item.add_offsets(offsets[d]);
    item.add_local_shape(local[d]);
    numel *= local[d];
  }
  for (uint32_t r : replicas) item.add_replica_ranks(r);
  item.mutable_memory()->set_region_id(region);
  item.mutable_memory()->set_offset(0);
  item.mutable_memory()->set_length(4 * numel);
  return item;
}

struct Case {
  std::string name;
  uint32_t world_size;
  // The items of `rank`, in a region of 64 KiB.
  std::function<Items(uint32_t rank, uint64_t region)> items;
};

std::vector<Case> Cases() {
  return {
      {"plain matrices", 1,
       [](uint32_t, uint64_t region) {
         Items items;
         for (int i = 0; i < 3000; ++i) {
           *items.Add() = Box(absl::StrCat("model.layers.", i, ".mlp.weight"),
                              {1024, 1024}, {0, 0}, {4, 1024}, region);
         }
         return items;
       }},
      {"scalars and vectors with short names", 1,
       [](uint32_t, uint64_t region) {
         Items items;
         for (int i = 0; i < 2000; ++i) {
           *items.Add() = i % 2 == 0 ? Box(absl::StrCat("s", i), {}, {}, {}, region)
                                     : Box(absl::StrCat("v", i), {7}, {0}, {7}, region);
         }
         return items;
       }},
      {"long names, many dimensions, 20-digit sizes and offsets", 1,
       [](uint32_t, uint64_t region) {
         Items items;
         const uint64_t huge = 1ull << 63;
         for (int i = 0; i < 500; ++i) {
           *items.Add() = Box(absl::StrCat(std::string(1000, 'x'), i),
                              {huge, huge, huge, 1, 1, 1, 1, 2},
                              {huge - 1, huge - 2, huge - 3, 0, 0, 0, 0, 0},
                              {1, 1, 1, 1, 1, 1, 1, 2}, region);
         }
         return items;
       }},
      {"every item its own replica set (one file each)", 64,
       [](uint32_t rank, uint64_t region) {
         Items items;
         for (uint32_t i = 0; i < 1000; ++i) {
           const uint32_t other = (rank + 1 + i % 63) % 64;
           *items.Add() = Box(absl::StrCat("p", i), {16}, {0}, {16}, region,
                              {std::min(rank, other), std::max(rank, other)});
         }
         return items;
       }},
      {"runs of a shared set, some foreign, alternating with own items", 8,
       [](uint32_t rank, uint64_t region) {
         Items items;
         for (int i = 0; i < 3000; ++i) {
           if (i % 7 == 0) {
             *items.Add() = Box(absl::StrCat("own.", i), {8, 8}, {0, 0}, {8, 8}, region);
           } else {
             *items.Add() = Box(absl::StrCat("shared.", i), {8, 8}, {0, 0}, {8, 8},
                                region, {0, 1, 2, 3, 4, 5, 6, 7});
           }
         }
         (void)rank;
         return items;
       }},
      {"items that carry unknown fields", 1,
       [](uint32_t, uint64_t region) {
         Items items;
         for (int i = 0; i < 1000; ++i) {
           v1::TensorItem item = Box(absl::StrCat("u.", i), {4}, {0}, {4}, region);
           // Fields 90 and 91, which TensorItem does not have: a varint and
           // 300 bytes, appended on the wire as a newer client might.
           std::string wire = item.SerializeAsString();
           wire += std::string("\xd0\x05\x01", 3);  // field 90, varint 1
           wire += std::string("\xda\x05\xac\x02", 4) + std::string(300, 'z');
           REQUIRE(items.Add()->ParseFromString(wire));
         }
         return items;
       }},
  };
}

}  // namespace

TEST_CASE(
    "LayoutBytesBound is at least what the built layout is charged, for "
    "varied requests and ranks, and not far above it for plain ones",
    "[layout_budget]") {
  std::vector<char> memory(64 << 10);
  uint64_t next_id = 100;
  for (const Case& c : Cases()) {
    for (uint32_t rank : {0u, 1u}) {
      if (rank >= c.world_size) continue;
      auto session = OpenOwnProcessSession(
          {.session_id = next_id++, .rank = rank, .world_size = c.world_size,
           .local_world_size = c.world_size});
      const uint64_t region =
          RegisterHostRegion(*session, memory.data(), memory.size());
      const Items items = c.items(rank, region);
      auto layout = PlanTensorLayout(*session, items, 1 << 20);
      INFO(c.name << ", rank " << rank << ": " << layout.status());
      REQUIRE(layout.ok());
      const uint64_t bytes = LayoutBytes(**layout);
      const uint64_t bound = LayoutBytesBound(items);
      INFO("charged " << bytes << ", bound " << bound);
      CHECK(bound >= bytes);
      if (c.name == "plain matrices") {
        // The budget refuses no more than a third sooner than the charge
        // would have.
        CHECK(bound < bytes + bytes / 3);
      }
    }
  }
}

TEST_CASE("LayoutBytesBound of no items is the empty layout's size",
          "[layout_budget]") {
  CHECK(LayoutBytesBound(Items()) >= sizeof(TensorLayout));
  CHECK(LayoutBytes(TensorLayout()) == sizeof(TensorLayout));
}

}  // namespace ckpt

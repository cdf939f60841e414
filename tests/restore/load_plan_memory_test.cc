// The load-plan budget (--load_plan_bytes, restore/load_plan_budget.h) is
// true: what planning and merging a load's plan hold on the heap at their
// peak stays within what they reserved.
//
// Its own binary: it replaces the global operator new/delete to count the
// bytes allocated while a test measures, which the shared unit binary
// should not carry.
#include <catch2/catch.hpp>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/manifest_check.h"
#include "restore/load_plan.h"
#include "restore/load_plan_budget.h"
#include "support/column_manifest.h"
#include "support/own_process_session.h"
#include "support/skip.h"

// AddressSanitizer brings its own operator new and delete, which the
// replacements below would mix with (a block from one freed by the other);
// and the heap it measures would be its own. Under it these tests skip.
#if defined(__SANITIZE_ADDRESS__)
#define CKPT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPT_UNDER_ASAN 1
#endif
#endif

namespace {

// Every block carries a header saying whether it was allocated while a
// measurement ran (on any thread) and its size, so that frees of blocks
// from before the measurement do not make it look smaller than it was.
// 16 bytes keep malloc's alignment for the caller.
struct alignas(16) BlockHeader {
  uint64_t size;
  uint64_t counted;
};

std::atomic<bool> g_measuring{false};
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

#ifndef CKPT_UNDER_ASAN
void* CountedAlloc(std::size_t size) {
  void* raw = std::malloc(sizeof(BlockHeader) + size);
  if (raw == nullptr) throw std::bad_alloc();
  auto* header = static_cast<BlockHeader*>(raw);
  header->size = size;
  header->counted = g_measuring.load(std::memory_order_relaxed) ? 1 : 0;
  if (header->counted != 0) {
    const int64_t live = g_live.fetch_add(static_cast<int64_t>(size)) +
                         static_cast<int64_t>(size);
    int64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
  }
  return header + 1;
}

void CountedFree(void* p) noexcept {
  if (p == nullptr) return;
  BlockHeader* header = static_cast<BlockHeader*>(p) - 1;
  if (header->counted != 0) g_live.fetch_sub(static_cast<int64_t>(header->size));
  std::free(header);
}
#endif

// The most bytes allocated during `fn` and alive at once.
template <typename Fn>
int64_t PeakHeapBytes(Fn&& fn) {
  g_live = 0;
  g_peak = 0;
  g_measuring = true;
  fn();
  g_measuring = false;
  return g_peak.load();
}

}  // namespace

#ifndef CKPT_UNDER_ASAN
void* operator new(std::size_t size) { return CountedAlloc(size); }
void* operator new[](std::size_t size) { return CountedAlloc(size); }
void operator delete(void* p) noexcept { CountedFree(p); }
void operator delete[](void* p) noexcept { CountedFree(p); }
void operator delete(void* p, std::size_t) noexcept { CountedFree(p); }
void operator delete[](void* p, std::size_t) noexcept { CountedFree(p); }
#endif

namespace ckpt {
namespace {

// What a plan may hold beyond its runs: the request's strings, the set of
// item keys, the response; independent of the number of runs.
constexpr int64_t kPerRequestBytes = 16 << 10;

// Column 1 of every row of "m" (tests/support/column_manifest.h): one run
// per row.
testing::ColumnSliceLoad ColumnOf(Session& session, uint64_t rows, uint8_t* memory) {
  return testing::ColumnSlice(session, rows, 1, 1, memory);
}

TEST_CASE("Planning a load holds at its peak no more heap than it reserved from the "
          "plan budget",
          "[load_plan][plan_memory]") {
#ifdef CKPT_UNDER_ASAN
  CKPT_SKIP("AddressSanitizer owns operator new here: the heap cannot be counted");
#endif
  constexpr uint64_t kRows = 4096;
  std::shared_ptr<Session> session = testing::OpenOwnProcessSession({.session_id = 11});
  static uint8_t memory[kRows];
  const testing::ColumnSliceLoad load = ColumnOf(*session, kRows, memory);
  std::shared_ptr<LoadPlanBudget> budget = LoadPlanBudget::Create(1ull << 30);
  LoadPlanBudget::Reservation plan = budget->Open();
  std::map<int, std::vector<Delivery>> deliveries;
  v1::LoadResponse response;
  absl::Status status;
  const int64_t peak = PeakHeapBytes([&] {
    status = PlanLoadRequest(*session, load.request, load.index, load.by_fqn, &plan,
                             &deliveries, &response);
  });
  INFO(status);
  REQUIRE(status.ok());
  REQUIRE(deliveries[0].size() == kRows);
  CHECK(plan.bytes() == kRows * LoadPlanBudget::kBytesPerRun);
  INFO("peak " << peak << " bytes for " << kRows << " runs, reserved " << plan.bytes());
  CHECK(peak <= static_cast<int64_t>(plan.bytes()) + kPerRequestBytes);
  // What stays after planning is the plan itself, with no slack.
  CHECK(deliveries[0].capacity() == kRows);
}

TEST_CASE("Merging a round's plans holds at its peak no more heap than the plans "
          "reserved, even when they all read one chunk",
          "[load_plan][plan_memory]") {
#ifdef CKPT_UNDER_ASAN
  CKPT_SKIP("AddressSanitizer owns operator new here: the heap cannot be counted");
#endif
  constexpr size_t kShared = 4096, kOwn = 1000;
  // What PlanLoadRequest hands back: exact lists. Two loads read chunk 0,
  // the first one also chunk 1.
  int64_t reserved = 0;
  std::map<int, std::vector<Delivery>> merged;
  const int64_t peak = PeakHeapBytes([&] {
    std::vector<std::map<int, std::vector<Delivery>>> plans(2);
    plans[0][0].resize(kShared);
    plans[0][1].resize(kOwn);
    plans[1][0].resize(kShared);
    reserved = static_cast<int64_t>((2 * kShared + kOwn) * LoadPlanBudget::kBytesPerRun);
    merged = MergeLoadPlans(&plans);
  });
  REQUIRE(merged[0].size() == 2 * kShared);
  REQUIRE(merged[1].size() == kOwn);
  INFO("peak " << peak << " bytes, reserved " << reserved);
  CHECK(peak <= reserved + kPerRequestBytes);
  CHECK(merged[0].capacity() == 2 * kShared);
}

}  // namespace
}  // namespace ckpt

// The load-plan budget against a narrow slice of a huge registered region:
// one column of a [2^32, 2] tensor into a 4 GiB region the trainer
// registered (mapped, never touched), under the daemon's default
// --load_plan_bytes. A column is one copy run per row, four billion runs,
// 256 GiB of plan; the request that asks for it is a few hundred bytes.
// The runs are counted, not made, and the load is refused before the plan
// holds anything; the same rows asked for whole are one run. (The 4,096-row
// case against a small budget is tests/restore/load_plan_test.cc; the
// heap at the peak, tests/restore/load_plan_memory_test.cc.)
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/daemon_options.h"
#include "restore/load_plan.h"
#include "restore/load_plan_budget.h"
#include "support/column_manifest.h"
#include "support/own_process_session.h"
#include "support/skip.h"

namespace ckpt {
namespace {

// An anonymous mapping that reserves no memory: pages come only if
// touched, and the planner never touches them.
class SparseRegion {
 public:
  explicit SparseRegion(uint64_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) data_ = static_cast<uint8_t*>(p);
  }
  ~SparseRegion() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  SparseRegion(const SparseRegion&) = delete;
  SparseRegion& operator=(const SparseRegion&) = delete;
  uint8_t* data() const { return data_; }

 private:
  const uint64_t bytes_;
  uint8_t* data_ = nullptr;
};

TEST_CASE(
    "One column of a [2^32, 2] tensor into a 4 GiB registered region is "
    "refused by the default plan budget before any run is made, and the "
    "whole rows plan as one run",
    "[load_plan][hostile]") {
  constexpr uint64_t kRows = uint64_t{1} << 32;
  SparseRegion region(2 * kRows);
  if (region.data() == nullptr) CKPT_SKIP("cannot map 8 GiB of address space here");
  std::shared_ptr<Session> session = testing::OpenOwnProcessSession({.session_id = 9});
  const uint64_t default_budget = DaemonOptions{}.load_plan_bytes;
  std::shared_ptr<LoadPlanBudget> budget = LoadPlanBudget::Create(default_budget);
  {
    testing::ColumnSliceLoad column = testing::ColumnSlice(*session, kRows, 1, 1, region.data());
    INFO("request of " << column.request.ByteSizeLong() << " bytes");
    CHECK(column.request.ByteSizeLong() < 512);
    std::map<int, std::vector<Delivery>> deliveries;
    v1::LoadResponse response;
    LoadPlanBudget::Reservation plan = budget->Open();
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status status = PlanLoadRequest(*session, column.request, column.index,
                                                column.by_fqn, &plan, &deliveries, &response);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(status << " in " << seconds << " s");
    CHECK(status.code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(status.message()), Catch::Contains("needs 4294967296 more copy runs"));
    CHECK_THAT(std::string(status.message()), Catch::Contains("--load_plan_bytes"));
    CHECK(deliveries.empty());
    CHECK(plan.bytes() == 0);
    // Counted, not made: four billion runs made one by one take minutes.
    CHECK(seconds < 1.0);
  }
  CHECK(budget->used_bytes() == 0);
  // The most a column may take under the default budget: as many rows as
  // it has runs' worth of bytes (2^24 rows at 64 bytes a run: 1 GiB).
  CHECK(default_budget / LoadPlanBudget::kBytesPerRun == uint64_t{1} << 24);

  // Both columns of every row are contiguous in the stored chunk and in
  // the region: one run, within any budget.
  testing::ColumnSliceLoad rows = testing::ColumnSlice(*session, kRows, 0, 2, region.data());
  std::map<int, std::vector<Delivery>> deliveries;
  v1::LoadResponse response;
  LoadPlanBudget::Reservation plan = budget->Open();
  const absl::Status status = PlanLoadRequest(*session, rows.request, rows.index, rows.by_fqn,
                                              &plan, &deliveries, &response);
  INFO(status);
  REQUIRE(status.ok());
  REQUIRE(deliveries[0].size() == 1);
  CHECK(deliveries[0][0].end - deliveries[0][0].begin == 2 * kRows);
  CHECK(budget->used_bytes() == LoadPlanBudget::kBytesPerRun);
}

}  // namespace
}  // namespace ckpt

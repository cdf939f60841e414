// Tests of PlanLoadRequest against hostile indexes: a load that reports
// success fills every byte of each requested item exactly once.
#include "restore/load_plan.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/manifest_check.h"
#include "support/column_manifest.h"
#include "support/own_process_session.h"

namespace ckpt {
namespace {

// An index of "w" (F32 [8]) stored as chunks at `rows`, 4 elements each,
// back to back in one file.
v1::Manifest IndexOf(const std::vector<uint64_t>& rows) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job("job");
  m.set_checkpoint("step-1");
  m.set_nodes(1);
  m.set_world_size(1);
  m.set_checksum_block_bytes(16);
  m.add_replica_sets()->add_ranks(0);
  v1::DataFile* f = m.add_files();
  f->set_name("shard-00001-model-00001-of-00001.safetensors");
  f->set_data_start(4096);
  f->set_size(4096 + 16 * rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    v1::StoredTensor* t = m.add_tensors();
    t->set_fqn("w");
    t->set_dtype(v1::DTYPE_F32);
    t->add_global_shape(8);
    t->add_offsets(rows[i]);
    t->add_local_shape(4);
    t->set_file_offset(4096 + 16 * i);
    t->set_length(16);
    t->add_block_xxh3(0);
  }
  return m;
}

absl::Status Plan(const v1::Manifest& index, std::map<int, std::vector<Delivery>>* out) {
  REQUIRE(ValidateManifest(index, "COMMIT").ok());
  std::shared_ptr<Session> session = testing::OpenOwnProcessSession({});
  static char memory[32];
  const uint64_t region = testing::RegisterHostRegion(*session, memory, sizeof(memory));
  v1::LoadRequest request;
  request.set_job("job");
  request.set_checkpoint("step-1");
  v1::TensorItem* item = request.add_tensors();
  item->set_fqn("w");
  item->set_dtype(v1::DTYPE_F32);
  item->add_global_shape(8);
  item->add_offsets(0);
  item->add_local_shape(8);
  item->mutable_memory()->set_region_id(region);
  item->mutable_memory()->set_length(32);
  std::map<std::string, std::vector<int>> by_fqn;
  for (int t = 0; t < index.tensors_size(); ++t) by_fqn[index.tensors(t).fqn()].push_back(t);
  v1::LoadResponse response;
  LoadPlanBudget::Reservation plan = LoadPlanBudget::Create(1 << 20)->Open();
  return PlanLoadRequest(*session, request, index, by_fqn, &plan, out, &response);
}

using testing::ColumnSlice;

TEST_CASE("A load whose narrow slice needs more copy runs than the plan budget fails "
          "before the runs are made, and gives the budget back",
          "[load_plan][hostile]") {
  constexpr uint64_t kRows = 4096;
  std::shared_ptr<Session> session = testing::OpenOwnProcessSession({.session_id = 7});
  static uint8_t memory[2 * kRows];
  // Room for 1,000 runs: column 1 of 4,096 rows is a run per row.
  std::shared_ptr<LoadPlanBudget> budget =
      LoadPlanBudget::Create(1000 * LoadPlanBudget::kBytesPerRun);
  {
    testing::ColumnSliceLoad narrow = ColumnSlice(*session, kRows, 1, 1, memory);
    std::map<int, std::vector<Delivery>> deliveries;
    v1::LoadResponse response;
    LoadPlanBudget::Reservation plan = budget->Open();
    const absl::Status status = PlanLoadRequest(*session, narrow.request, narrow.index,
                                                narrow.by_fqn, &plan, &deliveries, &response);
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(status.message()), Catch::Contains("item m"));
    CHECK_THAT(std::string(status.message()), Catch::Contains("--load_plan_bytes"));
    CHECK(deliveries.empty());
    CHECK(plan.bytes() == 0);
  }
  CHECK(budget->used_bytes() == 0);
  // Whole rows are one run: the same tensor plans within the budget, holds
  // its run while the reservation lives, and gives it back after.
  testing::ColumnSliceLoad whole = ColumnSlice(*session, kRows, 0, 2, memory);
  std::map<int, std::vector<Delivery>> deliveries;
  v1::LoadResponse response;
  {
    LoadPlanBudget::Reservation plan = budget->Open();
    const absl::Status status = PlanLoadRequest(*session, whole.request, whole.index,
                                                whole.by_fqn, &plan, &deliveries, &response);
    INFO(status);
    CHECK(status.ok());
    CHECK(deliveries[0].size() == 1);
    CHECK(budget->used_bytes() == LoadPlanBudget::kBytesPerRun);
  }
  CHECK(budget->used_bytes() == 0);
}

TEST_CASE("PlanLoadRequest plans a tensor whose chunks tile it", "[load_plan]") {
  std::map<int, std::vector<Delivery>> deliveries;
  const absl::Status status = Plan(IndexOf({0, 4}), &deliveries);
  INFO(status);
  CHECK(status.ok());
  CHECK(deliveries.size() == 2);
}

TEST_CASE("PlanLoadRequest refuses stored chunks that overlap and leave a hole, "
          "though their element counts add up",
          "[load_plan][hostile]") {
  // Rows [0, 4) and [2, 6): 8 elements of the 8 requested, yet [6, 8) has
  // no chunk and [2, 4) two. Before, the load delivered [2, 4) twice and
  // left [6, 8) as it was, and reported success.
  std::map<int, std::vector<Delivery>> deliveries;
  const absl::Status status = Plan(IndexOf({0, 2}), &deliveries);
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(status.message()), Catch::Contains("overlap"));
}

}  // namespace
}  // namespace ckpt

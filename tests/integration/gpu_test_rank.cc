#include "integration/gpu_test_rank.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "bench/pattern.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

uint64_t Seed(int allocation, uint32_t step) {
  return PatternSeed(static_cast<uint32_t>(allocation), step);
}

}  // namespace

GpuTestRank::GpuTestRank(TestGpu* gpu, const std::string& socket,
                         const std::string& job, int allocations,
                         int tensors_per_allocation, uint64_t tensor_bytes)
    : gpu_(gpu), job_(job), per_(tensors_per_allocation), tensor_bytes_(tensor_bytes) {
  REQUIRE(tensor_bytes % 4096 == 0);
  // On the real device the client makes its own CudaTrainerGpu, as a
  // trainer's does.
  auto client = Client::Connect(
      {.socket = socket, .job = job, .rank = 0, .world_size = 1,
       .gpu = gpu->kind() == "cuda" ? nullptr : gpu->trainer()});
  REQUIRE(client.ok());
  client_ = *std::move(client);
  for (int a = 0; a < allocations; ++a) {
    auto address = gpu_->Allocate(allocation_bytes());
    REQUIRE(address.ok());
    addresses_.push_back(*address);
    regions_.push_back(0);
    Register(a);
  }
  DefineLayout();
}

GpuTestRank::~GpuTestRank() {
  (void)gpu_->Synchronize(absl::Minutes(1));
  client_.reset();  // ends the session: the daemon releases the regions
  for (uint64_t address : addresses_) (void)gpu_->Free(address);
}

void GpuTestRank::Register(int a) {
  auto region = client_->RegisterGpuRegion(addresses_[a], allocation_bytes());
  INFO(region.status().ToString());
  REQUIRE(region.ok());
  regions_[a] = *region;
}

void GpuTestRank::AddHostTensor(uint64_t bytes, bool snapshot) {
  REQUIRE(host_tensor_.empty());
  host_tensor_.assign(bytes, 0);
  auto region = snapshot ? client_->RegisterSnapshotRegion(host_tensor_.data(), bytes)
                         : client_->RegisterRegion(host_tensor_.data(), bytes);
  INFO(region.status().ToString());
  REQUIRE(region.ok());
  host_region_ = *region;
  DefineLayout();
}

void GpuTestRank::DefineLayout() {
  google::protobuf::RepeatedPtrField<v1::TensorItem> items;
  for (size_t a = 0; a < addresses_.size(); ++a) {
    for (int i = 0; i < per_; ++i) *items.Add() = Item(static_cast<int>(a), i);
  }
  if (!host_tensor_.empty()) {
    *items.Add() = HostItem();
  }
  auto layout = client_->DefineLayout(items);
  INFO(layout.status().ToString());
  REQUIRE(layout.ok());
  layout_ = *layout;
}

v1::TensorItem GpuTestRank::Item(int a, int index) const {
  return MatrixItem(absl::StrCat("model.block", a, ".layer", index, ".weight"),
                    tensor_bytes_, regions_[a], index * tensor_bytes_);
}

v1::TensorItem GpuTestRank::HostItem() const {
  return MatrixItem("optimizer.host_state", host_tensor_.size(), host_region_, 0);
}

void GpuTestRank::UploadAllocation(int a, uint32_t step) {
  std::vector<uint64_t>& host = uploads_.emplace_back(allocation_bytes() / 8);
  FillPattern(host.data(), host.size(), Seed(a, step));
  REQUIRE(gpu_->Upload(addresses_[a], host.data(), allocation_bytes()).ok());
}

void GpuTestRank::Upload(uint32_t step) {
  for (size_t a = 0; a < addresses_.size(); ++a) UploadAllocation(static_cast<int>(a), step);
}

bool GpuTestRank::Holds(uint32_t step, int allocation) {
  std::vector<uint64_t> host(allocation_bytes() / 8);
  for (size_t a = 0; a < addresses_.size(); ++a) {
    if (allocation >= 0 && static_cast<int>(a) != allocation) continue;
    REQUIRE(gpu_->Download(addresses_[a], host.data(), allocation_bytes()).ok());
    if (FirstPatternMismatch(host.data(), host.size(), Seed(static_cast<int>(a), step)) !=
        host.size()) {
      return false;
    }
  }
  uploads_.clear();  // the stream is idle: every upload has been copied
  return true;
}

void GpuTestRank::Zero() {
  for (uint64_t address : addresses_) {
    REQUIRE(gpu_->Fill(address, 0, allocation_bytes()).ok());
  }
}

void GpuTestRank::Reallocate(int a) {
  REQUIRE(gpu_->Synchronize(absl::Minutes(1)).ok());
  REQUIRE(gpu_->Free(addresses_[a]).ok());
  auto address = gpu_->Allocate(allocation_bytes());
  REQUIRE(address.ok());
  if (*address == addresses_[a]) return;  // the next save notices by itself
  addresses_[a] = *address;
  REQUIRE(client_->ReleaseRegions({regions_[a]}).ok());
  Register(a);
  DefineLayout();
}

v1::SaveRequest GpuTestRank::SaveRequestFor(const std::string& checkpoint) const {
  v1::SaveRequest request;
  request.set_job(job_);
  request.set_checkpoint(checkpoint);
  request.set_layout_id(layout_);
  v1::ByteItem* b = request.add_byte_items();
  b->set_fqn("trainer.state");
  b->set_data(absl::StrCat("state of ", checkpoint));
  return request;
}

v1::LoadRequest GpuTestRank::LoadRequestFor(const std::string& checkpoint) const {
  v1::LoadRequest request;
  request.set_job(job_);
  request.set_checkpoint(checkpoint);
  for (size_t a = 0; a < addresses_.size(); ++a) {
    for (int i = 0; i < per_; ++i) *request.add_tensors() = Item(static_cast<int>(a), i);
  }
  if (!host_tensor_.empty()) {
    *request.add_tensors() = HostItem();
  }
  request.add_byte_items("trainer.state");
  return request;
}

}  // namespace ckpt::testing

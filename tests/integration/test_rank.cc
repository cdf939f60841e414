#include "integration/test_rank.h"

#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::testing {

TestRank::TestRank(const std::string& socket, const std::string& job,
                   uint32_t tensors, uint64_t tensor_bytes, ConnectOptions connect)
    : job_(job), tensors_(tensors), tensor_bytes_(tensor_bytes) {
  REQUIRE(tensor_bytes % 4096 == 0);
  void* mem = mmap(nullptr, tensors * tensor_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  data_ = static_cast<uint64_t*>(mem);
  connect.socket = socket;
  connect.job = job;
  connect.rank = 0;
  connect.world_size = 1;
  auto client = Client::Connect(connect);
  REQUIRE(client.ok());
  client_ = *std::move(client);
  auto region = client_->RegisterRegion(data_, tensors * tensor_bytes);
  REQUIRE(region.ok());
  region_ = *region;
}

TestRank::~TestRank() {
  client_.reset();
  munmap(data_, tensors_ * tensor_bytes_);
}

void TestRank::Fill(uint32_t step) {
  FillPattern(data_, tensors_ * tensor_bytes_ / 8, PatternSeed(0, step));
}

bool TestRank::Holds(uint32_t step) const {
  const size_t words = tensors_ * tensor_bytes_ / 8;
  return FirstPatternMismatch(data_, words, PatternSeed(0, step)) == words;
}

void TestRank::Zero() { std::memset(data_, 0, tensors_ * tensor_bytes_); }

std::string_view TestRank::TensorBytes(uint32_t index) const {
  REQUIRE(index < tensors_);
  return {reinterpret_cast<const char*>(data_) + index * tensor_bytes_, tensor_bytes_};
}

v1::TensorItem MatrixItem(const std::string& fqn, uint64_t bytes, uint64_t region,
                          uint64_t offset) {
  v1::TensorItem item;
  item.set_fqn(fqn);
  item.set_dtype(v1::DTYPE_F32);
  item.add_global_shape(bytes / 4096);
  item.add_global_shape(1024);
  item.add_offsets(0);
  item.add_offsets(0);
  item.add_local_shape(bytes / 4096);
  item.add_local_shape(1024);
  item.mutable_memory()->set_region_id(region);
  item.mutable_memory()->set_offset(offset);
  item.mutable_memory()->set_length(bytes);
  return item;
}

v1::TensorItem TestRank::Item(uint32_t index) const {
  return MatrixItem(absl::StrCat("model.layers.", index, ".weight"), tensor_bytes_,
                    region_, index * tensor_bytes_);
}

void TestRank::AddItems(
    google::protobuf::RepeatedPtrField<v1::TensorItem>* items) const {
  for (uint32_t i = 0; i < tensors_; ++i) *items->Add() = Item(i);
}

v1::SaveRequest TestRank::SaveRequestFor(const std::string& checkpoint) const {
  v1::SaveRequest request;
  request.set_job(job_);
  request.set_checkpoint(checkpoint);
  AddItems(request.mutable_tensors());
  v1::ByteItem* b = request.add_byte_items();
  b->set_fqn("trainer.state");
  b->set_data(absl::StrCat("state of ", checkpoint));
  return request;
}

v1::LoadRequest TestRank::LoadRequestFor(const std::string& checkpoint) const {
  v1::LoadRequest request;
  request.set_job(job_);
  request.set_checkpoint(checkpoint);
  AddItems(request.mutable_tensors());
  request.add_byte_items("trainer.state");
  return request;
}

}  // namespace ckpt::testing

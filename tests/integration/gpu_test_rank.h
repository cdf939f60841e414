// Test support: this test process as one trainer rank whose tensors live
// in device memory of a TestGpu (simulated or real).
//
// `allocations` device allocations, each holding `tensors_per_allocation`
// float32 tensors of `tensor_bytes` and registered as one GPU region; the
// layout is defined once, as a trainer does. Patterns are uploaded on the
// TestGpu's stream, so they are written when the stream gets there, not
// when the CPU asks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/ckpt_client.h"
#include "integration/test_gpu.h"

namespace ckpt::testing {

class GpuTestRank {
 public:
  GpuTestRank(TestGpu* gpu, const std::string& socket, const std::string& job,
              int allocations, int tensors_per_allocation, uint64_t tensor_bytes);
  ~GpuTestRank();

  Client& client() { return *client_; }
  TestGpu& gpu() { return *gpu_; }
  uint64_t address(int allocation) const { return addresses_[allocation]; }
  uint64_t allocation_bytes() const { return per_ * tensor_bytes_; }

  // Enqueues the pattern of `step` on the stream (every allocation).
  void Upload(uint32_t step);
  // Enqueues the pattern of `step` into one allocation.
  void UploadAllocation(int allocation, uint32_t step);
  // Waits for the stream; true if allocation `a` (every one if -1) holds
  // the pattern of `step`.
  bool Holds(uint32_t step, int allocation = -1);
  // Enqueues zeros over every allocation.
  void Zero();
  // Adds one float32 tensor of `bytes` in host memory of this process to
  // the layout (defined again): in the trainer's own memory, or in a
  // snapshot region (Client::RegisterSnapshotRegion) when `snapshot`.
  // Later saves and loads include it; host_tensor() is its memory.
  void AddHostTensor(uint64_t bytes, bool snapshot);
  std::vector<uint8_t>& host_tensor() { return host_tensor_; }

  // Frees allocation `a` and allocates it again without telling the daemon
  // (a save must notice); if the new memory landed elsewhere, re-registers
  // it and defines the layout again, as a trainer whose tensors moved would.
  void Reallocate(int allocation);

  v1::SaveRequest SaveRequestFor(const std::string& checkpoint) const;
  v1::LoadRequest LoadRequestFor(const std::string& checkpoint) const;

 private:
  void Register(int allocation);
  void DefineLayout();
  v1::TensorItem Item(int allocation, int index) const;
  v1::TensorItem HostItem() const;  // AddHostTensor's

  TestGpu* const gpu_;
  const std::string job_;
  const int per_;
  const uint64_t tensor_bytes_;
  std::unique_ptr<Client> client_;
  std::vector<uint64_t> addresses_;
  std::vector<uint64_t> regions_;
  uint64_t layout_ = 0;
  std::vector<uint8_t> host_tensor_;  // empty without AddHostTensor
  uint64_t host_region_ = 0;
  // Host copies of uploaded patterns, alive until the stream has copied them.
  std::vector<std::vector<uint64_t>> uploads_;
};

}  // namespace ckpt::testing

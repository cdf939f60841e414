// Test support: this test process acting as one trainer rank of a job, with
// a buffer of pattern-filled float32 tensors registered with the daemon.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/pattern.h"
#include "client/ckpt_client.h"

namespace ckpt::testing {

// A whole float32 tensor of `bytes` (a multiple of 4096), shaped
// [bytes / 4096, 1024], at `offset` in region `region`.
v1::TensorItem MatrixItem(const std::string& fqn, uint64_t bytes, uint64_t region,
                          uint64_t offset);

class TestRank {
 public:
  // Connects as rank 0 of a world of 1 and registers `tensors` tensors of
  // `tensor_bytes` each (a multiple of 4096). `connect` gives the other
  // options (its socket, job, rank and world size are set here).
  TestRank(const std::string& socket, const std::string& job, uint32_t tensors,
           uint64_t tensor_bytes, ConnectOptions connect = {});
  ~TestRank();

  Client& client() { return *client_; }
  // Fills the buffer with the pattern of `step`.
  void Fill(uint32_t step);
  // True if the buffer holds the pattern of `step`.
  bool Holds(uint32_t step) const;
  void Zero();
  // The bytes of tensor `index` (of the buffer's `tensors`) as they are now.
  std::string_view TensorBytes(uint32_t index) const;

  // The items of the whole buffer, for Save or Load requests.
  void AddItems(google::protobuf::RepeatedPtrField<v1::TensorItem>* items) const;
  v1::TensorItem Item(uint32_t index) const;

  v1::SaveRequest SaveRequestFor(const std::string& checkpoint) const;
  v1::LoadRequest LoadRequestFor(const std::string& checkpoint) const;

 private:
  std::string job_;
  uint32_t tensors_;
  uint64_t tensor_bytes_;
  uint64_t* data_ = nullptr;
  uint64_t region_ = 0;
  std::unique_ptr<Client> client_;
};

}  // namespace ckpt::testing

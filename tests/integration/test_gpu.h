// Test support: the trainer's GPU in integration tests.
//
// The GPU-path tests run once on the simulated device (gpu/, everywhere)
// and once on the real one (where CUDA and a device exist; skipped visibly
// elsewhere). TestGpu is what they need of either: device memory, a stream
// whose work runs later than the CPU enqueues it, and the TrainerGpu that
// libckpt uses.
//
// Thread-safety: one test thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/trainer_gpu.h"

namespace ckpt::testing {

class TestGpu {
 public:
  virtual ~TestGpu() = default;
  // The daemon's --gpu for this kind: "simulated" or "cuda".
  virtual std::string kind() const = 0;
  virtual TrainerGpu* trainer() = 0;
  virtual GpuStreamHandle stream() = 0;
  // Device memory (zeroed); its address.
  virtual absl::StatusOr<uint64_t> Allocate(uint64_t bytes) = 0;
  virtual absl::Status Free(uint64_t address) = 0;
  // Work enqueued on stream(): keeps it busy for `delay`; copies `bytes` of
  // `data` (kept alive by the caller until Synchronize) to `address`; sets
  // `bytes` at `address` to `value`.
  virtual absl::Status Delay(absl::Duration delay) = 0;
  virtual absl::Status Upload(uint64_t address, const void* data, uint64_t bytes) = 0;
  virtual absl::Status Fill(uint64_t address, uint8_t value, uint64_t bytes) = 0;
  // Waits for the stream, then copies device bytes out.
  virtual absl::Status Download(uint64_t address, void* data, uint64_t bytes) = 0;
  // Waits for the stream, at most `timeout`: DeadlineExceeded after.
  virtual absl::Status Synchronize(absl::Duration timeout) = 0;
};

// The simulated device; never null.
std::unique_ptr<TestGpu> MakeSimulatedTestGpu();
// The real device: FailedPrecondition where ckptd was built without CUDA
// or no device is usable.
absl::StatusOr<std::unique_ptr<TestGpu>> MakeCudaTestGpu();
// The kinds to run on here: always "simulated", and "cuda" where usable.
std::vector<std::string> AvailableGpuKinds();
absl::StatusOr<std::unique_ptr<TestGpu>> MakeTestGpu(const std::string& kind);

}  // namespace ckpt::testing

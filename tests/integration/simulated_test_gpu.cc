// TestGpu on the simulated device, and the choice of kinds.
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu/simulated_trainer_gpu.h"
#include "integration/test_gpu.h"

namespace ckpt::testing {
namespace {

class SimulatedTestGpu final : public TestGpu {
 public:
  std::string kind() const override { return "simulated"; }
  TrainerGpu* trainer() override { return &gpu_; }
  GpuStreamHandle stream() override { return &stream_; }
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes) override {
    return gpu_.Allocate(bytes);
  }
  absl::Status Free(uint64_t address) override { return gpu_.Free(address); }
  absl::Status Delay(absl::Duration delay) override {
    stream_.Enqueue([delay] { absl::SleepFor(delay); });
    return absl::OkStatus();
  }
  absl::Status Upload(uint64_t address, const void* data, uint64_t bytes) override {
    stream_.Enqueue([=] { std::memcpy(reinterpret_cast<void*>(address), data, bytes); });
    return absl::OkStatus();
  }
  absl::Status Fill(uint64_t address, uint8_t value, uint64_t bytes) override {
    stream_.Enqueue([=] { std::memset(reinterpret_cast<void*>(address), value, bytes); });
    return absl::OkStatus();
  }
  absl::Status Download(uint64_t address, void* data, uint64_t bytes) override {
    RETURN_IF_ERROR(Synchronize(absl::Minutes(1)));
    std::memcpy(data, reinterpret_cast<const void*>(address), bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize(absl::Duration timeout) override {
    auto done = std::make_shared<std::atomic<bool>>(false);
    stream_.Enqueue([done] { done->store(true); });
    const absl::Time deadline = absl::Now() + timeout;
    while (!done->load()) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("simulated stream did not finish");
      }
      absl::SleepFor(absl::Microseconds(200));
    }
    return absl::OkStatus();
  }

 private:
  SimulatedTrainerGpu gpu_;
  SimulatedStream stream_;
};

}  // namespace

std::unique_ptr<TestGpu> MakeSimulatedTestGpu() {
  return std::make_unique<SimulatedTestGpu>();
}

#ifndef CKPT_HAVE_CUDA
absl::StatusOr<std::unique_ptr<TestGpu>> MakeCudaTestGpu() {
  return absl::FailedPreconditionError("built without CUDA (CKPT_WITH_CUDA)");
}
#endif

std::vector<std::string> AvailableGpuKinds() {
  std::vector<std::string> kinds = {"simulated"};
  if (MakeCudaTestGpu().ok()) kinds.push_back("cuda");
  return kinds;
}

absl::StatusOr<std::unique_ptr<TestGpu>> MakeTestGpu(const std::string& kind) {
  if (kind == "simulated") return MakeSimulatedTestGpu();
  if (kind == "cuda") return MakeCudaTestGpu();
  return absl::InvalidArgumentError(absl::StrCat("unknown GPU kind ", kind));
}

}  // namespace ckpt::testing

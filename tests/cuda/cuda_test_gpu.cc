// TestGpu on the real device through the CUDA runtime (built with CUDA).
#include <cuda_runtime_api.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "cuda/cuda_trainer_gpu.h"
#include "integration/test_gpu.h"

namespace ckpt::testing {
namespace {

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e)));
}

void CUDART_CB SleepOnStream(void* micros) {
  std::this_thread::sleep_for(
      std::chrono::microseconds(reinterpret_cast<uintptr_t>(micros)));
}

class CudaTestGpu final : public TestGpu {
 public:
  static absl::StatusOr<std::unique_ptr<TestGpu>> Create() {
    int count = 0;
    RETURN_IF_ERROR(Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
    if (count == 0) return absl::FailedPreconditionError("no CUDA device");
    RETURN_IF_ERROR(Check(cudaSetDevice(0), "cudaSetDevice"));
    ASSIGN_OR_RETURN(std::unique_ptr<CudaTrainerGpu> trainer,
                     CudaTrainerGpu::Create());
    cudaStream_t stream = nullptr;
    RETURN_IF_ERROR(
        Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              "cudaStreamCreate"));
    return std::unique_ptr<TestGpu>(
        new CudaTestGpu(std::move(trainer), stream));
  }
  ~CudaTestGpu() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  std::string kind() const override { return "cuda"; }
  TrainerGpu* trainer() override { return trainer_.get(); }
  GpuStreamHandle stream() override { return stream_; }
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes) override {
    void* p = nullptr;
    RETURN_IF_ERROR(Check(cudaMalloc(&p, bytes), "cudaMalloc"));
    RETURN_IF_ERROR(Check(cudaMemset(p, 0, bytes), "cudaMemset"));
    return reinterpret_cast<uint64_t>(p);
  }
  absl::Status Free(uint64_t address) override {
    RETURN_IF_ERROR(
        Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    return Check(cudaFree(reinterpret_cast<void*>(address)), "cudaFree");
  }
  absl::Status Delay(absl::Duration delay) override {
    const uintptr_t micros = absl::ToInt64Microseconds(delay);
    return Check(cudaLaunchHostFunc(stream_, SleepOnStream,
                                    reinterpret_cast<void*>(micros)),
                 "cudaLaunchHostFunc");
  }
  absl::Status Upload(uint64_t address, const void* data,
                      uint64_t bytes) override {
    return Check(cudaMemcpyAsync(reinterpret_cast<void*>(address), data, bytes,
                                 cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync H2D");
  }
  absl::Status Fill(uint64_t address, uint8_t value, uint64_t bytes) override {
    return Check(cudaMemsetAsync(reinterpret_cast<void*>(address), value, bytes,
                                 stream_),
                 "cudaMemsetAsync");
  }
  absl::Status Download(uint64_t address, void* data, uint64_t bytes) override {
    RETURN_IF_ERROR(Synchronize(absl::Minutes(1)));
    return Check(cudaMemcpy(data, reinterpret_cast<const void*>(address), bytes,
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy D2H");
  }
  absl::Status Synchronize(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return Check(e, "cudaStreamQuery");
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("CUDA stream did not finish");
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  }

 private:
  CudaTestGpu(std::unique_ptr<CudaTrainerGpu> trainer, cudaStream_t stream)
      : trainer_(std::move(trainer)), stream_(stream) {}
  std::unique_ptr<CudaTrainerGpu> trainer_;
  cudaStream_t stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TestGpu>> MakeCudaTestGpu() {
  return CudaTestGpu::Create();
}

}  // namespace ckpt::testing

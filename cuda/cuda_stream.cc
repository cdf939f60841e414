#include "cuda/cuda_stream.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt::cuda_internal {
namespace {

// Fence::Wait polls cudaEventQuery: kFenceSpins queries back to back (a
// copy batch often completes within microseconds of the first query), then
// sleeps that double from 1 us up to kFenceMaxSleep between queries, which
// bounds both the added latency and the CPU spent on a long wait.
constexpr int kFenceSpins = 64;
constexpr absl::Duration kFenceMaxSleep = absl::Microseconds(50);

// Completion of a stream's earlier work: an event recorded on it.
class CudaFence final : public GpuFence {
 public:
  CudaFence(std::shared_ptr<DeviceState> state, int device, cudaEvent_t event)
      : state_(std::move(state)), device_(device), event_(event) {}
  ~CudaFence() override {
    ScopedCudaDevice guard(device_);
    absl::Status status =
        state_->Check(device_, cudaEventDestroy(event_), "cudaEventDestroy");
    if (!status.ok()) LogWarning(status.message());
  }

  absl::StatusOr<bool> Ready() override {
    RETURN_IF_ERROR(state_->CheckDevice(device_));
    cudaError_t error = cudaEventQuery(event_);
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: do not leave it behind
      return false;
    }
    return state_->Check(device_, error, "cudaEventQuery");
  }

  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration sleep = absl::Microseconds(1);
    for (int polls = 0;; ++polls) {
      ASSIGN_OR_RETURN(bool ready, Ready());
      if (ready) return absl::OkStatus();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("work on device ", device_, " not done after ",
                         absl::FormatDuration(timeout)));
      }
      if (polls < kFenceSpins) {
        std::this_thread::yield();
        continue;
      }
      absl::SleepFor(std::min(sleep, deadline - absl::Now()));
      sleep = std::min(2 * sleep, kFenceMaxSleep);
    }
  }

 private:
  const std::shared_ptr<DeviceState> state_;
  const int device_;
  const cudaEvent_t event_;
};

absl::StatusOr<CudaEvent*> AsCudaEvent(GpuEvent& event) {
  auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
  if (cuda_event == nullptr) {
    return absl::InvalidArgumentError(
        "the event was not opened by a CudaDevice");
  }
  return cuda_event;
}

}  // namespace

CudaStream::~CudaStream() {
  ScopedCudaDevice guard(device_);
  absl::Status status =
      state_->Check(device_, cudaStreamDestroy(stream_), "cudaStreamDestroy");
  if (!status.ok()) LogWarning(status.message());
}

CuCheck CudaStream::Checker() const {
  return [state = state_.get(), device = device_](CUresult result,
                                                  absl::string_view what) {
    return state->Check(device, result, what);
  };
}

absl::StatusOr<uint64_t> CudaStream::WaitEvent(GpuEvent& event) {
  ASSIGN_OR_RETURN(CudaEvent * cuda_event, AsCudaEvent(event));
  RETURN_IF_ERROR(state_->CheckDevice(device_));
  ScopedCudaDevice guard(device_);
  RETURN_IF_ERROR(state_->SetDevice(guard, device_));
  // Read once: the number waited for is the one returned, whatever the
  // peer writes to its page afterwards (GpuEvent::CompleteThrough).
  const uint32_t target = cuda_event->page().recorded();
  RETURN_IF_ERROR(cuda_event->page().WaitFor(stream_, device_, Checker(), target));
  return uint64_t{target};
}

absl::StatusOr<CudaEvent*> CudaStream::EventToRecord(GpuEvent& event) {
  ASSIGN_OR_RETURN(CudaEvent * cuda_event, AsCudaEvent(event));
  if (cuda_event->device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot record an event of device ", cuda_event->device(),
                     " on a stream of device ", device_));
  }
  RETURN_IF_ERROR(state_->CheckDevice(device_));
  return cuda_event;
}

absl::Status CudaStream::RecordEvent(GpuEvent& event) {
  ASSIGN_OR_RETURN(CudaEvent * cuda_event, EventToRecord(event));
  ScopedCudaDevice guard(device_);
  RETURN_IF_ERROR(state_->SetDevice(guard, device_));
  return cuda_event->page().Record(stream_, device_, Checker(),
                                   cuda_internal::EventPage::RecordOrder::kAfterPrevious);
}

absl::Status CudaStream::RecordReserved(GpuEvent& event, uint64_t record) {
  ASSIGN_OR_RETURN(CudaEvent * cuda_event, EventToRecord(event));
  ScopedCudaDevice guard(device_);
  RETURN_IF_ERROR(state_->SetDevice(guard, device_));
  return cuda_event->page().RecordReserved(stream_, device_, Checker(),
                                           static_cast<uint32_t>(record));
}

absl::Status CudaStream::CopyToHost(absl::Span<const GpuCopy> copies) {
  return Copy(copies, /*to_host=*/true);
}

absl::Status CudaStream::CopyToDevice(absl::Span<const GpuCopy> copies) {
  return Copy(copies, /*to_host=*/false);
}

absl::StatusOr<std::unique_ptr<GpuFence>> CudaStream::Fence() {
  RETURN_IF_ERROR(state_->CheckDevice(device_));
  ScopedCudaDevice guard(device_);
  RETURN_IF_ERROR(state_->SetDevice(guard, device_));
  cudaEvent_t event = nullptr;
  RETURN_IF_ERROR(state_->Check(
      device_, cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
      "cudaEventCreateWithFlags"));
  auto fence = std::make_unique<CudaFence>(state_, device_, event);
  RETURN_IF_ERROR(state_->Check(device_, cudaEventRecord(event, stream_),
                                "cudaEventRecord (fence)"));
  return fence;
}

absl::Status CudaStream::Copy(absl::Span<const GpuCopy> copies, bool to_host) {
  dsts_.clear();
  srcs_.clear();
  sizes_.clear();
  for (size_t i = 0; i < copies.size(); ++i) {
    const GpuCopy& copy = copies[i];
    if (copy.length == 0) continue;  // the batch call rejects empty copies
    if (copy.host == nullptr || copy.device == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy ", i, " has a null host or device address"));
    }
    void* device = reinterpret_cast<void*>(copy.device);
    dsts_.push_back(to_host ? static_cast<void*>(copy.host) : device);
    srcs_.push_back(to_host ? device : static_cast<const void*>(copy.host));
    sizes_.push_back(copy.length);
  }
  if (sizes_.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(state_->CheckDevice(device_));
  ScopedCudaDevice guard(device_);
  RETURN_IF_ERROR(state_->SetDevice(guard, device_));
  const char* direction = to_host ? "device-to-host" : "host-to-device";

  if (sizes_.size() > 1 && !state_->batch_copies_unsupported()) {
    // The hints matter only for managed or pageable memory; they say where
    // each side is anyway.
    cudaMemLocation on_device = {};
    on_device.type = cudaMemLocationTypeDevice;
    on_device.id = device_;
    cudaMemLocation on_host = {};
    on_host.type = cudaMemLocationTypeHost;
    cudaMemcpyAttributes attributes = {};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attributes.srcLocHint = to_host ? on_device : on_host;
    attributes.dstLocHint = to_host ? on_host : on_device;
    attributes.flags = cudaMemcpyFlagDefault;
    size_t first_copy = 0;  // `attributes` applies from copy 0 on
    cudaError_t error = cudaMemcpyBatchAsync(
        dsts_.data(), srcs_.data(), sizes_.data(), sizes_.size(), &attributes,
        &first_copy, 1, stream_);
    if (error == cudaSuccess) return absl::OkStatus();
    if (error != cudaErrorNotSupported &&
        error != cudaErrorCallRequiresNewerDriver) {
      return state_->Check(
          device_, error,
          absl::StrCat("cudaMemcpyBatchAsync of ", sizes_.size(), " ",
                       direction, " copies"));
    }
    absl::Status unsupported =
        state_->Check(device_, error, "cudaMemcpyBatchAsync");
    if (state_->MarkBatchCopiesUnsupported()) {
      LogWarning(unsupported.message(),
                 "; copying with one cudaMemcpyAsync per copy from now on");
    }
  }
  const cudaMemcpyKind kind =
      to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    RETURN_IF_ERROR(state_->Check(
        device_, cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], kind, stream_),
        absl::StrCat("cudaMemcpyAsync ", direction, " of ", sizes_[i],
                     " bytes")));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::cuda_internal

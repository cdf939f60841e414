// CudaDevice's events and streams.
//
// CudaEvent: a trainer's event page opened in this process (an EventPage,
// cuda_event_page.h, which says how records and waits work); unregistered
// and unmapped with the object, once no stream uses it any more.
//
// CudaStream: a cudaStreamNonBlocking stream of one device. A batch of
// copies is one cudaMemcpyBatchAsync call (srcAccessOrder Stream: the batch
// runs in stream order, after the events the stream waits on), or, where
// the driver reports that call unsupported, one cudaMemcpyAsync per copy
// from then on (logged once). A single copy is a cudaMemcpyAsync. Host
// memory must be registered, and each copy's host side must lie inside one
// registration: across two it is a pageable copy, which the driver may
// make synchronous with the stream. Fence() records a cudaEventDisableTiming
// event; its Wait polls cudaEventQuery (never a blocking sync), spinning
// briefly and then sleeping up to 50 us between polls.
//
// Every call first checks that the device is not broken by a sticky error
// (DeviceState) and makes the device current for its duration.
//
// Thread-safety: a CudaStream is used by one thread at a time (GpuStream's
// rule); events and fences may be used from any thread.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cuda/cuda_device_state.h"
#include "cuda/cuda_event_page.h"
#include "gpu/gpu_device.h"

namespace ckpt::cuda_internal {

class CudaEvent final : public GpuEvent {
 public:
  // `page` is registered on `device`.
  CudaEvent(std::shared_ptr<DeviceState> state, int device, std::unique_ptr<EventPage> page)
      : state_(std::move(state)), device_(device), page_(std::move(page)) {}

  // Only for a trainer that is gone, or records that no longer matter.
  absl::Status CompleteThrough(uint64_t record) override {
    page_->CompleteThrough(static_cast<uint32_t>(record));
    return absl::OkStatus();
  }
  // Record numbers are the page's 32-bit counters (compared cyclically).
  uint64_t ReserveRecord() override { return page_->Reserve(); }
  bool CompleteReserved(uint64_t record) override {
    return CompleteIfDeviceFailed(record) ||
           page_->CompleteReserved(static_cast<uint32_t>(record));
  }
  // The device failed when DeviceState marked it broken (a sticky error
  // seen by any call on it): the context, and every stream of it, is gone.
  bool CompleteIfDeviceFailed(uint64_t record) override {
    const auto target = static_cast<uint32_t>(record);
    if (page_->Reached(target)) return true;
    if (state_->CheckDevice(device_).ok()) return false;
    page_->CompleteThrough(target);
    return true;
  }

  int device() const { return device_; }
  EventPage& page() const { return *page_; }

 private:
  const std::shared_ptr<DeviceState> state_;
  const int device_;
  const std::unique_ptr<EventPage> page_;
};

class CudaStream final : public GpuStream {
 public:
  // Takes ownership of `stream`, a stream of `device`.
  CudaStream(std::shared_ptr<DeviceState> state, int device,
             cudaStream_t stream)
      : state_(std::move(state)), device_(device), stream_(stream) {}
  // Does not wait: the driver frees the stream once its work is done.
  ~CudaStream() override;

  // `event` must come from a CudaDevice (InvalidArgument otherwise); it may
  // belong to another device for WaitEvent, not for RecordEvent. Neither
  // blocks the CPU.
  absl::StatusOr<uint64_t> WaitEvent(GpuEvent& event) override;
  absl::Status RecordEvent(GpuEvent& event) override;
  absl::Status RecordReserved(GpuEvent& event, uint64_t record) override;
  absl::Status CopyToHost(absl::Span<const GpuCopy> copies) override;
  absl::Status CopyToDevice(absl::Span<const GpuCopy> copies) override;
  absl::StatusOr<std::unique_ptr<GpuFence>> Fence() override;

 private:
  absl::Status Copy(absl::Span<const GpuCopy> copies, bool to_host);
  // `event` as one this stream may record: a CUDA event of its device, on
  // a device not broken.
  absl::StatusOr<CudaEvent*> EventToRecord(GpuEvent& event);
  // DeviceState::Check of driver results on this stream's device.
  CuCheck Checker() const;

  const std::shared_ptr<DeviceState> state_;
  const int device_;
  const cudaStream_t stream_;
  // The batch's arrays, kept between calls to spare the allocations.
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace ckpt::cuda_internal

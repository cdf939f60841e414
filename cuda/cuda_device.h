// CudaDevice: the daemon's GpuDevice on real GPUs (CUDA runtime + driver).
//
// Contexts: every call runs in the runtime's primary context of the device
// it names, made current for the call by a ScopedCudaDevice and created on
// first use; the thread's previous device is restored afterwards.
//
// Mapping trainer memory (GpuDevice::Map):
//   - Legacy pieces (cudaMalloc memory, 64 handle bytes, one piece per
//     region) are opened with cudaIpcOpenMemHandle. A handle may be open only
//     once per context, and several regions can share one allocation, so
//     openings are refcounted per (device, handle bytes): the last mapping
//     destroyed closes the handle.
//   - POSIX-FD pieces (virtual-memory allocations, e.g. PyTorch's expandable
//     segments) are imported from the fd taken out of the trainer, mapped
//     whole and back to back into one fresh VA reservation, and made
//     readable and writable for the device. The region must be contiguous
//     across them: pieces after the first start at offset 0, pieces before
//     the last run to their allocation's end.
//   A mapping unmaps (and releases its imports) when destroyed, so the
//   daemon never keeps a trainer's allocation alive past its mapping;
//   the one exception is a device that cannot be made current then: the
//   mapping is leaked (and an error logged) rather than unmapped in
//   another device's context.
//
// Sticky errors: a call that returns one of the errors that leave a context
// unusable (illegal address, launch failure, ECC, ...; IsStickyCudaError)
// marks its device broken. Every later call on that device fails with
// FailedPrecondition ("device N hit a sticky CUDA error (...); its context
// cannot be used again: restart ckptd"); other devices keep working.
//
// Events (GpuDevice::OpenEvent) are pages of host memory shared with the
// trainer, on which streams wait and write with stream memory operations
// (cuda_event_page.h).
//
// Files: cuda_device_state.h (device list, sticky errors, IPC refcounts),
// cuda_stream.h (events, streams, fences), cuda_event_page.h (the event
// protocol), cuda_driver.h (driver entry points, CUDA results as Status,
// the device guard).
//
// Ownership: mappings, events, streams and fences share the device's
// internal state (DeviceState) and may outlive the CudaDevice. Thread-safety:
// as GpuDevice (safe for concurrent use; one thread at a time per GpuStream).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/gpu_device.h"

namespace ckpt {

namespace cuda_internal {
class DeviceState;
}  // namespace cuda_internal

class CudaDevice final : public GpuDevice {
 public:
  // Cheap and never fails for want of a driver: no CUDA call is made until
  // the first method call (FindDevice then reports the missing driver).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create();
  ~CudaDevice() override;

  std::string name() const override { return "cuda"; }
  absl::StatusOr<int> FindDevice(const std::string& uuid) override;
  absl::StatusOr<std::unique_ptr<GpuMapping>> Map(
      int device, absl::Span<const GpuPiece> pieces,
      const PeerFdTaker& take_fd) override;
  // The fd form only: the peer's event page (a one-page memfd sealed
  // against shrinking, else InvalidArgument before any CUDA call), mapped
  // and registered for this device's streams. IPC handle bytes are
  // InvalidArgument: CUDA IPC events are not used (gpu_device.h says why).
  absl::StatusOr<std::unique_ptr<GpuEvent>> OpenEvent(
      int device, const GpuHandleRef& handle,
      const PeerFdTaker& take_fd) override;
  // A cudaStreamNonBlocking stream. Copies of a batch go in one
  // cudaMemcpyBatchAsync call where the driver supports it.
  absl::StatusOr<std::unique_ptr<GpuStream>> CreateStream(int device) override;
  // cudaHostRegister(Portable) chunk by chunk, so every device can DMA.
  absl::Status RegisterHostMemory(char* data, uint64_t length,
                                  uint64_t chunk_bytes) override;
  absl::Status UnregisterHostMemory(char* data, uint64_t length,
                                    uint64_t chunk_bytes) override;

 private:
  explicit CudaDevice(std::shared_ptr<cuda_internal::DeviceState> state);

  const std::shared_ptr<cuda_internal::DeviceState> state_;
};

}  // namespace ckpt

// SimulatedDevice: the GpuDevice (daemon side) that ckptd's tests run on
// where no GPU exists. Its device memory, streams and events are the
// simulated runtime's (simulated_runtime.h); the trainer side is
// SimulatedTrainerGpu.
//
// It keeps CUDA's rules, so that the daemon's code is exercised the same
// way as on a GPU:
//  - Map maps whole allocations back to back in one reserved range; pieces
//    after the first start at offset 0 of their allocation and pieces
//    before the last end at its end (the VMM contiguity rule). Every piece
//    is checked against the memfd it names (CheckSimulatedAllocation): the
//    peer is untrusted input. Legacy IPC handles are Unimplemented.
//  - Streams run their work in order on their own thread (SimulatedStream);
//    copies are memcpy between a mapping and host memory when the stream
//    reaches them.
//  - The host side of a copy must lie inside one registered chunk
//    (FailedPrecondition otherwise: the daemon forgot to register its
//    pool), the device side inside one live mapping (InvalidArgument).
//    Both are checked when the copy is enqueued and again when it runs; a
//    failure when it runs is the stream's sticky error, which every later
//    copy and fence on that stream reports. A whole device can fail as a
//    CUDA context does on a sticky error (FailDevice).
//
// Ownership: mappings, events and streams own their mmaps, fds and
// threads, and share the device's bookkeeping (registered host memory,
// live mappings), so they may outlive the SimulatedDevice.
// Thread-safety: as GpuDevice (SimulatedDevice is safe for concurrent use;
// a stream is used by one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gpu/gpu_device.h"
#include "gpu/simulated_runtime.h"

namespace ckpt {

// Where a fault injected with SimulatedDevice::FailNextCopy strikes.
enum class CopyFault {
  kOnEnqueue,     // CopyToHost/CopyToDevice return the status
  kOnCompletion,  // the copy is enqueued; when the stream reaches it, the
                  // status becomes the stream's sticky error (fences report it)
};

// The device's bookkeeping, shared with its mappings and streams.
struct SimulatedDeviceState;

class SimulatedDevice final : public GpuDevice {
 public:
  explicit SimulatedDevice(int device_count = kSimulatedDeviceCount);
  ~SimulatedDevice() override;
  SimulatedDevice(const SimulatedDevice&) = delete;
  SimulatedDevice& operator=(const SimulatedDevice&) = delete;

  std::string name() const override { return "simulated"; }
  absl::StatusOr<int> FindDevice(const std::string& uuid) override;
  absl::StatusOr<std::unique_ptr<GpuMapping>> Map(
      int device, absl::Span<const GpuPiece> pieces,
      const PeerFdTaker& take_fd) override;
  absl::StatusOr<std::unique_ptr<GpuEvent>> OpenEvent(
      int device, const GpuHandleRef& handle,
      const PeerFdTaker& take_fd) override;
  absl::StatusOr<std::unique_ptr<GpuStream>> CreateStream(int device) override;
  absl::Status RegisterHostMemory(char* data, uint64_t length,
                                  uint64_t chunk_bytes) override;
  absl::Status UnregisterHostMemory(char* data, uint64_t length,
                                    uint64_t chunk_bytes) override;

  // Fault hook for tests: the next CopyToHost/CopyToDevice call on any of
  // this device's streams that passes its checks fails with `status` (not
  // OK), at `when`.
  void FailNextCopy(absl::Status status,
                    CopyFault when = CopyFault::kOnEnqueue);
  // The next such call's copies start only `stall` after their stream
  // reached them (a copy engine that hangs for a while).
  void StallNextCopy(absl::Duration stall);
  // Device `device` hits a sticky error (`status`, not OK), as a CUDA
  // context does: its streams run nothing more (work not yet run is
  // dropped, a wait in progress gives up), every later call on it (map,
  // open, stream, copy, record, fence) fails with FailedPrecondition
  // naming it, and its events' CompleteIfDeviceFailed completes their
  // records from the CPU. Other devices keep working.
  void FailDevice(int device, absl::Status status);

 private:
  absl::Status CheckOrdinal(int device) const;

  // Constant after construction.
  const int device_count_;
  const std::shared_ptr<SimulatedDeviceState> state_;
};

}  // namespace ckpt

// CudaTrainerGpu: libckpt's TrainerGpu on real GPUs.
//
// Export describes the allocations under a region the way the daemon can
// open them:
//   - cudaMalloc memory (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE):
//     one piece with the cudaIpcMemHandle_t of the whole allocation; the
//     region must lie inside that one allocation (PyTorch's caching
//     allocator carves tensors out of large cudaMalloc blocks, so a tensor
//     always does).
//   - virtual-memory allocations (cuMemCreate + cuMemMap, e.g. PyTorch's
//     expandable segments): one piece per physical allocation the region
//     touches, each with a POSIX-FD shareable handle that this object's
//     caller keeps open (GpuRegionExport::fds) until the daemon has taken
//     it. The allocations must have been created with
//     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among their
//     requestedHandleTypes (recent PyTorch picks POSIX FD or fabric handles
//     for expandable segments by configuration: only POSIX FD works here;
//     unverified which it picks by default).
// Allocation ids are CU_POINTER_ATTRIBUTE_BUFFER_ID, which is unique over
// the process's lifetime and new for every mapping, so that a freed and
// re-mapped address gets a new id.
//
// Events: per device, "ready" and "staged" are event pages
// (cuda_event_page.h: a one-page memfd of two counters, mapped and
// registered here, on which streams wait and write with stream memory
// operations), created on first use. Their memfds stay open, for the daemon
// to take with pidfd_getfd, until this object is destroyed. With them come
// the device's relay page (never exported) and relay stream (a
// cudaStreamNonBlocking stream of this object's own, which waits on the
// daemon's staged page and writes the relay page).
//
// Thread-safety: safe for concurrent use. The calls make the region's or
// event's device current for their duration and restore the caller's.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/relay_order.h"
#include "gpu/trainer_gpu.h"

namespace ckpt {

namespace cuda_internal {
class EventPage;
}  // namespace cuda_internal

class CudaTrainerGpu final : public TrainerGpu {
 public:
  // Cheap; makes no CUDA call.
  static absl::StatusOr<std::unique_ptr<CudaTrainerGpu>> Create();
  ~CudaTrainerGpu() override;

  absl::StatusOr<GpuRegionExport> Export(uint64_t address,
                                         uint64_t length) override;
  absl::StatusOr<std::vector<uint64_t>> AllocationIds(uint64_t address,
                                                      uint64_t length) override;
  absl::StatusOr<GpuEventHandles> Events(
      const std::string& device_uuid) override;
  // `stream` is a cudaStream_t of the uuid's device (nullptr: the legacy
  // default stream).
  absl::Status RecordReady(const std::string& device_uuid,
                           GpuStreamHandle stream) override;
  absl::Status WaitStaged(const std::string& device_uuid,
                          GpuStreamHandle stream) override;
  absl::Status WaitStagedRecord(const std::string& device_uuid, GpuStreamHandle stream,
                                uint64_t record) override;
  // Completes "staged" from the CPU (no stream, no CUDA call): every wait
  // on the records the daemon made so far ends.
  absl::Status SignalStaged(const std::string& device_uuid) override;
  absl::StatusOr<uint64_t> ReserveRelay(const std::string& device_uuid) override;
  absl::Status WaitRelay(const std::string& device_uuid, GpuStreamHandle stream,
                         uint64_t record) override;
  absl::Status Relay(const std::string& device_uuid, uint64_t record,
                     StagedWait after) override;
  bool CompleteRelay(const std::string& device_uuid, uint64_t record) override;

 private:
  // A cudaStreamNonBlocking stream, destroyed with the object (its pending
  // work still runs: cudaStreamDestroy does not wait for it).
  class OwnedStream {
   public:
    OwnedStream() = default;
    ~OwnedStream();
    OwnedStream(OwnedStream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
    OwnedStream& operator=(OwnedStream&&) = delete;
    absl::Status Create();  // on the current device
    cudaStream_t get() const { return stream_; }

   private:
    cudaStream_t stream_ = nullptr;
  };

  struct DeviceEvents {
    int device = -1;
    std::unique_ptr<cuda_internal::EventPage> ready;
    std::unique_ptr<cuda_internal::EventPage> staged;
    GpuEventHandles handles;  // the pages' memfds
    // The relay (trainer_gpu.h, item 4): this process's own page, never
    // exported, and the stream that passes "staged" on to it. Declared
    // after the pages, so destroyed first: its pending operations on them
    // still run, and the pages stay mapped until those completed.
    std::unique_ptr<cuda_internal::EventPage> relay;
    OwnedStream relay_stream;
  };

  CudaTrainerGpu() = default;

  // The 16-byte uuid of `device`, cached.
  absl::StatusOr<std::string> DeviceUuid(int device);
  // The events of the device with `uuid`, created on first use.
  absl::StatusOr<const DeviceEvents*> EventsFor(const std::string& uuid);

  absl::Mutex mu_;
  std::map<int, std::string> uuids_ ABSL_GUARDED_BY(mu_);  // ordinal -> uuid
  // By uuid; entries are never erased, so pointers to them stay valid.
  std::map<std::string, DeviceEvents> events_ ABSL_GUARDED_BY(mu_);
  RelayOrder relay_order_{0xffffffffu};  // event pages count in 32 bits
};

}  // namespace ckpt

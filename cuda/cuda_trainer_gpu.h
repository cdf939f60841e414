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
// to take with pidfd_getfd, until this object is destroyed.
//
// Thread-safety: safe for concurrent use. The calls make the region's or
// event's device current for their duration and restore the caller's.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

 private:
  struct DeviceEvents {
    int device = -1;
    std::unique_ptr<cuda_internal::EventPage> ready;
    std::unique_ptr<cuda_internal::EventPage> staged;
    GpuEventHandles handles;  // the pages' memfds
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
};

}  // namespace ckpt

// SimulatedTrainerGpu: the TrainerGpu (libckpt side) of the simulated GPU,
// and the trainer's allocator of simulated device memory for tests.
//
// Allocate maps one new sealed memfd (simulated_runtime.h) and returns its
// address as the "device pointer"; AllocateSegments maps several back to
// back in one reserved range, the simulated twin of PyTorch's expandable
// segments, where one tensor can span two physical allocations. Every
// allocation gets an id from a process-wide counter that never repeats, so
// an allocation freed and made again at the same address has a new id.
//
// Export hands out, per allocation under a region, a dup of its memfd
// (GpuRegionExport::fds owns the dups; piece.handle.peer_fd is the dup's
// number in this process), for the daemon to take with pidfd_getfd. The
// dup keeps the memory alive, as a CUDA shareable handle does, even if the
// allocation is freed before the daemon took it.
//
// Streams are SimulatedStream*s passed as GpuStreamHandle; there is no
// default stream (nullptr is InvalidArgument). Events(uuid) creates the
// device's "ready" and "staged" SimulatedEvents on first use, with its
// relay event and relay stream; the other event calls create them too if
// needed. SignalStaged
// records staged as an idle stream of this process would: complete at once.
//
// Ownership: the object owns its allocations (unmapped and closed by Free
// or by its destructor) and its events (streams that still use an event
// keep it alive). Thread-safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "gpu/relay_order.h"
#include "gpu/simulated_runtime.h"
#include "gpu/trainer_gpu.h"

namespace ckpt {

class SimulatedTrainerGpu final : public TrainerGpu {
 public:
  explicit SimulatedTrainerGpu(int device_count = kSimulatedDeviceCount);
  ~SimulatedTrainerGpu() override;
  SimulatedTrainerGpu(const SimulatedTrainerGpu&) = delete;
  SimulatedTrainerGpu& operator=(const SimulatedTrainerGpu&) = delete;

  // One allocation of `bytes` (rounded up to the page size, zero-filled) on
  // device `device`; its address.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes, int device = 0);
  // `count` allocations of `bytes_each` (rounded up to the page size),
  // back to back; the address of the first. Each is its own allocation:
  // its own id, freed on its own.
  absl::StatusOr<uint64_t> AllocateSegments(int count, uint64_t bytes_each,
                                            int device = 0);
  // Unmaps and closes the allocation that starts at `address`.
  absl::Status Free(uint64_t address);
  // Frees the allocation that starts at `address` and allocates a new one
  // of its size and device at the same address, as a caching allocator's
  // free and malloc may hand back the same address: a new allocation (its
  // own id, zero-filled) replaces the old with one mmap(MAP_FIXED), so that
  // nothing else in the process can take the address in between (a munmap
  // and then a mapping at that address lost it, now and then, to the
  // sanitizer's own allocations).
  absl::Status Reallocate(uint64_t address);

  // TrainerGpu. Export and AllocationIds: NotFound for a range that is not
  // wholly simulated device memory of this object.
  absl::StatusOr<GpuRegionExport> Export(uint64_t address,
                                         uint64_t length) override;
  absl::StatusOr<std::vector<uint64_t>> AllocationIds(uint64_t address,
                                                      uint64_t length) override;
  absl::StatusOr<GpuEventHandles> Events(
      const std::string& device_uuid) override;
  absl::Status RecordReady(const std::string& device_uuid,
                           GpuStreamHandle stream) override;
  absl::Status WaitStaged(const std::string& device_uuid,
                          GpuStreamHandle stream) override;
  absl::Status WaitStagedRecord(const std::string& device_uuid, GpuStreamHandle stream,
                                uint64_t record) override;
  absl::Status SignalStaged(const std::string& device_uuid) override;
  absl::StatusOr<uint64_t> ReserveRelay(const std::string& device_uuid) override;
  absl::Status WaitRelay(const std::string& device_uuid, GpuStreamHandle stream,
                         uint64_t record) override;
  absl::Status Relay(const std::string& device_uuid, uint64_t record,
                     StagedWait after) override;
  bool CompleteRelay(const std::string& device_uuid, uint64_t record) override;

 private:
  struct Allocation {
    uint64_t id = 0;
    int device = 0;
    uint64_t bytes = 0;
    UniqueFd fd;
  };
  struct DeviceEvents {
    std::shared_ptr<SimulatedEvent> ready;
    std::shared_ptr<SimulatedEvent> staged;
    // The relay event and stream (trainer_gpu.h, item 4): this process's
    // own, never exported.
    std::shared_ptr<SimulatedEvent> relay;
    std::shared_ptr<SimulatedStream> relay_stream;
  };

  absl::StatusOr<uint64_t> MapNew(int count, uint64_t bytes_each, int device);
  // The allocations under [address, address + length), in address order,
  // which must cover it without a gap.
  absl::StatusOr<std::vector<std::pair<uint64_t, const Allocation*>>> Cover(
      uint64_t address, uint64_t length) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<DeviceEvents> EventsOf(const std::string& device_uuid)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const int device_count_;

  mutable absl::Mutex mu_;
  // Live allocations by start address; they never overlap.
  std::map<uint64_t, Allocation> allocations_ ABSL_GUARDED_BY(mu_);
  // Events by device ordinal, created on first use.
  std::map<int, DeviceEvents> events_ ABSL_GUARDED_BY(mu_);
  RelayOrder relay_order_{~uint64_t{0}};
};

}  // namespace ckpt

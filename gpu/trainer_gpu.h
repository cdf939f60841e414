// TrainerGpu: the seam between libckpt and the trainer's GPU, client side.
//
// libckpt uses it to describe the trainer's device memory to the daemon and
// to order the trainer's stream against the daemon's copies:
//
//   1. Export(address, length): the allocations under a region, as handles
//      the daemon can open: a legacy cudaIpcMemHandle_t for cudaMalloc
//      memory; for virtual-memory allocations (PyTorch's expandable
//      segments) one POSIX-FD shareable handle per physical allocation,
//      kept open here until the region is released so that the daemon can
//      take a copy with pidfd_getfd.
//   2. Events(device): a pair of interprocess events per device, created
//      once: "ready" (the trainer records it on its stream right before a
//      save call, after its last write to the saved tensors; the daemon's
//      copies wait on it) and "staged" (the daemon records it after it
//      enqueued the last copy of a save; the trainer's stream waits on it
//      before the optimizer step mutates the tensors).
//   3. AllocationIds(address, length): identities of the allocations under
//      a region now. They change when the trainer frees and re-allocates
//      the memory, even at the same address, so a save never reads an
//      allocation the trainer has replaced.
//   4. The relay (client/staged_relay.h says why): per device, an event of
//      this process's own and a stream of its own. ReserveRelay numbers a
//      record before the save is submitted, WaitRelay makes the trainer's
//      stream wait for it at once, and Relay later enqueues, on the relay
//      stream, "wait for the daemon's staged record, then make the relay
//      record": the GPU passes STAGED on, and no CPU waits for it.
//
// Implementations: CudaTrainerGpu (cuda/) and SimulatedTrainerGpu (gpu/).
// A "stream" is the implementation's own: a cudaStream_t for CUDA (nullptr
// is the legacy default stream), a SimulatedStream* for the simulation.
//
// Thread-safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "gpu/gpu_device.h"

namespace ckpt {

using GpuStreamHandle = void*;

// A region's allocations, ready to send (proto CudaRegion).
struct GpuRegionExport {
  std::string device_uuid;         // 16 bytes
  std::vector<GpuPiece> pieces;    // in address order, covering the region
  std::vector<uint64_t> allocation_ids;  // one per piece
  // Shareable-handle fds this process keeps open for the daemon to take;
  // closed when the export is dropped (after the daemon mapped them).
  std::vector<UniqueFd> fds;
};

// The two interprocess events of one device, as handles to send.
struct GpuEventHandles {
  GpuHandleRef ready;
  GpuHandleRef staged;
};

class TrainerGpu {
 public:
  virtual ~TrainerGpu() = default;
  virtual absl::StatusOr<GpuRegionExport> Export(uint64_t address,
                                                 uint64_t length) = 0;
  virtual absl::StatusOr<std::vector<uint64_t>> AllocationIds(
      uint64_t address, uint64_t length) = 0;
  // Creates the device's events on first use; the same handles afterwards.
  virtual absl::StatusOr<GpuEventHandles> Events(
      const std::string& device_uuid) = 0;
  // Records "ready" on `stream` (no CPU wait).
  virtual absl::Status RecordReady(const std::string& device_uuid,
                                   GpuStreamHandle stream) = 0;
  // Makes `stream` wait for "staged" (no CPU wait).
  virtual absl::Status WaitStaged(const std::string& device_uuid,
                                  GpuStreamHandle stream) = 0;
  // Makes `stream` wait for record `record` of "staged", which the daemon
  // reserved for a save when it accepted it and records once that save's
  // copies are enqueued (no CPU wait, and none for the daemon either).
  virtual absl::Status WaitStagedRecord(const std::string& device_uuid,
                                        GpuStreamHandle stream, uint64_t record) = 0;
  // Completes "staged" from this process's CPU (every record made so far,
  // on the trainer's side): a daemon that died after the trainer's stream
  // began waiting on its staged event will never complete it, and this
  // ends that wait. Only for a daemon known to be gone: while it lives, its
  // copies may still be running.
  virtual absl::Status SignalStaged(const std::string& device_uuid) = 0;

  // Reserves the next record of the device's relay event (creating the
  // device's events on first use); enqueues nothing. Relay must follow,
  // once, for every record reserved: until it did, WaitRelay's waits on
  // the record, and every later record, hold.
  virtual absl::StatusOr<uint64_t> ReserveRelay(const std::string& device_uuid) = 0;
  // Makes `stream` wait for relay record `record` (no CPU wait).
  virtual absl::Status WaitRelay(const std::string& device_uuid, GpuStreamHandle stream,
                                 uint64_t record) = 0;
  // What relay record `record` waits for on the relay stream.
  struct StagedWait {
    enum class Kind {
      kRecord,  // the daemon's staged record `staged_record`
      kLatest,  // the most recent staged record as of this call
      kNone,    // nothing: the record is made once the previous one is
    };
    Kind kind = Kind::kNone;
    uint64_t staged_record = 0;
  };
  // Enqueues on the device's relay stream the wait `after`, then relay
  // record `record`, once record - 1 was reached (no CPU wait for either).
  // Relays go to the stream in record order: a call first waits on the
  // CPU until Relay was called for every earlier record of the device
  // (gpu/relay_order.h; DeadlineExceeded after RelayOrder::kTimeout). On
  // failure nothing that makes the record was enqueued: the caller still
  // owns it.
  virtual absl::Status Relay(const std::string& device_uuid, uint64_t record,
                             StagedWait after) = 0;
  // Completes relay record `record` from the CPU if record - 1 was
  // reached: true once `record` is reached (now or before). For a record
  // whose Relay failed, once what it stood for is known to be over.
  virtual bool CompleteRelay(const std::string& device_uuid, uint64_t record) = 0;
};

}  // namespace ckpt

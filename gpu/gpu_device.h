// GpuDevice: the one narrow seam between ckptd and a GPU, daemon side.
//
// The daemon never calls CUDA directly: sessions map trainer allocations,
// open the trainer's interprocess events and copy through this interface.
// Two implementations exist: CudaDevice (cuda/, the CUDA runtime and driver,
// built when the toolkit is found) and SimulatedDevice (gpu/, "device
// memory" in shared memory, for tests on machines without a GPU). Both keep
// the same ordering rules: work on a stream runs in the order it was
// enqueued; WaitEvent makes later work on the stream wait for the work the
// event's most recent record covers; a fence is ready once every piece of
// work enqueued before it has run.
//
// Handles on the wire (proto CudaAllocation, CudaEventRef) come in two
// kinds: the 64 opaque bytes of a legacy CUDA IPC handle (cudaMalloc
// memory), or the number of a file descriptor in the trainer's fd table (a
// POSIX-FD shareable handle of a virtual-memory allocation, an event's
// semaphore page, or the simulated device's memfd). The daemon
// takes such an fd out of the verified peer with pidfd_getfd (PeerFdTaker),
// never from a process the client names.
//
// Thread-safety: GpuDevice is safe for concurrent use. A GpuStream is used
// by one thread at a time; mappings and events may be shared (shared_ptr)
// and are released when the last user drops them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"

namespace ckpt {

// Takes file descriptor `peer_fd` out of the session's verified peer
// (pidfd_getfd on the pidfd of the handshake).
using PeerFdTaker = std::function<absl::StatusOr<UniqueFd>(int peer_fd)>;

// A handle exported by the trainer: legacy IPC bytes, or an fd in the peer.
struct GpuHandleRef {
  std::string ipc_handle;  // cudaIpcMemHandle_t / cudaIpcEventHandle_t bytes
  int peer_fd = -1;        // used when ipc_handle is empty
};

// One physical allocation under a region, as the trainer exported it.
struct GpuPiece {
  GpuHandleRef handle;
  uint64_t allocation_bytes = 0;  // size of the whole allocation
  uint64_t offset = 0;            // of this piece from the allocation's start
  uint64_t length = 0;            // bytes of the region in this allocation
};

// Trainer device memory mapped into this process, contiguously over all the
// region's pieces. Unmapped (and the import released) when destroyed, so
// the daemon never keeps a trainer's allocation alive longer than this.
class GpuMapping {
 public:
  virtual ~GpuMapping() = default;
  // Device address of the region's first byte in this process.
  virtual uint64_t address() const = 0;
  virtual uint64_t length() const = 0;
};

// An interprocess event opened in this process.
//
// Events are not CUDA IPC events: a wait on one of those stays tied to the
// record it saw, and when the recording process dies mid-way (a daemon
// killed during a save's copies, a trainer killed before its stream
// reached the save point) that record never completes and the waiting
// stream hangs for good; measured on an H100, nothing the survivor does
// releases it. An event here is a semaphore in one page of host memory
// that both processes map (a memfd the trainer creates; the daemon takes it
// with pidfd_getfd): `recorded` counts records (bumped by the CPU at
// enqueue), `completed` is the highest record a stream has reached
// (written by the stream, cuStreamWriteValue32 after a memory fence). A
// wait enqueued on a stream waits (cuStreamWaitValue32, cyclic >=) for the
// `recorded` value it read at enqueue: CUDA's "most recent record" rule.
// And the survivor of a dead peer can complete the records from its CPU.
//
// The peer may write the page at will. So the daemon completes a trainer's
// event only up to the record its own waits cover (GpuStream::WaitEvent's
// answer), never up to what the page's `recorded` says now: a trainer that
// rewound `recorded` and exited would otherwise leave those waits, and the
// copies queued behind them into the staging pool, pending for good.
class GpuEvent {
 public:
  virtual ~GpuEvent() = default;
  // Raises the event's completion, from the CPU, to at least `record` (a
  // number WaitEvent returned), whatever the page says, so that every wait
  // on records up to it ends. Only for an event whose recording process is
  // gone, or whose records up to `record` no longer matter (a save that
  // failed): otherwise those waits end early.
  virtual absl::Status CompleteThrough(uint64_t record) = 0;

  // Reserves the event's next record and returns its number, enqueueing
  // nothing: a wait for exactly that record may be enqueued at once, in
  // either process (the trainer's stream waits for a save's "staged"
  // record from the moment the save call returns). The reserver must then
  // make the record reach its number: GpuStream::RecordReserved, or
  // CompleteReserved. A reserved record that never does holds every wait
  // on it, and every later record, for good.
  virtual uint64_t ReserveRecord() = 0;
  // Completes reserved record `record` from the CPU, if the record before
  // it was reached or the device failed (below): true once `record` is
  // reached (now or before), false while the one before is not. For a
  // record whose copies never ran or will not matter (a failed save):
  // nothing is enqueued, so it works on a device that cannot run work any
  // more too.
  virtual bool CompleteReserved(uint64_t record) = 0;
  // For a record enqueued on a stream of the event's device: true once it
  // is reached; if the device failed (a sticky error broke this process's
  // context there, so nothing enqueued on it will ever run), completes it
  // from the CPU first, whatever came before it: no copy of the daemon
  // reads the trainer's memory on that device any more, and the trainer's
  // stream must not wait for a record that will never come. False while
  // the device works and the stream has not reached it.
  virtual bool CompleteIfDeviceFailed(uint64_t record) = 0;
};

// Completion of the work enqueued on a stream before it.
class GpuFence {
 public:
  virtual ~GpuFence() = default;
  // True once complete; an error if the work failed.
  virtual absl::StatusOr<bool> Ready() = 0;
  // Waits until complete, DeadlineExceeded after `timeout`.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
};

// `length` bytes between device address `device` (in this process) and
// host memory `host`.
struct GpuCopy {
  uint64_t device = 0;
  char* host = nullptr;
  uint64_t length = 0;
};

// An ordered queue of copies on one device (a dedicated copy stream).
class GpuStream {
 public:
  virtual ~GpuStream() = default;
  // Makes later work wait for the event's most recent record as of now;
  // returns that record's number (0: never recorded, the wait does not
  // block), which the caller keeps for GpuEvent::CompleteThrough.
  virtual absl::StatusOr<uint64_t> WaitEvent(GpuEvent& event) = 0;
  // Records `event` after the stream's earlier work and after the event's
  // previous record, on whichever stream that was made, was reached: the
  // records reach the event in the order they were made. The daemon records
  // a session's "staged" on each save's own stream, and two saves of one
  // rank may be in flight at once; were the later one's record reached
  // first, the earlier one's would take `completed` back, and a wait on
  // the later record would never end.
  virtual absl::Status RecordEvent(GpuEvent& event) = 0;
  // RecordEvent of a record reserved before (GpuEvent::ReserveRecord). On
  // failure the record is still reserved: the caller completes it.
  virtual absl::Status RecordReserved(GpuEvent& event, uint64_t record) = 0;
  // Enqueues device-to-host copies; `host` must be registered memory.
  virtual absl::Status CopyToHost(absl::Span<const GpuCopy> copies) = 0;
  // Enqueues host-to-device copies; `host` must be registered memory.
  virtual absl::Status CopyToDevice(absl::Span<const GpuCopy> copies) = 0;
  virtual absl::StatusOr<std::unique_ptr<GpuFence>> Fence() = 0;
};

class GpuDevice {
 public:
  virtual ~GpuDevice() = default;
  // "cuda" or "simulated".
  virtual std::string name() const = 0;
  // This process's ordinal of the device with `uuid` (16 bytes, as
  // cudaDeviceProp::uuid). FailedPrecondition when there is no usable
  // driver or device, NotFound for an unknown uuid.
  virtual absl::StatusOr<int> FindDevice(const std::string& uuid) = 0;
  // Maps the pieces contiguously, in order, on `device`.
  virtual absl::StatusOr<std::unique_ptr<GpuMapping>> Map(
      int device, absl::Span<const GpuPiece> pieces,
      const PeerFdTaker& take_fd) = 0;
  // Opens a trainer's interprocess event.
  virtual absl::StatusOr<std::unique_ptr<GpuEvent>> OpenEvent(
      int device, const GpuHandleRef& handle, const PeerFdTaker& take_fd) = 0;
  virtual absl::StatusOr<std::unique_ptr<GpuStream>> CreateStream(int device) = 0;
  // Pins `length` bytes of host memory for DMA by every device (in chunks:
  // single registrations of very large ranges fail on recent drivers).
  // Chunks are `chunk_bytes` or smaller, aligned to it from `data`, so any
  // buffer of a size dividing chunk_bytes lies inside one chunk.
  virtual absl::Status RegisterHostMemory(char* data, uint64_t length,
                                          uint64_t chunk_bytes) = 0;
  virtual absl::Status UnregisterHostMemory(char* data, uint64_t length,
                                            uint64_t chunk_bytes) = 0;
};

}  // namespace ckpt

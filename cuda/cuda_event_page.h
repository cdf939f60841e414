// EventPage: an interprocess GPU event as a semaphore in one page of host
// memory that the trainer and the daemon both map. gpu/gpu_device.h
// (GpuEvent) says why these are not CUDA IPC events: a wait on one of those
// hangs for good when the recording process dies before its record.
//
// Layout: two 32-bit words. `recorded` (offset 0) counts records; the CPU
// of the recording process bumps it when it enqueues one. `completed`
// (offset 4) is the highest record a stream has reached. 32 bits suffice:
// the GPU compares cyclically ((int32_t)(completed - target) >= 0), so the
// counters may wrap as long as no wait lags 2^31 records behind.
//
// The protocol:
//   Record(stream): target = ++recorded (CPU, atomic), then
//     cuStreamWriteValue32(stream, &completed, target,
//     CU_STREAM_WRITE_VALUE_DEFAULT). The default flag puts a memory fence
//     before the write (like __threadfence_system, scoped to the stream),
//     so what the stream wrote before (the trainer's tensors before
//     "ready", the daemon's copies before "staged") is visible to whoever
//     sees the new value.
//   Wait(stream): target = recorded (CPU, now), then
//     cuStreamWaitValue32(stream, &completed, target,
//     CU_STREAM_WAIT_VALUE_GEQ). That is cudaStreamWaitEvent's rule: a wait
//     covers the most recent record as of the call, and an event never
//     recorded does not block.
//   CompleteRecorded(): completed = recorded (CPU; only ever raised), which
//     ends every wait on the records made so far: the trainer, for its own
//     staged page, when the daemon is gone.
//   CompleteThrough(target): completed = target (CPU; only ever raised).
//     That is what the daemon does for a dead trainer, whose pending writes
//     died with its context, with the target its own wait read at enqueue:
//     never the page's `recorded`, which the trainer could have rewound.
// One process records each event (the trainer "ready", the daemon
// "staged"). The trainer records from its stream, in order; the daemon
// records each save's "staged" on that save's own stream, and saves of one
// rank may overlap, so its records are ordered (RecordOrder::kAfterPrevious):
// the stream first waits for `completed` >= target - 1, then writes target.
// Either way `completed` only grows.
//
// Waits do not use CU_STREAM_WAIT_VALUE_FLUSH. That flag makes *remote*
// writes (another PCIe device's, e.g. GPUDirect RDMA into this GPU) that
// reached the device before the wait visible to the work after it. The
// writes our waits protect are made by streams on the GPU itself (kernels,
// copy engines), which the writer's fence already orders before
// `completed`; and the flag exists only on some platforms
// (CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES), so using it where
// available would only make the ordering differ between machines.
//
// Lifetime: the page is registered with cuMemHostRegister(PORTABLE |
// DEVICEMAP), so that the streams of every context of the process can
// address it. A stream may wait on or write the page long after the call
// that enqueued it returned, and unregistering the page under it would
// fault the GPU (a sticky error: the context is lost). So each stream
// operation is followed by a CUDA event, and the destructor unregisters and
// unmaps the page only once all of those completed; otherwise it leaves the
// page mapped (one page, logged) rather than risk the fault.
//
// The peer is untrusted: Open takes only a regular file of exactly one page
// sealed against shrinking (a memfd the peer could truncate would SIGBUS
// us). A live peer can still write the page at will; that can hold back
// our waits on its event, as it could by never reaching its record, and
// the callers' timeouts deal with both.
//
// Thread-safety: safe for concurrent use. The counters are lock-free
// atomics (shared with the other process); the stream-use list is guarded
// by mu_.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "cuda/cuda_driver.h"

namespace ckpt::cuda_internal {

// Turns a driver result into a Status the caller's way: the daemon marks a
// device broken on a sticky error (DeviceState::Check); libckpt clears the
// runtime's last error and names a missing context.
using CuCheck = std::function<absl::Status(CUresult, absl::string_view)>;

// OK if `fd` is a regular file of exactly one page sealed against
// shrinking, InvalidArgument otherwise. Makes no CUDA call.
absl::Status CheckEventPageFd(int fd);

class EventPage {
 public:
  // A new page (a sealed memfd) registered in the current context, that
  // of `device` (the caller makes it current). For the trainer.
  static absl::StatusOr<std::unique_ptr<EventPage>> Create(
      int device, const CuCheck& check);
  // The page behind `fd`, taken from the untrusted peer (CheckEventPageFd),
  // registered as Create does. The fd is closed once the page is mapped.
  static absl::StatusOr<std::unique_ptr<EventPage>> Open(UniqueFd fd,
                                                         int device,
                                                         const CuCheck& check);
  // See "Lifetime" above.
  ~EventPage();
  EventPage(const EventPage&) = delete;
  EventPage& operator=(const EventPage&) = delete;

  int device() const { return device_; }
  // The memfd of a page this process created (what the trainer exports);
  // -1 for an opened page.
  int fd() const { return fd_.get(); }

  // Enqueue a record / a wait on `stream`, a stream of `stream_device`,
  // which the caller has made current. Neither blocks the CPU.
  enum class RecordOrder {
    kStreamOrder,    // the caller records on one stream, in order
    kAfterPrevious,  // the write waits for the previous record's
  };
  absl::Status Record(CUstream stream, int stream_device, const CuCheck& check,
                      RecordOrder order = RecordOrder::kStreamOrder);
  absl::Status Wait(CUstream stream, int stream_device, const CuCheck& check);
  // Completes every record made so far, from the CPU (no CUDA call).
  void CompleteRecorded();

  // Reserved records (GpuEvent::ReserveRecord): `recorded` is bumped now,
  // and the record is made later, on a stream (RecordReserved, in order
  // after the previous record) or from the CPU (CompleteReserved); a wait
  // for it (WaitFor) may be enqueued in between, by either process. A
  // reserved record is never taken back: a wait may already be on it.
  uint32_t Reserve();
  absl::Status RecordReserved(CUstream stream, int stream_device, const CuCheck& check,
                              uint32_t target);
  // Raises `completed` to `target` if it has reached target - 1 (no CUDA
  // call); true once `completed` covers `target`, now or before.
  bool CompleteReserved(uint32_t target);
  // Raises `completed` to at least `target`, whatever it reached before
  // (no CUDA call): only where nothing enqueued will ever reach it.
  void CompleteThrough(uint32_t target);
  // Whether `completed` covers `target` (cyclic, as the GPU compares).
  bool Reached(uint32_t target) const;
  // Wait for record `target` rather than the most recent one.
  absl::Status WaitFor(CUstream stream, int stream_device, const CuCheck& check,
                       uint32_t target);

  uint32_t recorded() const;
  uint32_t completed() const;

 private:
  // A stream operation on the page and the CUDA event recorded after it.
  struct Use {
    CUevent event;
    int device;
  };

  EventPage(const CudaDriverApi* api, UniqueFd fd, uint32_t* words, int device)
      : api_(api), fd_(std::move(fd)), words_(words), device_(device) {}

  // Checks that the device can use registered host memory, registers the
  // page in the current context and checks it has a device address.
  absl::Status Register(const CuCheck& check);
  // The device address of `completed` in the current context.
  absl::StatusOr<CUdeviceptr> CompletedOnDevice(const CuCheck& check) const;
  // Enqueues the write of record `target` (with `order`). On failure nothing
  // was enqueued that writes `completed`.
  absl::Status EnqueueRecord(CUstream stream, int stream_device, const CuCheck& check,
                             uint32_t target, RecordOrder order);
  // Records `after` (a new event) on `stream` behind an operation on the
  // page, and forgets the uses of `stream_device` that completed.
  absl::Status Track(CUstream stream, int stream_device, CUevent after,
                     const CuCheck& check);

  // Constant after construction (registered_ is set once, by the factory).
  const CudaDriverApi* const api_;
  const UniqueFd fd_;
  uint32_t* const words_;  // [0] recorded, [1] completed: atomic_ref only
  const int device_;       // the device the page is registered on
  bool registered_ = false;

  absl::Mutex mu_;
  std::vector<Use> uses_ ABSL_GUARDED_BY(mu_);
  // An operation was enqueued whose end cannot be told: never unregister.
  bool untracked_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt::cuda_internal

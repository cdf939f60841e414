// The simulated GPU's runtime: what both sides of the simulation share, as
// the CUDA driver is shared by the trainer and the daemon. SimulatedTrainerGpu
// (trainer side) and SimulatedDevice (daemon side) are built on it.
//
// Device memory. One physical allocation is a memfd whose size is a
// multiple of the page size (CUDA's allocation granularity), sealed
// against shrinking and growing. The trainer maps it and uses the address
// as the "device pointer"; it exports the memfd's fd number, and the daemon
// takes the fd out of the trainer with pidfd_getfd and maps it, exactly as
// it takes a CUDA POSIX-FD shareable handle. The seals matter because the
// peer is untrusted: a memfd its owner could shrink would SIGBUS the
// daemon's copies. Device i's uuid is the 12 bytes "ckpt-sim-gpu" followed
// by i as 4 bytes, most significant first. In /proc/<pid>/maps, allocations
// show as "/memfd:ckpt-sim-alloc-gpu<i>" (one line per mapped allocation)
// and event pages as "/memfd:ckpt-sim-event".
//
// Streams. A SimulatedStream is one thread that runs enqueued work in
// order, as a CUDA stream runs kernels and copies.
//
// Events. A SimulatedEvent is an interprocess event: one page of simulated
// device memory holding two lock-free 64-bit atomic counters, so the
// trainer and the daemon, each mapping the page, see one event:
//   recorded  - how many records were enqueued (at enqueue time, CPU side);
//   completed - the highest record a stream has reached.
// RecordEvent: at enqueue, target = ++recorded; when the stream reaches
// the record, completed = max(completed, target) (release). The daemon's
// records (GpuStream::RecordEvent) first wait for completed >= target - 1,
// as its CUDA streams do: records made on several streams are reached in
// the order they were made.
// WaitEvent: at enqueue, target = recorded; when the stream reaches the
// wait, it blocks until completed >= target (acquire), polling every
// kSimulatedEventPollInterval.
// This is CUDA's rule: a wait covers the event's most recent record at the
// time of the wait call, not records made after it, and a wait on an event
// never recorded does not block.
//
// Destroying a stream lets the work already enqueued run, except that the
// stream gives up at the first event wait that is not satisfied: the wait
// returns and all work after it is dropped (destroyed without running), so
// a stream waiting for a peer that died never hangs its owner. A stream
// given a `halted` test stops for good once it holds (the stream of a
// context that hit a sticky error): the work not yet run is dropped, a wait
// in progress gives up.
//
// Ownership: a stream owns its thread and queued work; work that records
// or waits on an event holds the event (shared_ptr), so an event may be
// dropped while streams still use it. An event owns its page and fd.
// Thread-safety: the free functions and SimulatedEvent are safe for
// concurrent use (events across processes too). SimulatedStream's methods
// are safe to call from any thread but its own (Synchronize from a stream's
// own work deadlocks).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"

namespace ckpt {

// Devices a SimulatedDevice / SimulatedTrainerGpu has unless told otherwise.
inline constexpr int kSimulatedDeviceCount = 2;

// The 16-byte uuid of simulated device `ordinal`.
std::string SimulatedDeviceUuid(int ordinal);
// The ordinal of `uuid` among `device_count` simulated devices; NotFound
// for any other uuid.
absl::StatusOr<int> SimulatedDeviceOrdinal(absl::string_view uuid,
                                           int device_count);

// The simulated allocation granularity (the page size).
uint64_t SimulatedPageSize();

// Creates one simulated physical allocation: a sealed memfd of `bytes`, a
// multiple of SimulatedPageSize(). `name` shows in /proc/<pid>/maps.
absl::StatusOr<UniqueFd> CreateSimulatedAllocation(uint64_t bytes,
                                                   const char* name);

// Checks that `fd`, taken from an untrusted peer, is a simulated allocation
// of exactly `bytes`: a regular file of that size sealed against shrinking.
// InvalidArgument otherwise.
absl::Status CheckSimulatedAllocation(int fd, uint64_t bytes);

// Reserves one range of address space for the sum of `sizes` and maps the
// memfds `fds` whole (MAP_SHARED, read-write), back to back in order.
// `at` != 0 places the range there (AlreadyExists if anything is mapped
// there). Returns the range's start; the caller owns the range and
// munmaps it (whole, or allocation by allocation). Nothing stays mapped on
// failure. The fds may be closed afterwards.
absl::StatusOr<char*> MapBackToBack(absl::Span<const int> fds,
                                    absl::Span<const uint64_t> sizes,
                                    uint64_t at = 0);

// How often a stream waiting on an event checks it.
inline constexpr absl::Duration kSimulatedEventPollInterval =
    absl::Microseconds(50);

class SimulatedEvent {
 public:
  // A new event page in this process; never recorded.
  static absl::StatusOr<std::shared_ptr<SimulatedEvent>> Create();
  // Maps the event page `fd` (taken from an untrusted peer; checked to be a
  // sealed page-sized memfd).
  static absl::StatusOr<std::shared_ptr<SimulatedEvent>> Open(UniqueFd fd);

  ~SimulatedEvent();
  SimulatedEvent(const SimulatedEvent&) = delete;
  SimulatedEvent& operator=(const SimulatedEvent&) = delete;

  // The page's memfd in this process (what the trainer exports).
  int fd() const { return fd_.get(); }
  // Records enqueued so far / the highest record reached (for tests).
  uint64_t recorded() const;
  uint64_t completed() const;
  // A record reached at once, as one on an idle stream: it releases every
  // wait on this event's earlier records.
  void RecordCompleted();
  // Completes every record made so far (the trainer, for its own staged
  // event once the daemon is gone: TrainerGpu::SignalStaged).
  void CompleteRecorded() { Complete(recorded()); }
  // The CPU side of a record: bumps `recorded` and returns the record's
  // number (GpuEvent::ReserveRecord).
  uint64_t EnqueueRecord();
  // Completes record `target` if `completed` reached target - 1; true once
  // it covers `target` (GpuEvent::CompleteReserved).
  bool CompleteReserved(uint64_t target);
  // Raises `completed` to at least `target`, whatever was reached before:
  // what a stream does when it reaches a record, and what the CPU does for
  // records no stream will reach (GpuEvent::CompleteIfDeviceFailed).
  void Complete(uint64_t target);
  bool Covers(uint64_t target) const { return completed() >= target; }

 private:
  SimulatedEvent(UniqueFd fd, uint64_t* page);

  // Constant after construction. page_[0] is `recorded`, page_[1]
  // `completed`; only ever accessed through std::atomic_ref.
  const UniqueFd fd_;
  uint64_t* const page_;
};

class SimulatedStream {
 public:
  // `halted` (optional) is asked before each piece of work and while a
  // wait polls; once it is true the stream runs nothing more.
  explicit SimulatedStream(std::function<bool()> halted = nullptr);
  // See the file comment: runs what can run, gives up at an unsatisfied
  // event wait, then joins the thread.
  ~SimulatedStream();
  SimulatedStream(const SimulatedStream&) = delete;
  SimulatedStream& operator=(const SimulatedStream&) = delete;

  // Runs `work` on the stream's thread after all work enqueued before it.
  void Enqueue(std::function<void()> work);
  // Blocks until all work enqueued before this call has run.
  void Synchronize();
  // Records `event` at this point of the stream; with `after_previous`,
  // once the event's previous record was reached too (GpuStream::RecordEvent).
  void RecordEvent(std::shared_ptr<SimulatedEvent> event, bool after_previous = false);
  // Records `event`'s reserved record `target` (EnqueueRecord made it) at
  // this point of the stream, once record target - 1 was reached.
  void RecordReserved(std::shared_ptr<SimulatedEvent> event, uint64_t target);
  // Makes later work wait for `event`'s most recent record as of now.
  void WaitEvent(std::shared_ptr<SimulatedEvent> event);
  // Makes later work wait for `event`'s record `target`.
  void WaitFor(std::shared_ptr<SimulatedEvent> event, uint64_t target);

 private:
  void Run();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(std::shared_ptr<SimulatedEvent> event, uint64_t target, bool after_previous);
  // Whether a wait in progress gives up: the stream is being destroyed or
  // halted (then it runs nothing more).
  bool GivesUp();

  const std::function<bool()> halted_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // Set (under mu_) by the destructor; read without it by waiting work.
  std::atomic<bool> stopping_{false};
  // Set by a wait that gave up; the stream's thread only.
  bool abandoned_ = false;
  // Last, so the thread starts once the fields above exist.
  std::thread worker_;
};

}  // namespace ckpt

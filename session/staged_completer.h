// StagedCompleter: completes, from the CPU and in order, the "staged"
// records of saves that will not record them on a stream.
//
// A save reserves a record of each of its session's staged events when it
// is accepted (session/staged_records.h), and the trainer's stream may wait
// for that record from then on. A save that fails before its copies are
// enqueued, or that did not copy from a device at all, must still make the
// record reach its number, or the trainer's stream waits for good; but not
// before the record ahead of it was reached: `completed` only grows, so
// reaching record N also ends the waits on record N - 1, whose save's
// copies may still be reading the trainer's memory. So this waits for
// record N - 1 (GpuEvent::CompleteReserved), polling every millisecond on
// a thread of its own while it has records to complete.
//
// A record whose predecessor is never reached (its copies wait behind a
// trainer stream that never gets to its ready event) waits as long; the
// trainer's stream is stuck ahead of it then anyway. Records left when the
// daemon stops are dropped: the trainer completes its staged events itself
// when the daemon exits (Client::WatchDaemon).
//
// A device whose context failed (a sticky CUDA error) runs nothing the
// daemon enqueued on it, records included: a failed save hands the records
// it had enqueued there to CompleteIfDeviceFails, and every record of that
// device's events is completed from the CPU at once, whatever came before
// (GpuEvent::CompleteIfDeviceFailed), so no trainer's stream waits for the
// daemon's restart.
//
// Thread-safety: safe for concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/gpu_device.h"

namespace ckpt {

class StagedCompleter {
 public:
  StagedCompleter() = default;
  // Stops the thread; records not yet completed are dropped (logged).
  ~StagedCompleter();
  StagedCompleter(const StagedCompleter&) = delete;
  StagedCompleter& operator=(const StagedCompleter&) = delete;

  // Completes `record` of `event` now if the record before it was reached,
  // else once it is.
  void Complete(std::shared_ptr<GpuEvent> event, uint64_t record);
  // `record` of `event` was enqueued on a stream of a save that failed, so
  // nobody waits for it to be reached: completes it if the event's device
  // fails before its stream reaches it; forgets it once reached.
  void CompleteIfDeviceFails(std::shared_ptr<GpuEvent> event, uint64_t record);
  // Records waiting for the one before them.
  size_t pending() const;

 private:
  struct Pending {
    std::shared_ptr<GpuEvent> event;
    uint64_t record = 0;
    bool enqueued = false;  // CompleteIfDeviceFails's
    // True once the record is reached (completed here, maybe).
    bool Done() const {
      return enqueued ? event->CompleteIfDeviceFailed(record) : event->CompleteReserved(record);
    }
  };
  void Add(Pending pending);
  void Run();

  static constexpr absl::Duration kPoll = absl::Milliseconds(1);

  mutable absl::Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // started by the first wait
};

}  // namespace ckpt

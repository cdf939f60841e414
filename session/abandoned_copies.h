// AbandonedCopies: the GPU copies of saves that ended before their copies
// did, kept with everything those copies may touch until they end.
//
// A save's copies wait, on the daemon's copy stream, for the trainer's ready
// event. When the trainer lives but its stream does not get there (a step
// hung in a collective), the save fails at the copy timeout, and Drain
// (session/peer_copy_out.h) cannot make sure that the copies queued behind
// that wait will not run later: they would read the trainer's memory
// through the daemon's mappings and write the save's staging buffers. So
// the batch hands its streams, its regions (mappings and events) and its
// buffers over to this object, which fences the streams and looks at each
// batch every `poll` from one thread:
//   1. every copy ended (the fence was reached: the trainer's stream got to
//      the ready event after all): the batch is let go, its buffers back to
//      the pool and its mappings released (those still live in a session
//      stay mapped there);
//   2. the trainer exited (its pidfd is readable): its ready events are
//      completed from the CPU (GpuEvent::CompleteRecorded), which ends the
//      waits; the queued copies then run, from allocations the mappings
//      keep alive, into buffers nobody else has, and end: then 1;
//   3. a fence that fails, or copies that still do not end `grace` after
//      the trainer exited: kept for the daemon's life, the buffers withheld
//      from the pool (StagingLease::Withhold) and the regions quarantined
//      (QuarantineRegions), as everything was before this object existed.
// A job's usual answer to a hung step, killing every rank and starting
// again, thus gives the pool its buffers back and the dead trainer's GPU
// memory back to the device within a poll, instead of holding both until
// ckptd restarts.
//
// Ownership: owns the batches handed over and its thread (started at the
// first Adopt). At destruction, batches whose copies have not ended are
// kept for the process's life as in 3. Borrows nothing.
// Thread-safety: safe for concurrent use.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/daemon_metrics.h"
#include "common/unique_fd.h"
#include "gpu/gpu_device.h"
#include "io/staging_pool.h"
#include "session/gpu_region.h"

namespace ckpt {

class AbandonedCopies {
 public:
  // One save's copies whose end is not known.
  struct Batch {
    std::string what;        // names the save in the log
    UniqueFd trainer_pidfd;  // invalid: the trainer's exit cannot be seen
    pid_t trainer_pid = 0;
    // Everything the batch enqueued is on these streams.
    std::vector<std::unique_ptr<GpuStream>> streams;
    // The trainer's ready events the streams wait on; each belongs to one
    // of `regions`, which keep it open.
    std::vector<GpuEvent*> ready_events;
    std::vector<std::shared_ptr<const GpuRegion>> regions;
    // Staging buffers the copies write.
    std::vector<StagingLease> buffers;
  };

  static constexpr absl::Duration kPoll = absl::Milliseconds(100);
  static constexpr absl::Duration kGrace = absl::Seconds(30);

  explicit AbandonedCopies(absl::Duration poll = kPoll,
                           absl::Duration grace = kGrace)
      : poll_(poll), grace_(grace) {}
  ~AbandonedCopies();
  AbandonedCopies(const AbandonedCopies&) = delete;
  AbandonedCopies& operator=(const AbandonedCopies&) = delete;

  // Takes `batch` and fences its streams (the caller no longer uses them).
  void Adopt(Batch batch);
  // Batches whose copies have not ended yet (not counting those kept for
  // good).
  size_t pending() const;
  // Batches kept for the daemon's life so far.
  size_t kept_for_good() const;

 private:
  struct Watched {
    Batch batch;
    std::vector<std::unique_ptr<GpuFence>> fences;  // one per stream
    absl::Time adopted;
    absl::Time trainer_exited = absl::InfiniteFuture();
  };
  enum class Outcome { kRunning, kEnded, kKeepForGood };

  void Run();
  // One look at `w` (see the file comment); logs what it decides.
  Outcome Look(Watched& w);
  // Withholds the buffers and quarantines the regions (3 above).
  static void KeepForGood(Watched w);

  // Constant after construction.
  const absl::Duration poll_;
  const absl::Duration grace_;

  mutable absl::Mutex mu_;
  std::vector<Watched> watched_ ABSL_GUARDED_BY(mu_);
  size_t kept_for_good_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // started by the first Adopt

  // Read at each metrics render; last, so unbound before what it reads goes.
  GaugeBinding pending_gauge_ = DaemonMetrics::Get().gpu_saves_held.Bind(
      [this] { return static_cast<double>(pending()); });
};

}  // namespace ckpt

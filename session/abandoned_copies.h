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
//   2. the trainer exited (its pidfd is readable), or lives but its
//      stream did not reach the save's ready events by the batch's
//      `ready_deadline` (the copy timeout after the save's first wait: the
//      save failed for it, so the copies' bytes no longer matter): the
//      ready events are completed from the CPU up to the records the
//      batch's waits cover (GpuEvent::CompleteThrough), never up to what
//      the trainer's page says (it may have rewound it), which ends the
//      waits; the queued copies then run, from allocations the mappings
//      keep alive, into buffers nobody else has, and end: then 1. A live
//      trainer's next save waits for a later record, which this does not
//      complete. Done again at every look until the copies end: a live
//      trainer's stream may write `completed` back below those records;
//   3. a fence that fails, or copies that still do not end `grace` after
//      the trainer exited: kept for the daemon's life, the buffers withheld
//      from the pool (StagingLease::Withhold) and the regions quarantined
//      (QuarantineRegions), as everything was before this object existed.
//      A live trainer's copies are watched as long as it lives (they hold
//      at most its session's share of the pool).
// A job's usual answer to a hung step, killing every rank and starting
// again, thus gives the pool its buffers back and the dead trainer's GPU
// memory back to the device within a poll, instead of holding both until
// ckptd restarts; a trainer that hangs on gives them back at the copy
// timeout, and a lying one cannot hold them longer.
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
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/daemon_metrics.h"
#include "common/unique_fd.h"
#include "gpu/gpu_device.h"
#include "io/staging_pool.h"
#include "session/gpu_region.h"
#include "session/pool_share.h"

namespace ckpt {

class AbandonedCopies {
 public:
  // A stream's wait on a trainer's ready event.
  struct ReadyWait {
    GpuEvent* event = nullptr;
    uint64_t record = 0;
  };
  // One save's copies whose end is not known.
  struct Batch {
    std::string what;        // names the save in the log
    UniqueFd trainer_pidfd;  // invalid: the trainer's exit cannot be seen
    pid_t trainer_pid = 0;
    // Everything the batch enqueued is on these streams.
    std::vector<std::unique_ptr<GpuStream>> streams;
    // The trainer's ready events the streams wait on, each with the record
    // the wait covers (GpuStream::WaitEvent's answer); each belongs to one
    // of `regions`, which keep it open.
    std::vector<ReadyWait> ready_waits;
    // When a live trainer's stream should have reached them (2 above);
    // InfiniteFuture: only the trainer's exit completes them.
    absl::Time ready_deadline = absl::InfiniteFuture();
    std::vector<std::shared_ptr<const GpuRegion>> regions;
    // Staging buffers the copies write.
    std::vector<StagingLease> buffers;
    // Their claims on the session's share of the pool, given back with them.
    std::vector<PoolShare::Claim> claims;
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
    bool ready_completed = false;  // here, at least once (2 above)
  };
  enum class Outcome { kRunning, kEnded, kKeepForGood };

  void Run();
  // One look at `w` (see the file comment); logs what it decides.
  Outcome Look(Watched& w);
  // Completes `w`'s ready events up to its waits' records (2 above),
  // logging it if `log`; false (logged) if one could not be.
  static bool CompleteReadyWaits(Watched& w, absl::string_view why, bool log);
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

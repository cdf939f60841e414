// PeerCopyOut: one save's copies out of a session's memory, host and GPU.
//
// Host spans are read at once (HostProcessMemory: pread of the peer's
// bound /proc/<pid>/mem). GPU spans are enqueued
// on one copy stream per device, created for this batch: before the first
// copy from a region the stream waits on the region's ready event (which
// the trainer recorded on its own stream right before the save call, after
// its last write), then D2H copies go straight into the caller's pinned
// staging buffers; fences tell when they are done. AllEnqueued records the staged event of every region read, on its
// device's stream after the last copy: that is the GPU-side STAGED the
// trainer's stream waits on. Copies are handed to the streams in batches of
// 64 MiB (adjacent tensors merged into one copy), and fenced only when
// someone waits, so that enqueuing a whole save costs the trainer's CPU
// little however many windows it has.
//
// A trainer that dies before its stream reaches the ready event leaves this
// batch's streams waiting for a record that will never complete, with copies
// queued behind the wait into pool buffers and from mapped trainer memory.
// Neither may be reused or unmapped while a copy could still run, so Drain
// (after any error) completes the dead trainer's ready events from the CPU
// up to the records this batch's waits cover (GpuEvent::CompleteThrough;
// never what the trainer's page says: a lying trainer may have rewound
// it): the waits end, the queued copies run (from
// the allocation the daemon's mapping keeps alive, into buffers not yet
// reused) and complete, and only then are the buffers and regions let go.
// Waits check the trainer's liveness, so its death fails the save at once
// rather than at the timeout. When Drain cannot make sure (the trainer lives
// on, its stream still short of the ready event a second later), the caller
// hands the batch the buffers the copies write (KeepUntilCopiesEnd), and the
// batch, when destroyed, hands its streams, regions and those buffers to the
// daemon's AbandonedCopies (session/abandoned_copies.h), which lets them go
// once the copies end: when the trainer's stream gets there, after the
// trainer exits, or once the copy timeout after the first wait passed (the
// save is lost then; the pool is not).
//
// The regions read are held until the batch ends, so a region released
// meanwhile is unmapped only after its copies.
//
// Thread-safety: one thread at a time (CopyOutBatch).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_set>
#include <vector>

#include "absl/time/time.h"
#include "session/abandoned_copies.h"
#include "session/gpu_regions.h"
#include "session/memory_source.h"
#include "session/staged_records.h"

namespace ckpt {

class PeerCopyOut final : public CopyOutBatch {
 public:
  // Borrows `host`, `regions`, the trainer's pidfd `trainer_pidfd`
  // (process `trainer_pid`) and `staged` (may be null: the save reserved
  // no staged record); they outlive the batch.
  PeerCopyOut(MemorySource* host, GpuRegions* regions, int trainer_pidfd,
              pid_t trainer_pid, StagedRecords* staged)
      : host_(host),
        regions_(regions),
        trainer_pidfd_(trainer_pidfd),
        trainer_pid_(trainer_pid),
        staged_(staged) {}
  ~PeerCopyOut() override;

  absl::StatusOr<uint64_t> Enqueue(absl::Span<const CopySpan> spans) override;
  absl::StatusOr<bool> Ready(uint64_t ticket) override;
  absl::Status Wait(uint64_t ticket) override;
  absl::Status AllEnqueued() override;
  absl::Status Drain() override;
  void KeepUntilCopiesEnd(std::vector<StagingLease> buffers) override;
  // A claim on the session's share (GpuRegions::pool_share) while the
  // session has GPU regions, or this batch GPU copies; else an empty one.
  absl::StatusOr<PoolShare::Claim> ClaimBuffer(bool may_wait) override;

 private:
  struct DeviceQueue {
    std::unique_ptr<GpuStream> stream;
    // Ready events waited on, each with the record its wait covers.
    std::vector<AbandonedCopies::ReadyWait> waited;
    // Staged events to record (by address, for a stable order).
    std::map<GpuEvent*, std::shared_ptr<GpuEvent>> staged;
    std::vector<GpuCopy> unsubmitted;  // not yet handed to the stream
    const GpuRegion* last_region = nullptr;  // of unsubmitted.back()
    uint64_t last_ticket = 0;                // of unsubmitted.back()
    bool unfenced = false;             // copies submitted since the last fence
  };
  // Fences that cover every GPU copy of tickets up to `ticket`.
  struct Pending {
    uint64_t ticket;
    std::vector<std::unique_ptr<GpuFence>> fences;
  };
  absl::StatusOr<DeviceQueue*> Queue(int device);
  // The live GPU region that holds `span`, held until the batch ends;
  // nullptr for host memory.
  absl::StatusOr<const GpuRegion*> RegionOf(const CopySpan& span);
  absl::StatusOr<uint64_t> EnqueueCopies(absl::Span<const CopySpan> spans);
  // Hands the unsubmitted copies to their streams.
  absl::Status Submit();
  // Submits, then records the staged events of the regions read.
  absl::Status RecordStaged();
  // Submits, then fences every stream with copies since its last fence.
  absl::Status FenceAll();
  // Waits for `fence` at most `timeout`, failing early once the trainer is
  // gone (unless `ignore_peer`).
  absl::Status AwaitFence(GpuFence& fence, absl::Duration timeout, bool ignore_peer);
  // Unavailable once the trainer exited.
  absl::Status TrainerAlive() const;
  // Hands everything the copies may still touch to AbandonedCopies.
  void Abandon();

  MemorySource* const host_;
  GpuRegions* const regions_;
  const int trainer_pidfd_;
  const pid_t trainer_pid_;
  StagedRecords* const staged_;
  uint64_t tickets_ = 0;
  std::map<int, DeviceQueue> devices_;
  std::vector<std::shared_ptr<const GpuRegion>> held_;  // regions read
  std::unordered_set<const GpuRegion*> held_set_;       // ... by address
  // The region the last lookup found (one of held_), and GpuRegions'
  // releases() before that lookup: while that is unchanged the region is
  // still live, and a span inside it needs no lookup.
  const GpuRegion* last_found_ = nullptr;
  uint64_t last_found_releases_ = 0;
  std::vector<Pending> pending_;  // in ticket order
  uint64_t unsubmitted_bytes_ = 0;
  uint64_t last_gpu_ticket_ = 0;  // the last ticket with GPU copies
  uint64_t fenced_through_ = 0;   // GPU copies of tickets <= this are fenced
  bool failed_ = false;   // something went wrong: the end needs a Drain
  bool drained_ = false;  // Drain made sure nothing runs any more
  bool drain_failed_ = false;  // Drain could not: do not wait again
  std::vector<StagingLease> kept_buffers_;  // KeepUntilCopiesEnd's
  // Their claims on the session's share: they go with the buffers.
  std::vector<PoolShare::Claim> kept_claims_;
  // When the first wait on a ready event was enqueued: the trainer's
  // stream should reach it within the copy timeout of then.
  absl::Time first_wait_ = absl::InfiniteFuture();
  // The staged records enqueued on the streams (event, number): if the
  // copies are abandoned, a device that failed never reaches them.
  std::vector<std::pair<std::shared_ptr<GpuEvent>, uint64_t>> recorded_staged_;
};

}  // namespace ckpt

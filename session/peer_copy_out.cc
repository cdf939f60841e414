#include "session/peer_copy_out.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "session/abandoned_copies.h"
#include "session/peer_process.h"

namespace ckpt {
namespace {

// How often a wait checks that the trainer still runs.
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(50);
// Copies are handed to the stream in batches of about this many bytes:
// one batched call (and, only when someone waits, one fence) per batch
// instead of per staging window keeps the enqueue of a save, which the
// trainer's CPU waits for, at about a millisecond.
constexpr uint64_t kSubmitBytes = 64ull << 20;
// How long Drain waits for the copies (at most the copy timeout): long
// enough for copies already running, or queued behind a stream about to
// get to the ready event, or released by completing a dead trainer's ready
// events. Copies that take longer are handed to AbandonedCopies, which
// keeps their memory until they end, so that the I/O worker running Drain
// is not held as long as the trainer's stream is (a hung step: the copy
// timeout, minutes, once more).
constexpr absl::Duration kDrainWait = absl::Seconds(1);

}  // namespace

PeerCopyOut::~PeerCopyOut() {
  // Every copy completed and was waited for: nothing can still run.
  if (!failed_ && pending_.empty() && fenced_through_ >= last_gpu_ticket_) return;
  // The caller drains before it lets its buffers go after an error; this
  // keeps the streams' work from outliving the regions it reads.
  if (!drained_ && !drain_failed_) {
    absl::Status s = Drain();
    if (!s.ok()) LogError("GPU copies abandoned unfinished: ", s.ToString());
  }
  if (!drained_) Abandon();
}

absl::Status PeerCopyOut::TrainerAlive() const {
  return PidfdAlive(trainer_pidfd_, trainer_pid_);
}

void PeerCopyOut::KeepUntilCopiesEnd(std::vector<StagingLease> buffers) {
  // After a Drain that succeeded nothing writes them any more.
  if (drained_) return;
  // Claimed here, before the writer drops its windows' claims: the
  // session's share counts them until their copies end.
  if (regions_->pool_share() != nullptr && !buffers.empty()) {
    kept_claims_.push_back(PoolShare::Force(regions_->pool_share(), buffers.size()));
  }
  for (StagingLease& buffer : buffers) kept_buffers_.push_back(std::move(buffer));
}

absl::StatusOr<PoolShare::Claim> PeerCopyOut::ClaimBuffer(bool may_wait) {
  // A session of host memory only: its copies end when enqueued.
  if (regions_->pool_share() == nullptr ||
      (devices_.empty() && regions_->live_regions() == 0)) {
    return PoolShare::Claim();
  }
  return PoolShare::Take(regions_->pool_share(),
                         may_wait ? regions_->copy_timeout() : absl::ZeroDuration());
}

void PeerCopyOut::Abandon() {
  AbandonedCopies::Batch batch;
  batch.what = absl::StrCat("a save of trainer pid ", trainer_pid_);
  batch.trainer_pid = trainer_pid_;
  // The session, and its pidfd, may end before the copies do.
  batch.trainer_pidfd = UniqueFd(::fcntl(trainer_pidfd_, F_DUPFD_CLOEXEC, 0));
  if (!batch.trainer_pidfd.valid()) {
    LogError(batch.what, ": ", ErrnoToStatus(errno, "dup the trainer's pidfd").ToString(),
             " (its exit will not be noticed)");
  }
  for (auto& [device, q] : devices_) {
    batch.streams.push_back(std::move(q.stream));
    batch.ready_waits.insert(batch.ready_waits.end(), q.waited.begin(), q.waited.end());
  }
  if (first_wait_ != absl::InfiniteFuture()) {
    batch.ready_deadline = first_wait_ + regions_->copy_timeout();
  }
  devices_.clear();
  batch.regions = std::move(held_);
  batch.buffers = std::move(kept_buffers_);
  batch.claims = std::move(kept_claims_);
  GpuBackend* backend = regions_->backend();
  if (backend == nullptr) {  // no device, so no copy ran: cannot happen
    for (StagingLease& buffer : batch.buffers) buffer.Withhold();
    QuarantineRegions(std::move(batch.regions));
    return;
  }
  // Most often a failed device (its streams run nothing more, so a
  // trainer's stream waiting for these records would wait for the daemon's
  // restart): completed from the CPU if so, forgotten once reached if not.
  for (auto& [event, number] : recorded_staged_) {
    backend->staged_completer().CompleteIfDeviceFails(std::move(event), number);
  }
  recorded_staged_.clear();
  backend->abandoned().Adopt(std::move(batch));
}

absl::StatusOr<PeerCopyOut::DeviceQueue*> PeerCopyOut::Queue(int device) {
  auto it = devices_.find(device);
  if (it != devices_.end()) return &it->second;
  // Only a queue with a stream enters the map: every other method may use
  // the stream of any queue there.
  ASSIGN_OR_RETURN(std::unique_ptr<GpuStream> stream,
                   regions_->device()->CreateStream(device));
  DeviceQueue& q = devices_[device];
  q.stream = std::move(stream);
  return &q;
}

absl::StatusOr<uint64_t> PeerCopyOut::Enqueue(absl::Span<const CopySpan> spans) {
  absl::StatusOr<uint64_t> ticket = EnqueueCopies(spans);
  if (!ticket.ok()) failed_ = true;
  return ticket;
}

absl::StatusOr<const GpuRegion*> PeerCopyOut::RegionOf(const CopySpan& span) {
  // Read before the lookup: a release after it shows as a change.
  const uint64_t releases = regions_->releases();
  if (last_found_ != nullptr && releases == last_found_releases_ &&
      last_found_->Holds(span.remote, span.length)) {
    return last_found_;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const GpuRegion> region,
                   regions_->Find(span.remote, span.length));
  if (region == nullptr) return nullptr;
  last_found_ = region.get();
  last_found_releases_ = releases;
  // A set, not a search of held_: a save of 1,000 tensors each in a region
  // of its own (ckptd.torch registers every tensor's storage) would
  // otherwise compare half a million pointers.
  if (held_set_.insert(region.get()).second) held_.push_back(std::move(region));
  return last_found_;
}

absl::StatusOr<uint64_t> PeerCopyOut::EnqueueCopies(absl::Span<const CopySpan> spans) {
  std::vector<CopySpan> host;
  const uint64_t ticket = ++tickets_;
  for (const CopySpan& s : spans) {
    ASSIGN_OR_RETURN(const GpuRegion* region, RegionOf(s));
    if (region == nullptr) {
      host.push_back(s);
      continue;
    }
    ASSIGN_OR_RETURN(DeviceQueue * q, Queue(region->device));
    // Every copy from a region waits for the trainer's last write, and its
    // staged event is recorded after the batch's last copy. A region that
    // was q->last_region has both already.
    if (region != q->last_region) {
      GpuEvent* ready = region->ready.get();
      if (std::none_of(q->waited.begin(), q->waited.end(),
                       [ready](const AbandonedCopies::ReadyWait& w) { return w.event == ready; })) {
        ASSIGN_OR_RETURN(const uint64_t record, q->stream->WaitEvent(*ready));
        q->waited.push_back({ready, record});
        if (first_wait_ == absl::InfiniteFuture()) first_wait_ = absl::Now();
      }
      q->staged.emplace(region->staged.get(), region->staged);
    }
    const GpuCopy copy{region->Translate(s.remote), s.local, s.length};
    GpuCopy* last = q->unsubmitted.empty() ? nullptr : &q->unsubmitted.back();
    // Adjacent tensors of one allocation going to one staging buffer are
    // one copy. Never across allocations (two mappings may lie back to back
    // in this process) or buffers (they may lie in different pinned
    // registrations): a copy must stay inside one of each.
    if (last != nullptr && q->last_region == region && q->last_ticket == ticket &&
        last->device + last->length == copy.device &&
        last->host + last->length == copy.host) {
      last->length += copy.length;
    } else {
      q->unsubmitted.push_back(copy);
      q->last_region = region;
      q->last_ticket = ticket;
    }
    unsubmitted_bytes_ += s.length;
    last_gpu_ticket_ = ticket;
  }
  if (unsubmitted_bytes_ >= kSubmitBytes) RETURN_IF_ERROR(Submit());
  if (!host.empty()) RETURN_IF_ERROR(host_->Read(host));
  return ticket;
}

absl::Status PeerCopyOut::Submit() {
  for (auto& [device, q] : devices_) {
    if (q.unsubmitted.empty()) continue;
    RETURN_IF_ERROR(q.stream->CopyToHost(q.unsubmitted));
    q.unsubmitted.clear();
    q.unfenced = true;
  }
  unsubmitted_bytes_ = 0;
  return absl::OkStatus();
}

absl::Status PeerCopyOut::FenceAll() {
  RETURN_IF_ERROR(Submit());
  Pending pending{tickets_, {}};
  for (auto& [device, q] : devices_) {
    if (!q.unfenced) continue;
    ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> fence, q.stream->Fence());
    pending.fences.push_back(std::move(fence));
    q.unfenced = false;
  }
  if (!pending.fences.empty()) pending_.push_back(std::move(pending));
  fenced_through_ = tickets_;
  return absl::OkStatus();
}

absl::StatusOr<bool> PeerCopyOut::Ready(uint64_t ticket) {
  // Copies not yet fenced are not known to be done; asking would cost a
  // fence per window, so they count as not ready until someone waits.
  if (std::min(ticket, last_gpu_ticket_) > fenced_through_) return false;
  while (!pending_.empty()) {
    for (auto& fence : pending_.front().fences) {
      absl::StatusOr<bool> ready = fence->Ready();
      if (!ready.ok()) failed_ = true;
      if (!ready.ok() || !*ready) return ready;
    }
    const uint64_t covered = pending_.front().ticket;
    pending_.erase(pending_.begin());
    if (covered >= ticket) break;
  }
  return true;
}

absl::Status PeerCopyOut::AwaitFence(GpuFence& fence, absl::Duration timeout,
                                     bool ignore_peer) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    absl::Status s = fence.Wait(std::min(left, kLivenessInterval));
    if (!absl::IsDeadlineExceeded(s)) return s;
    if (left <= kLivenessInterval) {
      return absl::DeadlineExceededError(absl::StrCat(
          "GPU copies did not complete within ", absl::FormatDuration(timeout),
          " (the trainer's stream never reached the save's ready event?)"));
    }
    if (!ignore_peer) {
      absl::Status alive = TrainerAlive();
      if (!alive.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "the trainer exited before its GPU copies completed: ", alive.message()));
      }
    }
  }
}

absl::Status PeerCopyOut::Wait(uint64_t ticket) {
  if (std::min(ticket, last_gpu_ticket_) > fenced_through_) {
    absl::Status fenced = FenceAll();
    if (!fenced.ok()) {
      failed_ = true;
      return fenced;
    }
  }
  while (!pending_.empty()) {
    for (auto& fence : pending_.front().fences) {
      absl::Status s =
          AwaitFence(*fence, regions_->copy_timeout(), /*ignore_peer=*/false);
      if (!s.ok()) {
        failed_ = true;
        return Annotate(s, "waiting for copies from GPU memory");
      }
    }
    const uint64_t covered = pending_.front().ticket;
    pending_.erase(pending_.begin());
    if (covered >= ticket) break;
  }
  return absl::OkStatus();
}

absl::Status PeerCopyOut::AllEnqueued() {
  absl::Status status = RecordStaged();
  // The save's other records (devices it read nothing from, a record not
  // enqueued) complete in order from the CPU.
  if (staged_ != nullptr) staged_->CompleteRest();
  return status;
}

absl::Status PeerCopyOut::RecordStaged() {
  RETURN_IF_ERROR(Submit());
  for (auto& [device, q] : devices_) {
    for (const auto& [event, staged] : q.staged) {
      // The number reserved when the save was accepted, for which the
      // trainer's stream may wait already; a new one for an event the save
      // reserved none of (its first region came after the call).
      const std::optional<uint64_t> reserved =
          staged_ == nullptr ? std::nullopt : staged_->Take(event);
      const uint64_t number = reserved.has_value() ? *reserved : staged->ReserveRecord();
      const absl::Status recorded = q.stream->RecordReserved(*staged, number);
      if (!recorded.ok()) {
        // Never left unreached: a later record, made in order after this
        // one, would wait for it for good.
        if (reserved.has_value()) {
          staged_->Untake(event);  // AllEnqueued completes it
        } else {
          regions_->backend()->staged_completer().Complete(staged, number);
        }
      }
      RETURN_IF_ERROR(
          Annotate(recorded, absl::StrCat("record staged event on device ", device)));
      recorded_staged_.emplace_back(staged, number);
      // The record uses the event page: the batch ends only after it ran.
      q.unfenced = true;
      last_gpu_ticket_ = tickets_;
      fenced_through_ = std::min(fenced_through_, tickets_ - 1);
    }
  }
  return absl::OkStatus();
}

absl::Status PeerCopyOut::Drain() {
  failed_ = true;
  // Copies never submitted never run.
  for (auto& [device, q] : devices_) q.unsubmitted.clear();
  unsubmitted_bytes_ = 0;
  if (devices_.empty()) {
    drained_ = true;
    return absl::OkStatus();
  }
  // A trainer that exited will never complete its ready events: complete
  // them here, up to the records our waits cover (never what its page says
  // now: it may have rewound `recorded` before it exited), which ends the
  // waits. One that lives will, so its copies are waited for as they are,
  // until it exits too or the copy timeout passes (AbandonedCopies).
  auto complete_ready_events = [&]() -> absl::Status {
    for (auto& [device, q] : devices_) {
      for (const AbandonedCopies::ReadyWait& wait : q.waited) {
        RETURN_IF_ERROR(Annotate(wait.event->CompleteThrough(wait.record),
                                 "complete a dead trainer's ready event"));
      }
    }
    return absl::OkStatus();
  };
  bool trainer_gone = !TrainerAlive().ok();
  if (trainer_gone) RETURN_IF_ERROR(complete_ready_events());
  // Everything each stream was given, including work of an Enqueue that
  // failed half-way and left no fence.
  for (auto& [device, q] : devices_) {
    ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> fence, q.stream->Fence());
    absl::Status s = absl::OkStatus();
    if (!trainer_gone) {
      s = AwaitFence(*fence, std::min(regions_->copy_timeout(), kDrainWait),
                     /*ignore_peer=*/false);
      if (absl::IsUnavailable(s)) {  // the trainer exited meanwhile
        trainer_gone = true;
        RETURN_IF_ERROR(complete_ready_events());
      }
    }
    if (trainer_gone) s = AwaitFence(*fence, kDrainWait, /*ignore_peer=*/true);
    if (!s.ok()) {
      drain_failed_ = true;
      return Annotate(s, absl::StrCat("draining the copies of device ", device));
    }
  }
  pending_.clear();
  drained_ = true;
  return absl::OkStatus();
}

}  // namespace ckpt

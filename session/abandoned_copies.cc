#include "session/abandoned_copies.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "session/peer_process.h"

namespace ckpt {

AbandonedCopies::~AbandonedCopies() {
  std::thread thread;
  std::vector<Watched> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
  {
    absl::MutexLock lock(&mu_);
    left = std::move(watched_);
  }
  for (Watched& w : left) {
    LogError(w.batch.what, ": the daemon stops before these copies ended");
    KeepForGood(std::move(w));
  }
}

void AbandonedCopies::Adopt(Batch batch) {
  Watched w{.batch = std::move(batch),
            .fences = {},
            .adopted = absl::Now(),
            .trainer_exited = absl::InfiniteFuture(),
            .ready_completed = false};
  // Everything the batch enqueued is before these fences.
  for (auto& stream : w.batch.streams) {
    absl::StatusOr<std::unique_ptr<GpuFence>> fence = stream->Fence();
    if (!fence.ok()) {
      LogError(w.batch.what, ": cannot tell when its GPU copies end (",
               fence.status().ToString(), ")");
      KeepForGood(std::move(w));
      absl::MutexLock lock(&mu_);
      ++kept_for_good_;
      return;
    }
    w.fences.push_back(*std::move(fence));
  }
  LogWarning(w.batch.what, ": its GPU copies have not ended; keeping ",
             w.batch.buffers.size(), " staging buffers and ", w.batch.regions.size(),
             " GPU regions until they do (the trainer's stream reaches the "
             "save's ready event, the trainer exits, or the copy timeout passes)");
  absl::MutexLock lock(&mu_);
  watched_.push_back(std::move(w));
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Run(); });
}

size_t AbandonedCopies::pending() const {
  absl::MutexLock lock(&mu_);
  return watched_.size();
}

size_t AbandonedCopies::kept_for_good() const {
  absl::MutexLock lock(&mu_);
  return kept_for_good_;
}

void AbandonedCopies::Run() {
  for (;;) {
    std::vector<Watched> ended;
    std::vector<Watched> kept;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), poll_);
      if (stopping_) return;
      for (size_t i = 0; i < watched_.size();) {
        const Outcome outcome = Look(watched_[i]);
        if (outcome == Outcome::kRunning) {
          ++i;
          continue;
        }
        (outcome == Outcome::kEnded ? ended : kept).push_back(std::move(watched_[i]));
        watched_.erase(watched_.begin() + static_cast<ptrdiff_t>(i));
      }
    }
    // Outside the lock: releasing mappings and destroying streams are
    // driver calls. `ended` lets everything go as it is destroyed.
    for (Watched& w : kept) KeepForGood(std::move(w));
    if (!kept.empty()) {
      // Counted once kept, so that a count seen means its buffers are out
      // of the pool already.
      absl::MutexLock lock(&mu_);
      kept_for_good_ += kept.size();
    }
  }
}

AbandonedCopies::Outcome AbandonedCopies::Look(Watched& w) {
  bool all_reached = true;
  for (auto& fence : w.fences) {
    absl::StatusOr<bool> reached = fence->Ready();
    if (!reached.ok()) {
      LogError(w.batch.what, ": its GPU copies failed (", reached.status().ToString(),
               "): whether they can still run is not known");
      return Outcome::kKeepForGood;
    }
    all_reached = all_reached && *reached;
  }
  const absl::Time now = absl::Now();
  if (all_reached) {
    LogInfo(w.batch.what, ": its GPU copies ended ",
            absl::FormatDuration(absl::Trunc(now - w.adopted, absl::Milliseconds(1))),
            " after the save gave up on them; ", w.batch.buffers.size(),
            " staging buffers go back to the pool and ", w.batch.regions.size(),
            " GPU regions are let go");
    return Outcome::kEnded;
  }
  if (w.trainer_exited == absl::InfiniteFuture() && w.batch.trainer_pidfd.valid()) {
    const absl::Status alive = PidfdAlive(w.batch.trainer_pidfd.get(), w.batch.trainer_pid);
    if (absl::IsUnavailable(alive)) {
      w.trainer_exited = now;
    } else if (!alive.ok()) {
      LogWarning(w.batch.what, ": ", alive.ToString());
    }
  }
  const bool exited = w.trainer_exited != absl::InfiniteFuture();
  if (!exited && now < w.batch.ready_deadline) return Outcome::kRunning;
  // Nothing will ever reach the dead trainer's records, or the live
  // trainer's save is lost already: reach them here. Again at every look:
  // a live trainer's stream that reaches an earlier record of its own
  // writes `completed` back below ours (a plain write on CUDA), and a wait
  // that had not yet seen ours would wait for the trainer once more.
  const char* why = exited ? "the trainer exited"
                           : "the trainer's stream did not reach the save's ready event "
                             "within the copy timeout";
  if (!CompleteReadyWaits(w, why, /*log=*/!w.ready_completed)) return Outcome::kKeepForGood;
  w.ready_completed = true;
  // A live trainer's copies are watched as long as it lives: they hold at
  // most its session's share of the pool (session/pool_share.h).
  if (exited && now - w.trainer_exited > grace_) {
    LogError(w.batch.what, ": its GPU copies did not end within ",
             absl::FormatDuration(grace_), " of the trainer's exit");
    return Outcome::kKeepForGood;
  }
  return Outcome::kRunning;
}

bool AbandonedCopies::CompleteReadyWaits(Watched& w, absl::string_view why, bool log) {
  for (const ReadyWait& wait : w.batch.ready_waits) {
    const absl::Status completed = wait.event->CompleteThrough(wait.record);
    if (!completed.ok()) {
      LogError(w.batch.what, ": ", why, ", and its ready event could not be completed (",
               completed.ToString(), ")");
      return false;
    }
  }
  if (log) {
    LogInfo(w.batch.what, ": ", why, "; its ready events are completed up to the records "
            "the copies wait for, so the copies queued behind them run now");
  }
  return true;
}

void AbandonedCopies::KeepForGood(Watched w) {
  for (StagingLease& buffer : w.batch.buffers) buffer.Withhold();
  QuarantineRegions(std::move(w.batch.regions));
  // The streams may go: destroying one leaves its work to run (CUDA) or
  // drops it (the simulated device), and the regions and buffers that work
  // may touch stay out of use either way.
}

}  // namespace ckpt

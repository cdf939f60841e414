#include "save/save_progress_board.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/save_phase.h"

namespace ckpt {
namespace {

constexpr auto kProgressInterval = std::chrono::milliseconds(200);
constexpr auto kKeepEndedParts = std::chrono::minutes(10);
constexpr size_t kMaxEndedParts = 4096;

// A part's phase went from `before` to `after`: its latency from
// acceptance, its outcome, saves in flight.
void CountPhaseChange(v1::Phase before, v1::Phase after,
                      std::chrono::steady_clock::time_point accepted_at) {
  DaemonMetrics& m = DaemonMetrics::Get();
  switch (after) {
    case v1::PHASE_STAGED:
      m.save_staged_seconds.Observe(SecondsSince(accepted_at));
      break;
    case v1::PHASE_DURABLE:
      m.save_durable_seconds.Observe(SecondsSince(accepted_at));
      break;
    case v1::PHASE_COMMITTED:
      m.save_committed_seconds.Observe(SecondsSince(accepted_at));
      m.saves_committed.Add();
      break;
    case v1::PHASE_FAILED:
      m.saves_failed.Add();
      break;
    case v1::PHASE_CANCELLED:
      m.saves_cancelled.Add();
      break;
    default:
      break;
  }
  if (!IsFinalPhase(before) && IsFinalPhase(after)) m.saves_in_flight.Add(-1);
}

// The part entered `progress.phase()`: one line naming it and its trainer.
void LogPhase(const v1::SaveProgress& progress, uint64_t session_id, pid_t pid,
              std::chrono::steady_clock::time_point accepted_at) {
  LogFields fields;
  fields.Job(progress.job())
      .Checkpoint(progress.checkpoint())
      .Session(session_id)
      .Rank(progress.rank())
      .Pid(pid)
      .Set("save", progress.save_id());
  const v1::Phase phase = progress.phase();
  if (phase == v1::PHASE_ACCEPTED) {
    fields.Set("bytes", progress.total_bytes())
        .Set("world_size", progress.world_size());
  } else {
    fields.Set("elapsed_ms",
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - accepted_at)
                   .count());
  }
  // "PHASE_STAGED" -> "staged"
  const std::string lower = absl::AsciiStrToLower(v1::Phase_Name(phase));
  const absl::string_view name = absl::StripPrefix(lower, "phase_");
  if (phase == v1::PHASE_FAILED || phase == v1::PHASE_CANCELLED) {
    LogWarning(fields.Set("reason", progress.reason()), name);
  } else {
    LogInfo(fields, name);
  }
}

}  // namespace

void SaveProgressBoard::ListenerCalls::Run() {
  for (Call& call : std::exchange(calls_, {})) {
    for (Listener& listener : call.listeners)
      listener(call.progress, call.version);
  }
}

void SaveProgressBoard::Add(uint64_t session_id, pid_t pid,
                            const v1::SaveProgress& progress,
                            ListenerCalls* out) {
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[progress.save_id()];
  entry.session_id = session_id;
  entry.pid = pid;
  entry.progress = progress;
  entry.accepted_at = std::chrono::steady_clock::now();
  LogPhase(entry.progress, session_id, pid, entry.accepted_at);
  DaemonMetrics::Get().saves_in_flight.Add(1);
  PublishLocked(entry, /*force=*/true, out);
  PruneLocked();
}

void SaveProgressBoard::Update(
    uint64_t save_id, bool force,
    absl::FunctionRef<void(v1::SaveProgress&)> change, ListenerCalls* out) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(save_id);
  if (it == entries_.end()) return;
  const v1::Phase before = it->second.progress.phase();
  change(it->second.progress);
  if (const Entry& entry = it->second; entry.progress.phase() != before) {
    CountPhaseChange(before, entry.progress.phase(), entry.accepted_at);
    LogPhase(entry.progress, entry.session_id, entry.pid, entry.accepted_at);
  }
  PublishLocked(it->second, force, out);
}

void SaveProgressBoard::PublishLocked(Entry& entry, bool force,
                                      ListenerCalls* out) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - entry.last_publish < kProgressInterval) return;
  entry.last_publish = now;
  ++entry.version;
  if (entry.listeners.empty()) return;
  out->calls_.push_back(
      {std::exchange(entry.listeners, {}), entry.progress, entry.version});
}

absl::Status SaveProgressBoard::WatchNext(uint64_t session_id, uint64_t save_id,
                                          uint64_t after, Listener listener) {
  v1::SaveProgress now;
  uint64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(save_id);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("no save with id ", save_id));
    }
    Entry& entry = it->second;
    if (entry.session_id != session_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("save ", save_id, " belongs to another session"));
    }
    if (entry.version <= after) {
      entry.listeners.push_back(std::move(listener));
      return absl::OkStatus();
    }
    now = entry.progress;
    version = entry.version;
  }
  listener(now, version);
  return absl::OkStatus();
}

bool SaveProgressBoard::Owns(uint64_t session_id, uint64_t save_id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(save_id);
  return it != entries_.end() && it->second.session_id == session_id;
}

std::vector<v1::SaveProgress> SaveProgressBoard::InFlight() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::SaveProgress> out;
  for (const auto& [id, entry] : entries_) {
    if (!IsFinalPhase(entry.progress.phase())) out.push_back(entry.progress);
  }
  return out;
}

void SaveProgressBoard::PruneLocked() {
  size_t ended = 0;
  for (const auto& [id, entry] : entries_)
    ended += IsFinalPhase(entry.progress.phase());
  const int64_t cutoff = absl::ToUnixMicros(absl::Now()) -
                         std::chrono::microseconds(kKeepEndedParts).count();
  for (auto it = entries_.begin(); it != entries_.end();) {
    const v1::SaveProgress& progress = it->second.progress;
    const bool old = progress.accepted_unix_micros() < cutoff;
    // A part whose remote phase runs keeps its watchers waiting for the
    // outcome; the remote tier ends that phase within its upload timeout.
    if (IsFinalPhase(progress.phase()) && !RemotePhasePending(progress) &&
        (old || ended > kMaxEndedParts)) {
      it = entries_.erase(it);
      --ended;
    } else {
      ++it;
    }
  }
}

}  // namespace ckpt

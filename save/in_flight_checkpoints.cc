#include "save/in_flight_checkpoints.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// Ascending `ranks` as runs ("0, 2-5, 9"). A reason goes to every waiter of
// the checkpoint in each progress message, so a long list is cut after
// kMaxRuns runs.
std::string RankRuns(const std::vector<uint32_t>& ranks) {
  constexpr size_t kMaxRuns = 16;
  std::vector<std::string> runs;
  size_t i = 0;
  while (i < ranks.size() && runs.size() < kMaxRuns) {
    size_t last = i;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) {
      ++last;
    }
    runs.push_back(last == i ? absl::StrCat(ranks[i])
                             : absl::StrCat(ranks[i], "-", ranks[last]));
    i = last + 1;
  }
  std::string text = absl::StrJoin(runs, ", ");
  if (i < ranks.size()) absl::StrAppend(&text, " and ", ranks.size() - i, " more");
  return text;
}

}  // namespace

std::string MissingLocalRanks(uint32_t world_size, uint32_t local_ranks,
                              uint32_t node_id, std::vector<RankSeen> seen) {
  // One entry per rank, a submitted one first (a rank may also have a
  // second session open).
  std::sort(seen.begin(), seen.end(), [](const RankSeen& a, const RankSeen& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.submitted > b.submitted;
  });
  seen.erase(std::unique(seen.begin(), seen.end(),
                         [](const RankSeen& a, const RankSeen& b) {
                           return a.rank == b.rank;
                         }),
             seen.end());
  std::vector<uint32_t> connected;  // ascending
  for (const RankSeen& r : seen) {
    if (!r.submitted) connected.push_back(r.rank);
  }
  const uint64_t never =
      local_ranks - std::min<uint64_t>(seen.size(), local_ranks);
  std::vector<std::string> pieces;
  if (never > 0) {
    const bool all_local =
        !seen.empty() && std::all_of(seen.begin(), seen.end(), [](const RankSeen& r) {
          return r.local_rank.has_value();
        });
    // The global ranks this node runs: all of them when the whole job is
    // here, else torchrun's block for this node if the ranks seen fit it
    // (they are certainly this node's: a session names its node).
    const uint64_t first =
        local_ranks == world_size ? 0 : uint64_t{node_id} * local_ranks;
    const uint64_t end = first + local_ranks;
    const bool block_fits =
        end <= world_size &&
        std::all_of(seen.begin(), seen.end(), [&](const RankSeen& r) {
          return r.rank >= first && r.rank < end;
        });
    const std::string block =
        local_ranks == world_size
            ? ""
            : absl::StrCat("; node ", node_id, "'s block ", first, "-", end - 1,
                           " in torchrun's numbering");
    std::vector<uint32_t> names;
    if (all_local) {
      std::vector<bool> present(local_ranks, false);
      for (const RankSeen& r : seen) {
        if (*r.local_rank < local_ranks) present[*r.local_rank] = true;
      }
      for (uint32_t l = 0; l < local_ranks; ++l) {
        if (!present[l]) names.push_back(l);
      }
      pieces.push_back(absl::StrCat(names.size() == 1 ? "local rank " : "local ranks ",
                                    RankRuns(names), " of node ", node_id,
                                    " (never connected)"));
    } else if (block_fits) {
      for (uint64_t r = first; r < end; ++r) {
        const auto at = std::lower_bound(
            seen.begin(), seen.end(), r,
            [](const RankSeen& s, uint64_t rank) { return s.rank < rank; });
        if (at == seen.end() || at->rank != r) names.push_back(static_cast<uint32_t>(r));
      }
      pieces.push_back(absl::StrCat(names.size() == 1 ? "rank " : "ranks ",
                                    RankRuns(names), " (never connected", block,
                                    ")"));
    } else {
      pieces.push_back(absl::StrCat(
          never, never == 1 ? " rank" : " ranks",
          " this node cannot name (never connected; the ranks seen are not "
          "node ",
          node_id, "'s block ", first, "-", end - 1,
          " of torchrun's numbering, and not every rank gave its local rank)"));
    }
  }
  if (!connected.empty()) {
    pieces.push_back(absl::StrCat(connected.size() == 1 ? "rank " : "ranks ",
                                  RankRuns(connected), " (connected)"));
  }
  return absl::StrJoin(pieces, " and ");
}

uint64_t InFlightCheckpoints::commits_retired() const {
  absl::MutexLock lock(&mu_);
  return commits_retired_;
}

absl::StatusOr<std::shared_ptr<SavePart>> InFlightCheckpoints::Add(
    NewPart&& request, bool committed, uint64_t commits_retired,
    ListenerCalls* out) {
  const Session& session = *request.session;
  const std::string key = absl::StrCat(request.job, "/", request.name);
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (request.join_only) {
      return absl::UnavailableError(absl::StrCat(
          "ckptd is stopping: it accepts no new checkpoint (", key,
          "), only the parts of those in flight"));
    }
    if (committed) {
      return absl::AlreadyExistsError(absl::StrCat(
          "checkpoint ", key, " is already committed; choose a new name"));
    }
    // The caller looked for COMMIT without the lock; an attempt that
    // committed since then may have had this name.
    if (commits_retired != commits_retired_) {
      return absl::AbortedError(absl::StrCat("a checkpoint committed while ",
                                             key, " was checked; check again"));
    }
    Entry entry;
    entry.checkpoint = std::make_shared<CheckpointAttempt>(
        request.job, request.name, session.world_size(),
        session.local_world_size());
    entry.started_at = std::chrono::steady_clock::now();
    it = entries_.emplace(key, std::move(entry)).first;
  } else {
    const Entry& entry = it->second;
    const CheckpointAttempt& cp = *entry.checkpoint;
    if (entry.removing_files) {
      return absl::UnavailableError(absl::StrCat(
          "checkpoint ", key, " is removing the files of its ended attempt (",
          entry.reason, "); try again"));
    }
    if (entry.final_phase != v1::PHASE_UNSPECIFIED) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", key, " already ended: ", entry.reason));
    }
    if (cp.world_size != session.world_size() ||
        cp.local_ranks != session.local_world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session world size ", session.world_size(), " (",
          session.local_world_size(), " local) differs from the ",
          cp.world_size, " (", cp.local_ranks, " local) of checkpoint ", key));
    }
    if (entry.parts.count(session.rank()) != 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", session.rank(), " already submitted its part of ", key));
    }
    if (entry.parts.size() == cp.local_ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", key, " already has all ", cp.local_ranks,
          " local ranks; rank ", session.rank(), " is one too many"));
    }
  }
  Entry& entry = it->second;
  auto part = std::make_shared<SavePart>();
  part->id = next_save_id_++;
  part->rank = session.rank();
  part->session_id = session.id();
  part->local_rank = session.local_rank();
  part->session = std::move(request.session);
  part->checkpoint = entry.checkpoint;
  part->tensors = std::move(request.tensors);
  part->byte_items = std::move(request.byte_items);
  entry.parts[part->rank] = part;
  parts_[part->id] = part;

  v1::SaveProgress progress;
  progress.set_save_id(part->id);
  progress.set_job(part->checkpoint->job);
  progress.set_checkpoint(part->checkpoint->name);
  progress.set_rank(part->rank);
  progress.set_phase(v1::PHASE_ACCEPTED);
  progress.set_world_size(part->checkpoint->world_size);
  uint64_t total = 0;
  for (const PlannedFile& f : part->tensors->plan.files)
    total += f.layout.file_size;
  progress.set_total_bytes(total);
  progress.set_accepted_unix_micros(NowMicros());
  progress.set_ranks_submitted(entry.parts.size());
  board_->Add(part->session_id, session.pid(), progress, out);
  for (const auto& [rank, other] : entry.parts) {
    if (other == part) continue;
    board_->Update(
        other->id, /*force=*/false,
        [&](v1::SaveProgress& p) { p.set_ranks_submitted(entry.parts.size()); },
        out);
  }
  return part;
}

InFlightCheckpoints::PartFinished InFlightCheckpoints::FinishPart(
    const SavePart& part, const absl::Status& status, ListenerCalls* out) {
  PartFinished result;
  absl::MutexLock lock(&mu_);
  auto it = FindLocked(*part.checkpoint);
  if (it == entries_.end())
    return result;  // cannot happen: retired after its parts
  Entry& entry = it->second;
  ++entry.finished_parts;
  // The worker (our caller) is done with the trainer's memory: the part
  // lets go of its session, so once the trainer hangs up the daemon holds
  // none of its descriptors, even while the checkpoint waits for the other
  // nodes or its commit.
  if (auto own = parts_.find(part.id); own != parts_.end()) own->second->session.reset();
  if (entry.final_phase == v1::PHASE_UNSPECIFIED) {
    if (status.ok()) {
      result.node_durable =
          ++entry.durable_parts == entry.checkpoint->local_ranks;
      if (result.node_durable) {
        for (const auto& [rank, each] : entry.parts) result.parts.push_back(each);
      }
    } else {
      // The cause; every part's line for the phase it ends in follows.
      LogWarning(LogFields()
                     .Job(entry.checkpoint->job)
                     .Checkpoint(entry.checkpoint->name)
                     .Session(part.session_id)
                     .Rank(part.rank)
                     .Set("save", part.id),
                 "part failed: ", status.ToString());
      DaemonMetrics::Get().CountError(status);  // the error that ends it
      EndLocked(
          entry,
          absl::IsCancelled(status) ? v1::PHASE_CANCELLED : v1::PHASE_FAILED,
          absl::StrCat("rank ", part.rank, ": ", status.message()), out);
    }
  }
  result.retired = MaybeRetireLocked(it);
  return result;
}

bool InFlightCheckpoints::NodeDurable(const CheckpointAttempt& checkpoint,
                                      ListenerCalls* out) {
  absl::MutexLock lock(&mu_);
  auto it = FindLocked(checkpoint);
  if (it == entries_.end()) return false;
  Entry& entry = it->second;
  entry.manifest_written = true;
  entry.durable_at = std::chrono::steady_clock::now();
  if (entry.final_phase != v1::PHASE_UNSPECIFIED) return false;
  PublishPhaseLocked(entry, v1::PHASE_DURABLE, out);
  return true;
}

std::optional<std::chrono::steady_clock::duration>
InFlightCheckpoints::WaitingForNodes(
    const CheckpointAttempt& checkpoint) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(checkpoint.key);
  if (it == entries_.end() || it->second.checkpoint.get() != &checkpoint ||
      it->second.final_phase != v1::PHASE_UNSPECIFIED) {
    return std::nullopt;
  }
  return std::chrono::steady_clock::now() - it->second.durable_at;
}

std::optional<InFlightCheckpoints::Retired> InFlightCheckpoints::Commit(
    const CheckpointAttempt& checkpoint, bool remote_follows, ListenerCalls* out) {
  absl::MutexLock lock(&mu_);
  auto it = FindLocked(checkpoint);
  if (it == entries_.end() || it->second.final_phase != v1::PHASE_UNSPECIFIED) {
    return std::nullopt;
  }
  PublishPhaseLocked(it->second, v1::PHASE_COMMITTED, out,
                     remote_follows ? v1::PHASE_REMOTE_UPLOADING : v1::PHASE_UNSPECIFIED);
  it->second.final_phase = v1::PHASE_COMMITTED;
  return MaybeRetireLocked(it);
}

std::optional<InFlightCheckpoints::Retired> InFlightCheckpoints::Fail(
    const CheckpointAttempt& checkpoint, std::string reason,
    ListenerCalls* out, bool manifest_unused) {
  absl::MutexLock lock(&mu_);
  auto it = FindLocked(checkpoint);
  if (it == entries_.end() || it->second.final_phase != v1::PHASE_UNSPECIFIED) {
    return std::nullopt;
  }
  it->second.manifest_unused = manifest_unused;
  EndLocked(it->second, v1::PHASE_FAILED, std::move(reason), out);
  return MaybeRetireLocked(it);
}

InFlightCheckpoints::RanksCheck InFlightCheckpoints::ExpireMissingRanks(
    const CheckpointAttempt& checkpoint,
    std::chrono::steady_clock::duration timeout, uint32_t node_id,
    const std::vector<RankSeen>& connected, ListenerCalls* out) {
  RanksCheck result;
  absl::MutexLock lock(&mu_);
  auto it = FindLocked(checkpoint);
  if (it == entries_.end()) return result;  // retired: nothing waits
  Entry& entry = it->second;
  if (entry.final_phase != v1::PHASE_UNSPECIFIED ||
      entry.parts.size() >= checkpoint.local_ranks) {
    return result;  // ended, or every local rank is in
  }
  if (std::chrono::steady_clock::now() - entry.started_at < timeout) {
    result.waiting = true;
    return result;
  }
  std::vector<uint32_t> submitted;  // ascending: `parts` is by rank
  std::vector<RankSeen> seen;
  DaemonMetrics::Get().CountError(absl::StatusCode::kDeadlineExceeded);
  for (const auto& [rank, part] : entry.parts) {
    submitted.push_back(rank);
    seen.push_back({.rank = rank, .local_rank = part->local_rank, .submitted = true});
  }
  for (const RankSeen& r : connected) {
    seen.push_back({.rank = r.rank, .local_rank = r.local_rank, .submitted = false});
  }
  EndLocked(
      entry, v1::PHASE_FAILED,
      absl::StrCat(
          MissingLocalRanks(checkpoint.world_size, checkpoint.local_ranks,
                            node_id, std::move(seen)),
          " did not submit within ",
          std::chrono::duration_cast<std::chrono::milliseconds>(timeout)
              .count(),
          " ms of the first part (", submitted.size(), " of ",
          checkpoint.local_ranks, " local ranks submitted: ",
          RankRuns(submitted), ")"),
      out);
  result.retired = MaybeRetireLocked(it);
  return result;
}

absl::Status InFlightCheckpoints::CheckCancellable(const Entry& entry) {
  // Compared with this node's parts, not the job's world: once they are
  // all durable, this node's manifest is being written or is out, and any
  // node that finds every manifest commits with these files.
  if (entry.durable_parts == entry.checkpoint->local_ranks) {
    return absl::FailedPreconditionError(absl::StrCat(
        entry.checkpoint->key,
        " can no longer be cancelled: every part on this node is durable and "
        "its node manifest is written, so it commits once every node is"));
  }
  return absl::OkStatus();
}

absl::StatusOr<InFlightCheckpoints::Cancelled> InFlightCheckpoints::CancelSave(
    const Session& session, uint64_t save_id, ListenerCalls* out) {
  Cancelled result;
  absl::MutexLock lock(&mu_);
  auto part = parts_.find(save_id);
  if (part == parts_.end() || part->second->session_id != session.id()) {
    // A save that already left the set ended: there is nothing to cancel.
    if (part == parts_.end() && board_->Owns(session.id(), save_id))
      return result;
    return absl::NotFoundError(
        absl::StrCat("no save with id ", save_id, " in this session"));
  }
  auto it = FindLocked(*part->second->checkpoint);
  if (it == entries_.end()) return result;
  Entry& entry = it->second;
  if (entry.final_phase != v1::PHASE_UNSPECIFIED) return result;
  RETURN_IF_ERROR(CheckCancellable(entry));
  EndLocked(entry, v1::PHASE_CANCELLED,
            absl::StrCat("cancelled by rank ", session.rank()), out);
  result.saves = entry.parts.size();
  result.retired = MaybeRetireLocked(it);
  return result;
}

absl::StatusOr<InFlightCheckpoints::Cancelled>
InFlightCheckpoints::CancelCheckpoint(absl::string_view job,
                                      absl::string_view name,
                                      ListenerCalls* out) {
  Cancelled result;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(absl::StrCat(job, "/", name));
  if (it == entries_.end() || it->second.removing_files) {
    return absl::NotFoundError(
        absl::StrCat("no save of ", job, "/", name, " is in flight"));
  }
  Entry& entry = it->second;
  if (entry.final_phase != v1::PHASE_UNSPECIFIED) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, "/", name, " already ended: ", entry.reason));
  }
  RETURN_IF_ERROR(CheckCancellable(entry));
  EndLocked(entry, v1::PHASE_CANCELLED, "cancelled by the operator", out);
  result.saves = entry.parts.size();
  result.retired = MaybeRetireLocked(it);
  return result;
}

InFlightCheckpoints::StoppedAll InFlightCheckpoints::CancelAll(
    absl::string_view reason, bool durable_too, ListenerCalls* out) {
  StoppedAll stopped;
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);  // retiring may erase `it`
    Entry& entry = it->second;
    if (entry.final_phase == v1::PHASE_UNSPECIFIED) {
      if (CheckCancellable(entry).ok()) {
        EndLocked(entry, v1::PHASE_CANCELLED, std::string(reason), out);
      } else if (durable_too && entry.manifest_written) {
        EndLocked(entry, v1::PHASE_CANCELLED,
                  absl::StrCat(reason,
                               "; this node's files are durable, so it still "
                               "commits if every other node's are"),
                  out);
      }
      if (entry.final_phase != v1::PHASE_UNSPECIFIED) {
        stopped.ended.push_back(it->first);
        if (auto r = MaybeRetireLocked(it)) stopped.retired.push_back(*std::move(r));
      }
    }
    it = next;
  }
  return stopped;
}

std::vector<InFlightCheckpoints::Retired> InFlightCheckpoints::FailOpenAttemptsLocked(
    const std::string& job, ListenerCalls* out,
    const std::function<std::optional<std::string>(Entry&)>& why) {
  std::vector<Retired> retired;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);  // retiring may erase `it`
    Entry& entry = it->second;
    if (entry.checkpoint->job == job && entry.final_phase == v1::PHASE_UNSPECIFIED) {
      if (std::optional<std::string> reason = why(entry)) {
        EndLocked(entry, v1::PHASE_FAILED, *std::move(reason), out);
        if (auto r = MaybeRetireLocked(it)) retired.push_back(*std::move(r));
      }
    }
    it = next;
  }
  return retired;
}

std::vector<InFlightCheckpoints::Retired> InFlightCheckpoints::SessionClosed(
    const Session& session, ListenerCalls* out) {
  absl::MutexLock lock(&mu_);
  return FailOpenAttemptsLocked(
      session.job(), out, [&session](Entry& entry) -> std::optional<std::string> {
        auto part = entry.parts.find(session.rank());
        if (part == entry.parts.end()) {
          return absl::StrCat("rank ", session.rank(),
                              " disconnected before submitting its part");
        }
        if (part->second->session_id == session.id()) entry.ranks_gone.insert(session.rank());
        return std::nullopt;
      });
}

std::vector<InFlightCheckpoints::Retired> InFlightCheckpoints::SessionOpened(
    const Session& session, ListenerCalls* out) {
  absl::MutexLock lock(&mu_);
  return FailOpenAttemptsLocked(
      session.job(), out, [&session](Entry& entry) -> std::optional<std::string> {
        // With every local part in, the attempt no longer waits for any
        // rank here: it may still commit, so it is left alone.
        if (!entry.ranks_gone.contains(session.rank()) ||
            entry.parts.size() >= entry.checkpoint->local_ranks) {
          return std::nullopt;
        }
        return absl::StrCat(
            "rank ", session.rank(), " of job ", session.job(),
            " started again (a new session) while this checkpoint, whose part of that rank "
            "came from a session that has ended, waited for ",
            entry.checkpoint->local_ranks - entry.parts.size(),
            " more local rank(s): the run that began it is gone, so it cannot complete");
      });
}

bool InFlightCheckpoints::Contains(absl::string_view job,
                                   absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  return entries_.contains(absl::StrCat(job, "/", name));
}

void InFlightCheckpoints::ForgetRemoved(const CheckpointAttempt& checkpoint) {
  absl::MutexLock lock(&mu_);
  auto it = FindLocked(checkpoint);
  if (it != entries_.end() && it->second.removing_files) entries_.erase(it);
}

InFlightCheckpoints::Entries::iterator InFlightCheckpoints::FindLocked(
    const CheckpointAttempt& checkpoint) {
  auto it = entries_.find(checkpoint.key);
  if (it == entries_.end() || it->second.checkpoint.get() != &checkpoint) {
    return entries_.end();
  }
  return it;
}

void InFlightCheckpoints::PublishPhaseLocked(Entry& entry, v1::Phase phase,
                                             ListenerCalls* out, v1::Phase remote_phase) {
  const int64_t now = NowMicros();
  for (const auto& [rank, part] : entry.parts) {
    board_->Update(
        part->id, /*force=*/true,
        [&](v1::SaveProgress& p) {
          p.set_phase(phase);
          if (remote_phase != v1::PHASE_UNSPECIFIED) p.set_remote_phase(remote_phase);
          if (phase == v1::PHASE_DURABLE) p.set_durable_unix_micros(now);
          if (phase == v1::PHASE_COMMITTED) p.set_committed_unix_micros(now);
        },
        out);
  }
}

void InFlightCheckpoints::EndLocked(Entry& entry, v1::Phase phase,
                                    std::string reason, ListenerCalls* out) {
  entry.final_phase = phase;
  entry.reason = std::move(reason);
  // Logged per part, with the reason, as the board publishes the phase.
  for (const auto& [rank, part] : entry.parts) {
    part->cancelled = true;
    board_->Update(
        part->id, /*force=*/true,
        [&](v1::SaveProgress& p) {
          p.set_phase(phase);
          p.set_reason(entry.reason);
        },
        out);
  }
}

std::optional<InFlightCheckpoints::Retired>
InFlightCheckpoints::MaybeRetireLocked(Entries::iterator it) {
  Entry& entry = it->second;
  if (entry.final_phase == v1::PHASE_UNSPECIFIED || entry.removing_files ||
      entry.finished_parts < entry.parts.size()) {
    return std::nullopt;
  }
  Retired retired;
  retired.checkpoint = entry.checkpoint;
  retired.phase = entry.final_phase;
  for (const auto& [rank, part] : entry.parts) {
    for (const PlannedFile& f : part->tensors->plan.files)
      retired.files.push_back(f.name);
    retired.save_ids.push_back(part->id);
    parts_.erase(part->id);
  }
  if (entry.final_phase == v1::PHASE_COMMITTED) {
    ++commits_retired_;
  } else if (entry.manifest_written && !entry.manifest_unused) {
    retired.files_action = Retired::Files::kLeaveForGc;
  } else if (entry.checkpoint->prepared.load()) {
    // Stays in the set until the files are gone, so that a new attempt of
    // the same name cannot prepare them while they are being removed.
    retired.files_action = Retired::Files::kRemove;
    entry.removing_files = true;
    entry.parts.clear();
    return retired;
  }
  entries_.erase(it);
  return retired;
}

}  // namespace ckpt

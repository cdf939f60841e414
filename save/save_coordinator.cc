#include "save/save_coordinator.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "save/node_manifest.h"
#include "save/save_plan.h"
#include "storage/commit_protocol.h"
#include "storage/garbage_collector.h"
#include "storage/tree_local_commit.h"
#include "storage/retention.h"

namespace ckpt {
namespace {

// How often a durable node looks for the COMMIT another node writes, and
// how often an attempt still waiting for local ranks checks its deadline.
constexpr absl::Duration kCommitPollInterval = absl::Milliseconds(50);

// A local-ranks timeout beyond 2^40 ms (~34 years) is no timeout at all;
// capped so that steady_clock's nanosecond arithmetic cannot overflow.
std::chrono::steady_clock::duration LocalRanksTimeout(uint64_t ms) {
  return std::chrono::milliseconds(std::min<uint64_t>(ms, uint64_t{1} << 40));
}

using ListenerCalls = SaveProgressBoard::ListenerCalls;

std::unique_ptr<LocalCommit> MakeLocalCommit(const SaveOptions& options,
                                             const CheckpointStore* store, FileOps& file_ops,
                                             RemoteTier* remote,
                                             std::shared_ptr<ObjectStore> shared_root) {
  TreeCommitOptions tree;
  tree.timeout = absl::Milliseconds(options.commit_timeout_ms);
  tree.poll_interval = MeetingPollInterval(options.nodes);
  if (options.nodes > 1 && options.node_local_root && remote != nullptr) {
    return std::make_unique<TreeLocalCommit>(store, remote->remote_store(),
                                             TreeLocalCommit::Root::kPerNode, options.node_id,
                                             tree, file_ops);
  }
  if (options.nodes > 1 && !options.node_local_root && shared_root != nullptr) {
    return std::make_unique<TreeLocalCommit>(store, std::move(shared_root),
                                             TreeLocalCommit::Root::kShared, options.node_id,
                                             tree, file_ops);
  }
  return std::make_unique<CommitProtocol>(store, file_ops);
}

// When the part's phases ended, in ms from the start of its writing: how
// much of the writing overlapped the staging (docs/OPERATIONS.md, "Logs").
void LogPartWritten(const SavePart& part, ShardWriteResult::Clock::time_point started) {
  using Clock = ShardWriteResult::Clock;
  auto ms = [&](Clock::time_point at) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(at - started).count();
  };
  Clock::time_point enqueued = started, staged = started,
                    first_write = Clock::time_point::max(), written = started,
                    synced = started;
  uint64_t bytes = 0;
  for (const ShardWriteResult& r : part.results) {
    bytes += r.file_size;
    enqueued = std::max(enqueued, r.enqueued_at);
    staged = std::max(staged, r.staged_at);
    if (r.first_write_at != Clock::time_point()) {
      first_write = std::min(first_write, r.first_write_at);
    }
    written = std::max(written, r.written_at);
    synced = std::max(synced, r.synced_at);
  }
  LogFields fields;
  // The last copy's enqueue in microseconds: with GPU memory it is what the
  // trainer's CPU waits for (the GPU-side STAGED), about a millisecond.
  const auto enqueued_us =
      std::chrono::duration_cast<std::chrono::microseconds>(enqueued - started).count();
  fields.Set("files", part.results.size()).Set("bytes", bytes);
  fields.Set("enqueued_us", enqueued_us).Set("staged_ms", ms(staged));
  if (first_write != Clock::time_point::max()) fields.Set("first_write_ms", ms(first_write));
  fields.Set("written_ms", ms(written)).Set("synced_ms", ms(synced));
  LogInfo(fields, "part written");
}

}  // namespace

SaveCoordinator::SaveCoordinator(const SaveOptions& options,
                                 const CheckpointStore* store,
                                 StagingPool* pool, IoWorkers* workers,
                                 CheckpointLeases* leases, MemoryTier* tier,
                                 FileOps& file_ops, RemoteTier* remote,
                                 std::shared_ptr<ObjectStore> shared_root)
    : options_(options),
      keep_last_(options.keep_last),
      store_(store),
      workers_(workers),
      leases_(leases),
      tier_(tier),
      remote_(remote),
      file_ops_(file_ops),
      commit_(MakeLocalCommit(options, store, file_ops, remote, std::move(shared_root))),
      writer_({.node_id = options.node_id,
               .checksum_block_bytes = options.checksum_block_bytes,
               .write_rate_limit = options.write_rate_limit},
              store, pool, tier, &board_, file_ops),
      watcher_(kCommitPollInterval),
      // As often as the nodes' meeting polls (a few nodes: 10 ms), so that
      // its steps do not wait for this watcher's tick.
      remote_commits_(std::min(kCommitPollInterval, MeetingPollInterval(options.nodes))) {}

absl::StatusOr<uint64_t> SaveCoordinator::Submit(
    const std::shared_ptr<Session>& session, const v1::SaveRequest& request,
    v1::SaveResponse* accepted) {
  if (!session->opened()) {
    return absl::FailedPreconditionError("call OpenSession before Save");
  }
  if (request.job() != session->job()) {
    return absl::InvalidArgumentError(
        absl::StrCat("save names job '", request.job(),
                     "' but the session is for job '", session->job(), "'"));
  }
  RETURN_IF_ERROR(ValidateStorageName(request.checkpoint(), "checkpoint"));
  if (request.checkpoint() == kLatestAlias) {
    return absl::InvalidArgumentError(
        "checkpoint name 'latest' is reserved for loading the newest one");
  }
  std::shared_ptr<const TensorLayout> tensors;
  if (request.layout_id() != 0) {
    if (request.tensors_size() > 0) {
      return absl::InvalidArgumentError(
          "a save names either a layout_id or tensors, not both");
    }
    ASSIGN_OR_RETURN(tensors, session->FindLayout(request.layout_id()));
  } else {
    ASSIGN_OR_RETURN(tensors, PlanTensorLayout(*session, request.tensors(),
                                               options_.max_items_per_save));
  }
  if (tensors->items.size() + request.byte_items_size() >
      options_.max_items_per_save) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "save has ", tensors->items.size() + request.byte_items_size(),
        " items; the limit is ", options_.max_items_per_save));
  }
  RETURN_IF_ERROR(ValidateByteItems(*tensors, request.byte_items()));

  InFlightCheckpoints::NewPart new_part{
      .session = session,
      .job = request.job(),
      .name = request.checkpoint(),
      .tensors = std::move(tensors),
      .byte_items = {request.byte_items().begin(), request.byte_items().end()},
      .join_only = !accepting_.load()};
  // COMMIT is looked for (one stat) outside every lock; Add refuses if an
  // attempt committed meanwhile, since it may have had this name.
  ListenerCalls calls;
  absl::StatusOr<std::shared_ptr<SavePart>> part;
  do {
    const uint64_t commits_seen = checkpoints_.commits_retired();
    const bool committed =
        store_->IsCommitted(request.job(), request.checkpoint());
    part =
        checkpoints_.Add(std::move(new_part), committed, commits_seen, &calls);
  } while (absl::IsAborted(part.status()));
  calls.Run();
  if (!part.ok()) return part.status();
  // No wait without an end: an attempt that waits for other local ranks
  // fails if they have not all submitted within the timeout. One check per
  // attempt, on the commit watcher's timer rather than a thread of its own.
  const std::shared_ptr<CheckpointAttempt>& attempt = (*part)->checkpoint;
  if (attempt->local_ranks > 1 && !attempt->ranks_deadline_armed.exchange(true)) {
    watcher_.Watch([this, attempt] { return CheckLocalRanks(attempt); });
  }
  // The last step before the worker may run it: nothing fails from here,
  // so every reserved record goes with a part that will run.
  Session::StagedReservation reserved = session->ReserveStaged(*(*part)->tensors);
  if (accepted != nullptr) {
    for (const StagedRecords::Record& r : reserved.records.records()) {
      v1::StagedRecord* out = accepted->add_staged_records();
      out->set_device_uuid(r.device_uuid);
      out->set_number(r.number);
    }
    accepted->set_stream_wait_suffices(reserved.stream_wait_suffices);
  }
  (*part)->staged = std::move(reserved.records);
  workers_->Post(
      [this, part = *part](IoQueue& queue) { RunPart(part, queue); });
  return (*part)->id;
}

void SaveCoordinator::RunPart(const std::shared_ptr<SavePart>& part,
                              IoQueue& queue) {
  LogFields fields;
  fields.Job(part->checkpoint->job)
      .Checkpoint(part->checkpoint->name)
      .Session(part->session_id)
      .Rank(part->rank)
      .Set("save", part->id);
  // The worker is the only reader of `session` until FinishPart.
  if (part->session != nullptr) fields.Pid(part->session->pid());
  const absl::Status status = [&] {
    // Only the writing: what follows may log about other parts.
    const ScopedLogFields writing(std::move(fields));
    const ShardWriteResult::Clock::time_point started = ShardWriteResult::Clock::now();
    absl::Status written = writer_.Write(*part, queue);
    if (written.ok()) LogPartWritten(*part, started);
    return written;
  }();
  // Records the part's copies did not make (it failed first, or read
  // nothing on a device) complete in order, from the CPU.
  part->staged.CompleteRest();
  ListenerCalls calls;
  InFlightCheckpoints::PartFinished finished =
      checkpoints_.FinishPart(*part, status, &calls);
  calls.Run();
  FinishRetirement(std::move(finished.retired));
  if (finished.node_durable) FinishNode(part->checkpoint, finished.parts);
}

void SaveCoordinator::FinishNode(const std::shared_ptr<CheckpointAttempt>& cp,
                                 const std::vector<std::shared_ptr<SavePart>>& parts) {
  v1::Manifest header;
  header.set_format_version(1);
  header.set_job(cp->job);
  header.set_checkpoint(cp->name);
  header.set_node_id(options_.node_id);
  header.set_nodes(options_.nodes);
  header.set_world_size(cp->world_size);
  header.set_checksum_block_bytes(options_.checksum_block_bytes);
  header.set_created_unix_micros(absl::ToUnixMicros(cp->started));
  std::vector<WrittenPart> written;
  for (const auto& part : parts) {
    written.push_back(
        {part->rank, part->tensors.get(), &part->results, &part->byte_items});
  }
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(v1::Manifest manifest, BuildNodeManifest(header, written));
    return store_->WriteNodeManifest(manifest, file_ops_);
  }();
  ListenerCalls calls;
  if (!status.ok()) {
    DaemonMetrics::Get().CountError(status);
    auto retired = checkpoints_.Fail(
        *cp, absl::StrCat("node manifest: ", status.message()), &calls);
    calls.Run();
    FinishRetirement(std::move(retired));
    return;
  }
  // The node's files are durable and its tier images whole: readable from
  // memory by any load that finds the checkpoint's COMMIT, from the moment
  // a node writes it (this one below, or another node before this one's
  // watcher polls), not only after this node has heard of the commit.
  tier_->MarkComplete(cp->job, cp->name);
  const bool in_flight = checkpoints_.NodeDurable(*cp, &calls);
  calls.Run();
  // A commit that makes remote requests never runs on this I/O worker.
  if (in_flight && commit_->remote()) {
    remote_commits_.Watch([this, cp] { return TryCommit(cp); });
  } else if (in_flight && !TryCommit(cp)) {
    watcher_.Watch([this, cp] { return TryCommit(cp); });
  }
}

bool SaveCoordinator::TryCommit(const std::shared_ptr<CheckpointAttempt>& cp) {
  const auto waited = checkpoints_.WaitingForNodes(*cp);
  if (!waited.has_value()) {  // ended: nothing left to commit
    commit_->Forget(cp->job, cp->name);
    return true;
  }
  const absl::StatusOr<bool> committed =
      commit_->TryCommit(cp->job, cp->name, options_.nodes);
  ListenerCalls calls;
  std::optional<Retired> retired;
  if (committed.ok() && *committed) {
    retired = checkpoints_.Commit(*cp, /*remote_follows=*/remote_ != nullptr, &calls);
  } else if (!committed.ok()) {
    DaemonMetrics::Get().CountError(committed.status());
    // A node that alone commits (one node) knows nobody else writes this
    // COMMIT: once a failed write is taken back (a full disk at its
    // directory's fsync leaves it in place), its files can go, so a full
    // disk is not left full of a checkpoint that can never commit. With
    // several nodes, another may be committing with this node's manifest
    // right now: its files stay for gc.
    const bool manifest_unused =
        options_.nodes == 1 && WithdrawFailedCommit(*cp);
    retired = checkpoints_.Fail(
        *cp, absl::StrCat("commit: ", committed.status().message()), &calls,
        manifest_unused);
  } else if (*waited >= std::chrono::milliseconds(options_.commit_timeout_ms)) {
    DaemonMetrics::Get().CountError(absl::StatusCode::kDeadlineExceeded);
    retired = checkpoints_.Fail(
        *cp,
        absl::StrCat("not every node finished within ", options_.commit_timeout_ms, " ms; ",
                     commit_->Waiting(cp->job, cp->name, options_.nodes)),
        &calls);
  } else {
    return false;  // the other nodes are not done yet
  }
  commit_->Forget(cp->job, cp->name);
  calls.Run();
  const bool committed_here =
      retired.has_value() && retired->phase == v1::PHASE_COMMITTED;
  std::vector<uint64_t> save_ids;
  if (committed_here) save_ids = retired->save_ids;
  FinishRetirement(std::move(retired));
  if (committed_here) AfterCommit(*cp, std::move(save_ids));
  return true;
}

bool SaveCoordinator::CheckLocalRanks(
    const std::shared_ptr<CheckpointAttempt>& cp) {
  ListenerCalls calls;
  InFlightCheckpoints::RanksCheck check = checkpoints_.ExpireMissingRanks(
      *cp, LocalRanksTimeout(options_.local_ranks_timeout_ms), options_.node_id,
      open_sessions_.Ranks(cp->job, cp->world_size), &calls);
  calls.Run();
  // The parts that did arrive are cancelled; their files go the way of
  // every failed attempt's (removed once no worker writes them), and the
  // name is free again after that.
  FinishRetirement(std::move(check.retired));
  return !check.waiting;
}

bool SaveCoordinator::WithdrawFailedCommit(const CheckpointAttempt& cp) {
  const absl::Status withdrawn = store_->WithdrawCommit(cp.job, cp.name);
  if (!withdrawn.ok()) {
    LogError(LogFields().Job(cp.job).Checkpoint(cp.name),
             "its COMMIT write failed and cannot be taken back (",
             withdrawn.ToString(), "); leaving its files to gc");
  }
  return withdrawn.ok();
}

void SaveCoordinator::AfterCommit(const CheckpointAttempt& cp,
                                  std::vector<uint64_t> save_ids) {
  // Read before the line is written: once a reader sees the line, a keep_last
  // changed since applies from the next commit on.
  const uint32_t keep_last = keep_last_.load();
  LogInfo(LogFields()
              .Job(cp.job)
              .Checkpoint(cp.name)
              .Set("world_size", cp.world_size)
              .Set("keep_last", keep_last),
          "checkpoint committed");
  // For restores into GPU memory at the copy engine's speed; before
  // retention, which reads every kept COMMIT, so that a restore right after
  // the commit seldom has to pin the images itself (MemoryTier::Find).
  tier_->Pin(cp.job, cp.name);
  // Before retention: the upload leases the checkpoint, so that its local
  // files stay until its remote commit has ended. The parts' remote phase,
  // begun with COMMITTED, ends with the upload (or now, if it cannot be
  // queued): the last step of the saves' progress.
  if (remote_ != nullptr) {
    absl::Status queued = remote_->Enqueue(cp.job, cp.name);
    if (queued.ok()) {
      watcher_.Watch([this, job = cp.job, name = cp.name, save_ids] {
        return FollowRemotePhase(job, name, save_ids);
      });
    } else {
      LogWarning(LogFields().Job(cp.job).Checkpoint(cp.name),
                 "not copied to the remote tier: ", queued.ToString());
      RemoteProgress refused;
      refused.job = cp.job;
      refused.checkpoint = cp.name;
      refused.state = RemoteState::kFailed;
      refused.error = absl::StrCat("node ", options_.node_id, ": not copied to the remote tier: ",
                                   queued.message());
      refused.queued_at = refused.ended_at = absl::Now();
      refused.started_at = absl::InfinitePast();
      EndRemotePhase(save_ids, refused);
    }
  }
  // Only now is there a newer committed checkpoint to make room for.
  auto deleted = ApplyRetention(*store_, *leases_, cp.job, keep_last);
  if (!deleted.ok()) {
    LogWarning("retention: ", deleted.status().ToString());
  } else {
    for (const std::string& name : *deleted) tier_->Drop(cp.job, name);
  }
}

bool SaveCoordinator::FollowRemotePhase(const std::string& job, const std::string& checkpoint,
                                        const std::vector<uint64_t>& save_ids) {
  std::optional<RemoteProgress> upload = remote_->Progress(job, checkpoint);
  if (upload.has_value() && upload->state != RemoteState::kCommitted &&
      upload->state != RemoteState::kFailed) {
    return false;  // queued or under way
  }
  if (!upload.has_value()) {
    // Out of the tier's bounded history before this look (more than its
    // `history` uploads ended within one watcher tick): how it ended is
    // not known here, only that it did.
    upload.emplace();
    upload->job = job;
    upload->checkpoint = checkpoint;
    upload->state = RemoteState::kFailed;
    upload->error = absl::StrCat("node ", options_.node_id, ": the upload of ", job, "/",
                                 checkpoint, " ended, but its record is gone (ckptctl list "
                                 "shows whether it is committed in the remote tier)");
    upload->queued_at = upload->ended_at = absl::Now();
    upload->started_at = absl::InfinitePast();
  }
  EndRemotePhase(save_ids, *upload);
  return true;
}

void SaveCoordinator::EndRemotePhase(const std::vector<uint64_t>& save_ids,
                                     const RemoteProgress& upload) {
  const bool committed = upload.state == RemoteState::kCommitted;
  ListenerCalls calls;
  for (uint64_t id : save_ids) {
    board_.Update(
        id, /*force=*/true,
        [&](v1::SaveProgress& p) {
          p.set_remote_phase(committed ? v1::PHASE_REMOTE_COMMITTED : v1::PHASE_REMOTE_FAILED);
          if (committed) {
            p.set_remote_committed_unix_micros(absl::ToUnixMicros(upload.ended_at));
          } else {
            p.set_remote_reason(upload.error);
          }
          FillRemoteUpload(upload, p.mutable_remote_upload());
        },
        &calls);
  }
  calls.Run();
}

std::vector<std::string> SaveCoordinator::CancelAll(absl::string_view reason) {
  ListenerCalls calls;
  // With one node, an attempt whose parts are all durable commits on its
  // worker at once; with several, one waiting for the others' manifests
  // would otherwise hold its waiters until the commit timeout.
  InFlightCheckpoints::StoppedAll stopped =
      checkpoints_.CancelAll(reason, /*durable_too=*/options_.nodes > 1, &calls);
  calls.Run();
  for (Retired& retired : stopped.retired) FinishRetirement(std::move(retired));
  return stopped.ended;
}

void SaveCoordinator::FinishRetirement(std::optional<Retired> retired) {
  if (!retired.has_value()) return;
  const CheckpointAttempt& cp = *retired->checkpoint;
  if (retired->phase != v1::PHASE_COMMITTED) tier_->Drop(cp.job, cp.name);
  switch (retired->files_action) {
    case Retired::Files::kKeep:
      return;
    case Retired::Files::kLeaveForGc:
      // A node that sees every manifest may be committing with these files
      // right now.
      LogWarning(LogFields().Job(cp.job).Checkpoint(cp.name),
                 "leaving its files to gc: its node manifest was written");
      return;
    case Retired::Files::kRemove:
      // Storage work, so on a worker whichever thread ended the attempt
      // (a cancel comes on a gRPC thread). Other nodes clean up theirs.
      workers_->Post([this, removal = *std::move(retired)](IoQueue&) {
        const CheckpointAttempt& attempt = *removal.checkpoint;
        absl::Status status = store_->RemoveNodePart(
            attempt.job, attempt.name, options_.node_id, removal.files);
        if (!status.ok()) {
          LogWarning(LogFields().Job(attempt.job).Checkpoint(attempt.name),
                     "cleanup of the ended attempt's files: ", status.ToString());
        }
        checkpoints_.ForgetRemoved(attempt);
      });
      return;
  }
}

absl::Status SaveCoordinator::WatchNext(const Session& session,
                                        uint64_t save_id, uint64_t after,
                                        Listener listener) {
  return board_.WatchNext(session.id(), save_id, after, std::move(listener));
}

absl::StatusOr<uint32_t> SaveCoordinator::CancelSave(const Session& session,
                                                     uint64_t save_id) {
  ListenerCalls calls;
  auto cancelled = checkpoints_.CancelSave(session, save_id, &calls);
  calls.Run();
  if (!cancelled.ok()) return cancelled.status();
  FinishRetirement(std::move(cancelled->retired));
  return cancelled->saves;
}

absl::StatusOr<uint32_t> SaveCoordinator::CancelCheckpoint(
    absl::string_view job, absl::string_view checkpoint) {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  RETURN_IF_ERROR(ValidateStorageName(checkpoint, "checkpoint"));
  ListenerCalls calls;
  auto cancelled = checkpoints_.CancelCheckpoint(job, checkpoint, &calls);
  calls.Run();
  if (!cancelled.ok()) return cancelled.status();
  FinishRetirement(std::move(cancelled->retired));
  return cancelled->saves;
}

absl::StatusOr<GarbageCollection> SaveCoordinator::CollectGarbage(
    absl::string_view job) {
  ASSIGN_OR_RETURN(GarbageCollection gc,
                   ckpt::CollectGarbage(*store_, job,
                                        [this](const std::string& j, const std::string& name) {
                                          return checkpoints_.Contains(j, name);
                                        }));
  // Retention now, as after a commit: for an operator who lowered
  // keep_last (SIGHUP) or whose commits were too few to trigger it; with
  // keep_last 0 too, for the generations a newer one replaced.
  const uint32_t keep_last = keep_last_.load();
  ASSIGN_OR_RETURN(const std::vector<v1::CheckpointInfo> all, store_->List(job));
  std::set<std::string> jobs;
  for (const v1::CheckpointInfo& c : all) jobs.insert(c.job());
  for (const std::string& j : jobs) {
    ASSIGN_OR_RETURN(const std::vector<std::string> deleted,
                     ApplyRetention(*store_, *leases_, j, keep_last));
    for (const std::string& name : deleted) {
      tier_->Drop(j, name);
      gc.removed.push_back(absl::StrCat(j, "/", name, " (retention: keep_last ", keep_last,
                                        ", or a newer generation of its name committed)"));
    }
  }
  return gc;
}

absl::Status SaveCoordinator::OpenSession(const std::shared_ptr<Session>& session,
                                          const v1::OpenSessionRequest& request,
                                          uint32_t node_id, uint32_t nodes) {
  RETURN_IF_ERROR(open_sessions_.Open(session, request.job(), [&] {
    return session->Open(request, node_id, nodes);
  }));
  ListenerCalls calls;
  std::vector<Retired> ended = checkpoints_.SessionOpened(*session, &calls);
  calls.Run();
  for (Retired& retired : ended) FinishRetirement(std::move(retired));
  return absl::OkStatus();
}

void SaveCoordinator::OnSessionClosed(const std::shared_ptr<Session>& session) {
  if (!session->opened()) return;
  open_sessions_.Closed(*session);
  ListenerCalls calls;
  std::vector<Retired> ended = checkpoints_.SessionClosed(*session, &calls);
  calls.Run();
  for (Retired& retired : ended) FinishRetirement(std::move(retired));
}

}  // namespace ckpt

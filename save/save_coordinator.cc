#include "save/save_coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "save/node_manifest.h"
#include "storage/durable_file.h"
#include "storage/garbage_collector.h"
#include "storage/retention.h"

namespace ckpt {
namespace {

constexpr auto kProgressInterval = std::chrono::milliseconds(200);
constexpr auto kKeepEndedParts = std::chrono::minutes(10);
constexpr size_t kMaxEndedParts = 4096;

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

bool IsFinal(v1::Phase phase) {
  return phase == v1::PHASE_COMMITTED || phase == v1::PHASE_FAILED ||
         phase == v1::PHASE_CANCELLED;
}

std::string Key(absl::string_view job, absl::string_view name) {
  return absl::StrCat(job, "/", name);
}

}  // namespace

SaveCoordinator::SaveCoordinator(const SaveOptions& options,
                                 const CheckpointStore* store,
                                 StagingPool* pool, IoWorkers* workers,
                                 CheckpointLeases* leases, MemoryTier* tier)
    : options_(options),
      store_(store),
      pool_(pool),
      workers_(workers),
      leases_(leases),
      tier_(tier),
      limiter_(options.write_rate_limit),
      commit_(store) {
  watcher_ = std::thread([this] { WatchCommits(); });
}

SaveCoordinator::~SaveCoordinator() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  watcher_wake_.notify_all();
  watcher_.join();
}

absl::StatusOr<uint64_t> SaveCoordinator::Submit(
    const std::shared_ptr<Session>& session, const v1::SaveRequest& request) {
  if (!session->opened()) {
    return absl::FailedPreconditionError("call OpenSession before Save");
  }
  if (request.job() != session->job()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "save names job '", request.job(), "' but the session is for job '",
        session->job(), "'"));
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

  auto part = std::make_shared<Part>();
  Notifications notify;
  {
    std::lock_guard lock(mu_);
    const std::string key = Key(request.job(), request.checkpoint());
    std::shared_ptr<Checkpoint>& cp = checkpoints_[key];
    if (cp == nullptr) {
      if (store_->IsCommitted(request.job(), request.checkpoint())) {
        checkpoints_.erase(key);
        return absl::AlreadyExistsError(absl::StrCat(
            "checkpoint ", key, " is already committed; choose a new name"));
      }
      cp = std::make_shared<Checkpoint>();
      cp->job = request.job();
      cp->name = request.checkpoint();
      cp->world_size = session->world_size();
      cp->local_ranks = session->local_world_size();
    } else if (cp->final_phase != v1::PHASE_UNSPECIFIED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", key, " already ended: ", cp->reason));
    } else if (cp->world_size != session->world_size() ||
               cp->local_ranks != session->local_world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session world size ", session->world_size(), " (", 
          session->local_world_size(), " local) differs from the ",
          cp->world_size, " (", cp->local_ranks, " local) of checkpoint ", key));
    } else if (cp->parts.count(session->rank()) != 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", session->rank(), " already submitted its part of ", key));
    } else if (cp->parts.size() == cp->local_ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", key, " already has all ", cp->local_ranks,
          " local ranks; rank ", session->rank(), " is one too many"));
    }
    part->id = next_id_++;
    part->session = session;
    part->checkpoint = cp;
    part->tensors = std::move(tensors);
    part->byte_items.assign(request.byte_items().begin(),
                            request.byte_items().end());
    v1::SaveProgress& p = part->progress;
    p.set_save_id(part->id);
    p.set_job(cp->job);
    p.set_checkpoint(cp->name);
    p.set_rank(session->rank());
    p.set_phase(v1::PHASE_ACCEPTED);
    p.set_world_size(cp->world_size);
    uint64_t total = 0;
    for (const PlannedFile& f : part->tensors->plan.files) total += f.layout.file_size;
    p.set_total_bytes(total);
    p.set_accepted_unix_micros(NowMicros());
    cp->parts[session->rank()] = part;
    for (auto& [rank, other] : cp->parts) {
      other->progress.set_ranks_submitted(cp->parts.size());
    }
    parts_[part->id] = part;
    PublishLocked(*part, /*force=*/true, &notify);
    PruneLocked();
  }
  Notify(notify);
  workers_->Post([this, part](IoQueue& queue) { RunPart(part, queue); });
  return part->id;
}

void SaveCoordinator::RunPart(const std::shared_ptr<Part>& part,
                              IoQueue& queue) {
  Checkpoint& cp = *part->checkpoint;
  if (part->cancelled.load()) {
    FinishPart(part, absl::CancelledError("cancelled before it started"));
    return;
  }
  std::call_once(cp.prepare_once, [&] {
    cp.prepare_status = store_->PrepareForSave(cp.job, cp.name, options_.node_id);
    cp.prepared = true;
  });
  if (!cp.prepare_status.ok()) {
    FinishPart(part, cp.prepare_status);
    return;
  }
  auto mark_staged = [&] {
    Notifications notify;
    {
      std::lock_guard lock(mu_);
      if (!IsFinal(part->progress.phase())) {
        part->progress.set_copies_enqueued(true);
        part->progress.set_phase(v1::PHASE_STAGED);
        part->progress.set_staged_unix_micros(NowMicros());
        PublishLocked(*part, /*force=*/true, &notify);
      }
    }
    Notify(notify);
  };
  // The GPU-side STAGED: the trainer's stream may wait on its staged event.
  auto mark_enqueued = [&] {
    Notifications notify;
    {
      std::lock_guard lock(mu_);
      if (!IsFinal(part->progress.phase())) {
        part->progress.set_copies_enqueued(true);
        PublishLocked(*part, /*force=*/true, &notify);
      }
    }
    Notify(notify);
  };
  const TensorLayout& tensors = *part->tensors;
  const std::vector<PlannedFile>& files = tensors.plan.files;
  // One batch of copies for the whole part, so the staged events are
  // recorded once, after its last copy.
  absl::StatusOr<std::unique_ptr<CopyOutBatch>> batch =
      part->session->memory()->BeginCopyOut();
  if (!batch.ok()) {
    FinishPart(part, batch.status());
    return;
  }
  // A rank that owns nothing (its replicas write everything) is staged now.
  if (files.empty()) {
    absl::Status recorded = (*batch)->AllEnqueued();
    if (!recorded.ok()) {
      FinishPart(part, recorded);
      return;
    }
    mark_staged();
  }
  ShardWriter writer(pool_, &queue);
  ShardWriteProgress before;  // of the files already written
  // Files are written one after another, and only the last one's copies
  // are still being enqueued while the trainer waits for copies_enqueued:
  // the largest goes last, so the trainer waits for the smaller ones (the
  // replicated small parameters a rank owns) to reach storage, not for it.
  std::vector<size_t> order(files.size());
  for (size_t f = 0; f < files.size(); ++f) order[f] = f;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return files[a].layout.file_size < files[b].layout.file_size;
  });
  part->results.assign(files.size(), ShardWriteResult());
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t f = order[k];
    const bool last = k + 1 == order.size();
    const PlannedFile& file = files[f];
    ShardWriteRequest req;
    req.path = absl::StrCat(store_->CheckpointDir(cp.job, cp.name), "/", file.name);
    // A leftover of an earlier, crashed attempt at this checkpoint: only
    // this rank ever writes this name.
    if (::unlink(req.path.c_str()) != 0 && errno != ENOENT) {
      FinishPart(part, ErrnoToStatus(errno, absl::StrCat("remove stale ", req.path)));
      return;
    }
    req.layout = &file.layout;
    for (size_t i : file.items) {
      req.remote.push_back(tensors.remote[i]);
      req.lengths.push_back(tensors.items[i].memory().length());
    }
    req.checksum_block_bytes = options_.checksum_block_bytes;
    req.source = part->session->memory();
    req.batch = batch->get();
    req.last_file_of_batch = last;
    req.cancelled = &part->cancelled;
    req.limiter = &limiter_;
    const std::shared_ptr<FileImage> image =
        tier_->Reserve(cp.job, cp.name, file.name, file.layout.file_size);
    if (image != nullptr) req.capture = image->data();
    req.on_progress = [&](const ShardWriteProgress& progress) {
      Notifications notify;
      {
        std::lock_guard lock(mu_);
        part->progress.set_bytes_staged(before.bytes_staged + progress.bytes_staged);
        part->progress.set_bytes_written(before.bytes_written + progress.bytes_written);
        PublishLocked(*part, /*force=*/false, &notify);
      }
      Notify(notify);
    };
    if (last) {
      req.on_enqueued = mark_enqueued;
      req.on_staged = mark_staged;
    }
    auto result = writer.Write(req);
    if (!result.ok()) {
      FinishPart(part, result.status());
      return;
    }
    before.bytes_staged += result->file_size;
    before.bytes_written += result->file_size;
    tensor_bytes_written_ += file.tensor_bytes;
    part->results[f] = *std::move(result);
  }
  FinishPart(part, absl::OkStatus());
}

void SaveCoordinator::FinishPart(const std::shared_ptr<Part>& part,
                                 absl::Status status) {
  std::shared_ptr<Checkpoint> cp = part->checkpoint;
  bool commit_now = false;
  Notifications notify;
  {
    std::lock_guard lock(mu_);
    part->done = true;
    if (cp->final_phase == v1::PHASE_UNSPECIFIED) {
      if (status.ok()) {
        commit_now = ++cp->durable_parts == cp->local_ranks;
      } else {
        LogWarning("save ", part->id, " of ", Key(cp->job, cp->name),
                   " rank ", part->progress.rank(), ": ", status.ToString());
        EndCheckpointLocked(*cp,
                            absl::IsCancelled(status) ? v1::PHASE_CANCELLED
                                                      : v1::PHASE_FAILED,
                            absl::StrCat("rank ", part->progress.rank(), ": ",
                                         status.message()),
                            &notify);
      }
    }
    MaybeRetireLocked(cp);
  }
  Notify(notify);
  if (commit_now) FinishNode(cp);
}

void SaveCoordinator::FinishNode(const std::shared_ptr<Checkpoint>& cp) {
  v1::Manifest header;
  header.set_format_version(1);
  header.set_job(cp->job);
  header.set_checkpoint(cp->name);
  header.set_node_id(options_.node_id);
  header.set_nodes(options_.nodes);
  header.set_world_size(cp->world_size);
  header.set_checksum_block_bytes(options_.checksum_block_bytes);
  header.set_created_unix_micros(NowMicros());
  // Every local part is durable, so no worker touches them any more.
  std::vector<WrittenPart> parts;
  for (const auto& [rank, part] : cp->parts) {
    parts.push_back({rank, part->tensors.get(), &part->results, &part->byte_items});
  }
  absl::Status status;
  auto manifest = BuildNodeManifest(header, parts);
  if (!manifest.ok()) {
    status = manifest.status();
  } else {
    status = store_->WriteNodeManifest(*manifest);
  }
  if (!status.ok()) {
    Notifications notify;
    {
      std::lock_guard lock(mu_);
      if (cp->final_phase == v1::PHASE_UNSPECIFIED) {
        EndCheckpointLocked(*cp, v1::PHASE_FAILED,
                            absl::StrCat("node manifest: ", status.message()), &notify);
      }
      MaybeRetireLocked(cp);
    }
    Notify(notify);
    return;
  }
  {
    std::lock_guard lock(mu_);
    cp->manifest_written = true;
    cp->durable_at = std::chrono::steady_clock::now();
  }
  SetPhase(cp, v1::PHASE_DURABLE);
  TryCommit(cp);
}

void SaveCoordinator::TryCommit(const std::shared_ptr<Checkpoint>& cp) {
  auto committed = commit_.TryCommit(cp->job, cp->name, options_.nodes);
  Notifications notify;
  {
    std::lock_guard lock(mu_);
    if (cp->final_phase != v1::PHASE_UNSPECIFIED) return;
    const auto waited = std::chrono::steady_clock::now() - cp->durable_at;
    if (committed.ok() && *committed) {
      cp->awaiting_nodes = false;
    } else if (!committed.ok()) {
      EndCheckpointLocked(*cp, v1::PHASE_FAILED,
                          absl::StrCat("commit: ", committed.status().message()),
                          &notify);
    } else if (waited >= std::chrono::milliseconds(options_.commit_timeout_ms)) {
      auto present = store_->ListNodeManifests(cp->job, cp->name);
      EndCheckpointLocked(
          *cp, v1::PHASE_FAILED,
          absl::StrCat("not every node finished within ", options_.commit_timeout_ms,
                       " ms; node manifests present: [",
                       present.ok() ? absl::StrJoin(*present, ",") : "?", "] of ",
                       options_.nodes),
          &notify);
    } else {
      if (!cp->awaiting_nodes) {
        cp->awaiting_nodes = true;
        watcher_wake_.notify_all();
      }
      return;
    }
    if (cp->final_phase != v1::PHASE_UNSPECIFIED) {
      MaybeRetireLocked(cp);
    }
  }
  Notify(notify);
  if (!committed.ok() || !*committed) return;
  tier_->MarkCommitted(cp->job, cp->name);
  SetPhase(cp, v1::PHASE_COMMITTED);
  LogInfo("checkpoint ", Key(cp->job, cp->name), " committed");
  // Only now is there a newer committed checkpoint to make room for.
  auto deleted = ApplyRetention(*store_, *leases_, cp->job, options_.keep_last);
  if (!deleted.ok()) {
    LogWarning("retention: ", deleted.status().ToString());
  } else {
    for (const std::string& name : *deleted) tier_->Drop(cp->job, name);
  }
  // For restores into GPU memory at the copy engine's speed.
  tier_->Pin(cp->job, cp->name);
}

void SaveCoordinator::SetPhase(const std::shared_ptr<Checkpoint>& cp, v1::Phase phase) {
  Notifications notify;
  {
    std::lock_guard lock(mu_);
    if (cp->final_phase != v1::PHASE_UNSPECIFIED) return;
    const int64_t now = NowMicros();
    for (auto& [rank, part] : cp->parts) {
      part->progress.set_phase(phase);
      if (phase == v1::PHASE_DURABLE) part->progress.set_durable_unix_micros(now);
      if (phase == v1::PHASE_COMMITTED) part->progress.set_committed_unix_micros(now);
      PublishLocked(*part, /*force=*/true, &notify);
    }
    if (phase == v1::PHASE_COMMITTED) {
      // Retired before anyone hears of the commit: a client that saw
      // COMMITTED never finds the save still in flight.
      cp->final_phase = v1::PHASE_COMMITTED;
      MaybeRetireLocked(cp);
    }
  }
  Notify(notify);
}

// Other nodes finish in their own time; retry the commit of every
// checkpoint this node has made durable until it commits or times out.
void SaveCoordinator::WatchCommits() {
  constexpr auto kPollInterval = std::chrono::milliseconds(50);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    std::vector<std::shared_ptr<Checkpoint>> awaiting;
    for (const auto& [key, cp] : checkpoints_) {
      if (cp->awaiting_nodes && cp->final_phase == v1::PHASE_UNSPECIFIED) {
        awaiting.push_back(cp);
      }
    }
    if (awaiting.empty()) {
      watcher_wake_.wait(lock);
      continue;
    }
    lock.unlock();
    for (const auto& cp : awaiting) TryCommit(cp);
    lock.lock();
    watcher_wake_.wait_for(lock, kPollInterval);
  }
}

absl::StatusOr<std::vector<std::string>> SaveCoordinator::CollectGarbage(
    absl::string_view job) {
  return ckpt::CollectGarbage(*store_, job, [this](const std::string& j,
                                                   const std::string& name) {
    std::lock_guard lock(mu_);
    return checkpoints_.contains(Key(j, name));
  });
}

void SaveCoordinator::EndCheckpointLocked(Checkpoint& cp, v1::Phase phase,
                                          std::string reason,
                                          Notifications* out) {
  cp.final_phase = phase;
  cp.reason = std::move(reason);
  LogWarning("checkpoint ", Key(cp.job, cp.name), " ",
             v1::Phase_Name(phase), ": ", cp.reason);
  for (auto& [rank, part] : cp.parts) {
    part->cancelled = true;
    part->progress.set_phase(phase);
    part->progress.set_reason(cp.reason);
    PublishLocked(*part, /*force=*/true, out);
  }
}

void SaveCoordinator::MaybeRetireLocked(const std::shared_ptr<Checkpoint>& cp) {
  if (cp->final_phase == v1::PHASE_UNSPECIFIED) return;
  for (const auto& [rank, part] : cp->parts) {
    if (!part->done) return;
  }
  auto it = checkpoints_.find(Key(cp->job, cp->name));
  if (it == checkpoints_.end() || it->second != cp) return;
  checkpoints_.erase(it);
  std::vector<std::string> files;
  for (auto& [rank, part] : cp->parts) {
    for (const PlannedFile& f : part->tensors->plan.files) files.push_back(f.name);
    part->tensors.reset();
    part->byte_items.clear();
    part->results.clear();
  }
  if (cp->final_phase == v1::PHASE_COMMITTED) return;
  tier_->Drop(cp->job, cp->name);
  // Once the node manifest is out, a node that sees every manifest may be
  // committing with these files right now: leave them to `ckptctl gc`.
  if (cp->manifest_written) {
    LogWarning("leaving ", Key(cp->job, cp->name),
               " to gc: its node manifest was written");
    return;
  }
  // Remove this node's files while holding mu_, so that a new save of the
  // same name cannot prepare them concurrently. Other nodes clean up theirs.
  if (cp->prepared.load()) {
    absl::Status status =
        store_->RemoveNodePart(cp->job, cp->name, options_.node_id, files);
    if (!status.ok()) LogWarning("cleanup: ", status.ToString());
  }
}

void SaveCoordinator::PublishLocked(Part& part, bool force, Notifications* out) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - part.last_publish < kProgressInterval) return;
  part.last_publish = now;
  ++part.version;
  if (part.listeners.empty()) return;
  out->push_back({std::exchange(part.listeners, {}), part.progress, part.version});
}

void SaveCoordinator::Notify(Notifications& notifications) {
  for (Notification& n : notifications) {
    for (auto& listener : n.listeners) listener(n.progress, n.version);
  }
}

absl::Status SaveCoordinator::WatchNext(const Session& session, uint64_t save_id,
                                        uint64_t after, Listener listener) {
  v1::SaveProgress now;
  uint64_t version = 0;
  {
    std::lock_guard lock(mu_);
    auto it = parts_.find(save_id);
    if (it == parts_.end()) {
      return absl::NotFoundError(absl::StrCat("no save with id ", save_id));
    }
    Part& part = *it->second;
    if (part.session->id() != session.id()) {
      return absl::PermissionDeniedError(
          absl::StrCat("save ", save_id, " belongs to another session"));
    }
    if (part.version <= after) {
      part.listeners.push_back(std::move(listener));
      return absl::OkStatus();
    }
    now = part.progress;
    version = part.version;
  }
  listener(now, version);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> SaveCoordinator::CancelSave(const Session& session,
                                                     uint64_t save_id) {
  Notifications notify;
  uint32_t cancelled = 0;
  {
    std::lock_guard lock(mu_);
    auto it = parts_.find(save_id);
    if (it == parts_.end() || it->second->session->id() != session.id()) {
      return absl::NotFoundError(
          absl::StrCat("no save with id ", save_id, " in this session"));
    }
    Checkpoint& cp = *it->second->checkpoint;
    if (cp.final_phase == v1::PHASE_UNSPECIFIED &&
        cp.durable_parts < cp.world_size) {
      EndCheckpointLocked(cp, v1::PHASE_CANCELLED,
                          absl::StrCat("cancelled by rank ", session.rank()),
                          &notify);
      cancelled = cp.parts.size();
      MaybeRetireLocked(it->second->checkpoint);
    }
  }
  Notify(notify);
  return cancelled;
}

absl::StatusOr<uint32_t> SaveCoordinator::CancelCheckpoint(
    absl::string_view job, absl::string_view checkpoint) {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  RETURN_IF_ERROR(ValidateStorageName(checkpoint, "checkpoint"));
  Notifications notify;
  uint32_t cancelled = 0;
  {
    std::lock_guard lock(mu_);
    auto it = checkpoints_.find(Key(job, checkpoint));
    if (it == checkpoints_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "no save of ", job, "/", checkpoint, " is in flight"));
    }
    std::shared_ptr<Checkpoint> cp = it->second;
    if (cp->final_phase != v1::PHASE_UNSPECIFIED ||
        cp->durable_parts == cp->world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          job, "/", checkpoint, " is already committing or ended"));
    }
    EndCheckpointLocked(*cp, v1::PHASE_CANCELLED, "cancelled by the operator",
                        &notify);
    cancelled = cp->parts.size();
    MaybeRetireLocked(cp);
  }
  Notify(notify);
  return cancelled;
}

std::vector<v1::SaveProgress> SaveCoordinator::InFlight() const {
  std::lock_guard lock(mu_);
  std::vector<v1::SaveProgress> out;
  for (const auto& [id, part] : parts_) {
    if (!IsFinal(part->progress.phase())) out.push_back(part->progress);
  }
  return out;
}

void SaveCoordinator::OnSessionClosed(const std::shared_ptr<Session>& session) {
  if (!session->opened()) return;
  Notifications notify;
  {
    std::lock_guard lock(mu_);
    std::vector<std::shared_ptr<Checkpoint>> ended;
    for (auto& [key, cp] : checkpoints_) {
      if (cp->job != session->job() || cp->final_phase != v1::PHASE_UNSPECIFIED ||
          cp->parts.count(session->rank()) != 0) {
        continue;
      }
      EndCheckpointLocked(*cp, v1::PHASE_FAILED,
                          absl::StrCat("rank ", session->rank(),
                                       " disconnected before submitting its part"),
                          &notify);
      ended.push_back(cp);
    }
    for (auto& cp : ended) MaybeRetireLocked(cp);
  }
  Notify(notify);
}

void SaveCoordinator::PruneLocked() {
  size_t ended = 0;
  for (const auto& [id, part] : parts_) ended += IsFinal(part->progress.phase());
  const int64_t cutoff =
      NowMicros() - std::chrono::microseconds(kKeepEndedParts).count();
  for (auto it = parts_.begin(); it != parts_.end();) {
    const Part& part = *it->second;
    const bool old = part.progress.accepted_unix_micros() < cutoff;
    if (IsFinal(part.progress.phase()) && part.done &&
        (old || ended > kMaxEndedParts)) {
      it = parts_.erase(it);
      --ended;
    } else {
      ++it;
    }
  }
}

}  // namespace ckpt

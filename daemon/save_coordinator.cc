#include "daemon/save_coordinator.h"

#include <xxhash.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "daemon/durable_file.h"

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

SaveCoordinator::SaveCoordinator(const DaemonOptions& options,
                                 const CheckpointStore* store,
                                 StagingPool* pool, IoWorkers* workers)
    : options_(options),
      store_(store),
      pool_(pool),
      workers_(workers),
      limiter_(options.write_rate_limit) {}

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
    } else if (cp->final_phase != v1::PHASE_UNSPECIFIED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", key, " already ended: ", cp->reason));
    } else if (cp->world_size != session->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session world size ", session->world_size(),
          " differs from the ", cp->world_size, " of checkpoint ", key));
    } else if (cp->parts.count(session->rank()) != 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", session->rank(), " already submitted its part of ", key));
    }
    part->id = next_id_++;
    part->session = session;
    part->checkpoint = cp;
    part->tensors = std::move(tensors);
    part->byte_items.assign(request.byte_items().begin(),
                            request.byte_items().end());
    part->file_name = DataFileName(session->rank(), session->rank() + 1,
                                   cp->world_size);
    v1::SaveProgress& p = part->progress;
    p.set_save_id(part->id);
    p.set_job(cp->job);
    p.set_checkpoint(cp->name);
    p.set_rank(session->rank());
    p.set_phase(v1::PHASE_ACCEPTED);
    p.set_world_size(cp->world_size);
    p.set_total_bytes(part->tensors->file.file_size);
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
  std::call_once(cp.prepared, [&] {
    cp.prepare_status = store_->PrepareForSave(cp.job, cp.name);
  });
  if (!cp.prepare_status.ok()) {
    FinishPart(part, cp.prepare_status);
    return;
  }

  ShardWriteRequest req;
  req.path = absl::StrCat(store_->CheckpointDir(cp.job, cp.name), "/",
                          part->file_name);
  req.layout = &part->tensors->file;
  req.remote = part->tensors->remote;
  req.lengths = part->tensors->lengths;
  req.checksum_block_bytes = options_.checksum_block_bytes;
  req.source = part->session->memory();
  req.cancelled = &part->cancelled;
  req.limiter = &limiter_;
  req.on_progress = [&](const ShardWriteProgress& progress) {
    Notifications notify;
    {
      std::lock_guard lock(mu_);
      part->progress.set_bytes_staged(progress.bytes_staged);
      part->progress.set_bytes_written(progress.bytes_written);
      PublishLocked(*part, /*force=*/false, &notify);
    }
    Notify(notify);
  };
  req.on_staged = [&] {
    Notifications notify;
    {
      std::lock_guard lock(mu_);
      if (!IsFinal(part->progress.phase())) {
        part->progress.set_phase(v1::PHASE_STAGED);
        part->progress.set_staged_unix_micros(NowMicros());
        PublishLocked(*part, /*force=*/true, &notify);
      }
    }
    Notify(notify);
  };
  ShardWriter writer(pool_, &queue);
  auto result = writer.Write(req);
  if (result.ok()) part->result = *std::move(result);
  FinishPart(part, result.status());
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
        commit_now = ++cp->durable_parts == cp->world_size;
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
  if (commit_now) CommitCheckpoint(cp);
}

void SaveCoordinator::CommitCheckpoint(const std::shared_ptr<Checkpoint>& cp) {
  v1::Manifest manifest;
  manifest.set_format_version(1);
  manifest.set_job(cp->job);
  manifest.set_checkpoint(cp->name);
  manifest.set_node_id(options_.node_id);
  manifest.set_world_size(cp->world_size);
  manifest.set_checksum_block_bytes(options_.checksum_block_bytes);
  manifest.set_created_unix_micros(NowMicros());
  // Parts are no longer touched by workers: all of them are durable.
  for (const auto& [rank, part] : cp->parts) {
    const uint32_t file_index = manifest.files_size();
    v1::DataFile* file = manifest.add_files();
    file->set_name(part->file_name);
    file->set_size(part->result.file_size);
    file->set_data_start(part->tensors->file.data_start);
    file->set_rank(rank);
    for (size_t i = 0; i < part->tensors->items.size(); ++i) {
      const v1::TensorItem& item = part->tensors->items[i];
      v1::StoredTensor* t = manifest.add_tensors();
      t->set_fqn(item.fqn());
      t->set_dtype(item.dtype());
      *t->mutable_global_shape() = item.global_shape();
      *t->mutable_offsets() = item.offsets();
      *t->mutable_local_shape() = item.local_shape();
      t->set_file_index(file_index);
      t->set_file_offset(part->tensors->file.data_start + part->tensors->file.data_offsets[i]);
      t->set_length(part->tensors->lengths[i]);
      for (uint64_t h : part->result.block_xxh3[i]) t->add_block_xxh3(h);
      t->add_replica_ranks(rank);
    }
    for (const v1::ByteItem& item : part->byte_items) {
      v1::StoredBytes* b = manifest.add_byte_items();
      b->set_fqn(item.fqn());
      b->set_data(item.data());
      b->set_xxh3(XXH3_64bits(item.data().data(), item.data().size()));
      b->set_rank(rank);
    }
  }
  absl::Status status = store_->WriteNodeManifest(manifest);
  Notifications notify;
  auto set_phase = [&](v1::Phase phase) {
    std::lock_guard lock(mu_);
    if (cp->final_phase != v1::PHASE_UNSPECIFIED) return false;
    const int64_t now = NowMicros();
    for (auto& [rank, part] : cp->parts) {
      part->progress.set_phase(phase);
      if (phase == v1::PHASE_DURABLE) part->progress.set_durable_unix_micros(now);
      if (phase == v1::PHASE_COMMITTED) {
        part->progress.set_committed_unix_micros(now);
      }
      PublishLocked(*part, /*force=*/true, &notify);
    }
    return true;
  };
  if (status.ok() && set_phase(v1::PHASE_DURABLE)) {
    Notify(notify);
    notify.clear();
    v1::CommitRecord record;
    record.set_format_version(1);
    record.add_node_manifests(CheckpointStore::NodeManifestName(options_.node_id));
    *record.mutable_index() = manifest;
    record.mutable_index()->set_node_id(0);
    record.set_committed_unix_micros(NowMicros());
    status = store_->WriteCommit(record);
    if (status.ok()) {
      // COMMIT is durable: the checkpoint is committed even if LATEST
      // cannot move; loading it by name works, so only log that.
      absl::Status latest = store_->UpdateLatest(cp->job, cp->name);
      if (!latest.ok()) {
        LogError("checkpoint ", Key(cp->job, cp->name),
                 " committed but LATEST not updated: ", latest.ToString());
      }
      set_phase(v1::PHASE_COMMITTED);
      LogInfo("checkpoint ", Key(cp->job, cp->name), " committed");
    }
  }
  {
    std::lock_guard lock(mu_);
    if (!status.ok() && cp->final_phase == v1::PHASE_UNSPECIFIED) {
      EndCheckpointLocked(*cp, v1::PHASE_FAILED,
                          absl::StrCat("commit: ", status.message()), &notify);
    } else if (cp->final_phase == v1::PHASE_UNSPECIFIED) {
      cp->final_phase = v1::PHASE_COMMITTED;
    }
    MaybeRetireLocked(cp);
  }
  Notify(notify);
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
  for (auto& [rank, part] : cp->parts) {
    part->tensors.reset();
    part->byte_items.clear();
  }
  if (cp->final_phase == v1::PHASE_COMMITTED) return;
  // Remove the uncommitted directory while holding mu_, so that a new save
  // of the same name cannot prepare it concurrently.
  const std::string dir = store_->CheckpointDir(cp->job, cp->name);
  if (!store_->IsCommitted(cp->job, cp->name)) {
    absl::Status status = RemoveTree(dir);
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

#include "save/part_writer.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/save_phase.h"
#include "common/status.h"
#include "save/shard_writer.h"
#include "storage/job_ownership.h"
#include "storage/storage_dir.h"

namespace ckpt {

void PartWriter::MarkStaged(const SavePart& part, bool staged) {
  SaveProgressBoard::ListenerCalls calls;
  board_->Update(
      part.id, /*force=*/true,
      [&](v1::SaveProgress& p) {
        if (IsFinalPhase(p.phase())) return;
        p.set_copies_enqueued(true);
        if (staged) {
          p.set_phase(v1::PHASE_STAGED);
          p.set_staged_unix_micros(absl::ToUnixMicros(absl::Now()));
        }
      },
      &calls);
  calls.Run();
}

absl::Status PartWriter::Prepare(const SavePart& part) {
  CheckpointAttempt& cp = *part.checkpoint;
  std::call_once(cp.prepare_once, [&] {
    // The job is its first saver's (storage/job_ownership.h); the service
    // checked the owner already, this settles a race of two new jobs.
    cp.prepare_status = ClaimJob(*store_, cp.job, part.session->uid());
    if (!cp.prepare_status.ok()) return;
    cp.prepare_status =
        store_->PrepareForSave(cp.job, cp.name, options_.node_id, file_ops_);
    cp.prepared = true;
  });
  return cp.prepare_status;
}

absl::Status PartWriter::Write(SavePart& part, IoQueue& queue) {
  CheckpointAttempt& cp = *part.checkpoint;
  if (part.cancelled.load())
    return absl::CancelledError("cancelled before it started");
  // The checkpoint directory is prepared and opened when the part's first
  // file is about to be created (ShardWriter: at its first write), not
  // before the copies: with GPU memory and a pool that holds the part, the
  // trainer's GPU-side STAGED then never waits for mkdir, the marker's
  // fsyncs or the file's creation. Every data file is created beneath this
  // one directory descriptor, so a checkpoint directory swapped for a
  // symlink after PrepareForSave cannot redirect a write
  // (storage/storage_dir.h).
  std::optional<StorageDir> dir;
  auto open_dir = [&]() -> absl::StatusOr<StorageDir*> {
    if (!dir.has_value()) {
      RETURN_IF_ERROR(Prepare(part));
      ASSIGN_OR_RETURN(StorageDir opened, store_->OpenCheckpoint(cp.job, cp.name));
      dir.emplace(std::move(opened));
    }
    return &*dir;
  };

  const TensorLayout& tensors = *part.tensors;
  const std::vector<PlannedFile>& files = tensors.plan.files;
  // One batch of copies for the whole part, so the staged events are
  // recorded once, after its last copy.
  ASSIGN_OR_RETURN(std::unique_ptr<CopyOutBatch> batch,
                   part.session->memory()->BeginCopyOut(&part.staged));
  // A rank that owns nothing (its replicas write everything) is staged now.
  // Its node's manifest still goes into the checkpoint directory.
  if (files.empty()) {
    RETURN_IF_ERROR(batch->AllEnqueued());
    MarkStaged(part, /*staged=*/true);
    return open_dir().status();
  }
  // All the part's files in one write: their windows are one stream, so
  // with a pool that holds the part every copy of every file is enqueued
  // (the GPU-side STAGED) before any file is written.
  ShardWriteRequest req;
  req.files.resize(files.size());
  // The tier images being filled, kept until the write returns.
  std::vector<std::shared_ptr<FileImage>> images;
  for (size_t f = 0; f < files.size(); ++f) {
    const PlannedFile& file = files[f];
    ShardFile& out = req.files[f];
    out.name = file.name;
    out.path = absl::StrCat(store_->CheckpointDir(cp.job, cp.name), "/", file.name);
    out.open_dir = [&open_dir, name = file.name]() -> absl::StatusOr<const StorageDir*> {
      ASSIGN_OR_RETURN(StorageDir * opened, open_dir());
      // A leftover of an earlier, crashed attempt at this checkpoint: only
      // this rank ever writes this name.
      RETURN_IF_ERROR(opened->Unlink(name));
      return opened;
    };
    out.layout = &file.layout;
    for (size_t i : file.items) {
      out.remote.push_back(tensors.remote[i]);
      out.lengths.push_back(tensors.items[i].memory().length());
    }
    std::shared_ptr<FileImage> image =
        tier_->Reserve(cp.job, cp.name, file.name, file.layout.file_size);
    if (image != nullptr) out.capture = image->data();
    images.push_back(std::move(image));
  }
  req.checksum_block_bytes = options_.checksum_block_bytes;
  req.source = part.session->memory();
  req.batch = batch.get();
  req.cancelled = &part.cancelled;
  req.limiter = &limiter_;
  req.on_progress = [&](const ShardWriteProgress& progress) {
    SaveProgressBoard::ListenerCalls calls;
    board_->Update(
        part.id, /*force=*/false,
        [&](v1::SaveProgress& p) {
          p.set_bytes_staged(progress.bytes_staged);
          p.set_bytes_written(progress.bytes_written);
        },
        &calls);
    calls.Run();
  };
  // The GPU-side STAGED: the trainer's stream may wait on its staged event.
  req.on_enqueued = [&] { MarkStaged(part, /*staged=*/false); };
  req.on_staged = [&] { MarkStaged(part, /*staged=*/true); };
  ShardWriter writer(pool_, &queue, file_ops_);
  ASSIGN_OR_RETURN(part.results, writer.Write(req));
  for (const PlannedFile& file : files) tensor_bytes_written_ += file.tensor_bytes;
  return absl::OkStatus();
}

}  // namespace ckpt

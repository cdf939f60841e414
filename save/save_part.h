// SavePart and CheckpointAttempt: one rank's part of a checkpoint on this
// node, and the attempt at that checkpoint it belongs to, as the I/O worker
// that writes the part sees them.
//
// Both are created at Submit and shared (shared_ptr) by InFlightCheckpoints,
// which keeps the state that changes under its lock, and by the worker's
// task. What lives here is fixed at creation, apart from the fields whose
// comments say who writes them.
//
// Thread-safety: as stated per field; constant fields may be read anywhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckpt/v1/control.pb.h"
#include "plan/tensor_layout.h"
#include "save/shard_writer.h"
#include "session/session.h"
#include "session/staged_records.h"

namespace ckpt {

// One attempt at saving checkpoint `job/name` on this node: a new attempt
// starts when a save names a checkpoint that is not in flight here.
struct CheckpointAttempt {
  CheckpointAttempt(std::string job_in, std::string name_in, uint32_t world,
                    uint32_t local)
      : job(std::move(job_in)),
        name(std::move(name_in)),
        key(absl::StrCat(job, "/", name)),
        world_size(world),
        local_ranks(local) {}

  const std::string job, name;
  const std::string key;  // "job/name", for maps and messages
  const uint32_t world_size;
  const uint32_t local_ranks;  // parts this node waits for
  // When the first local rank's save named it: the node manifest's
  // created_unix_micros, and so the commit time that LATEST and retention
  // order checkpoints by. A rank calls save N+1 after save N, so a later
  // save always has a later time here, however the writes of two saves in
  // flight overlap (the time a node's part became durable would let an
  // older checkpoint that finishes last take LATEST back).
  const absl::Time started = absl::Now();

  // The checkpoint directory is prepared once per attempt, by the first
  // worker to start a part of it; `prepare_status` is written inside
  // `prepare_once` and read after it.
  std::once_flag prepare_once;
  absl::Status prepare_status;
  // This node touched the directory: its files must be removed if the
  // attempt fails before its node manifest is written.
  std::atomic<bool> prepared{false};
  // Set by the one Submit that hands the attempt's local-ranks deadline to
  // the commit watcher (the first to find it unset), so each attempt has
  // one deadline check however many ranks submit at once.
  std::atomic<bool> ranks_deadline_armed{false};
};

struct SavePart {
  uint64_t id = 0;  // the save id the trainer holds
  uint32_t rank = 0;
  uint64_t session_id = 0;  // the session that submitted it
  std::optional<uint32_t> local_rank = std::nullopt;  // its session's, if it said
  // The trainer's session, for the worker (its memory, its uid). Dropped,
  // under InFlightCheckpoints' lock, once the worker is done with the part
  // (FinishPart): a part that waits for other nodes or for the commit must
  // not keep a departed trainer's pidfd and memory file open. Read only by
  // the worker before then.
  std::shared_ptr<Session> session;
  std::shared_ptr<CheckpointAttempt> checkpoint;
  std::shared_ptr<const TensorLayout> tensors;  // shared across saves
  std::vector<v1::ByteItem> byte_items;
  // The staged records reserved when the part was accepted: written by
  // Submit before the part is posted, then the worker's alone.
  StagedRecords staged;
  // Set by whoever ends the checkpoint; the worker polls it.
  std::atomic<bool> cancelled{false};
  // Per plan file: written by the worker until it reports the part
  // finished, read for the node manifest once every part has finished.
  std::vector<ShardWriteResult> results;
};

}  // namespace ckpt

// CollectGarbage: removes uncommitted checkpoints that can no longer commit
// (`ckptctl gc`).
//
// An uncommitted checkpoint directory is garbage once a newer checkpoint of
// the same job has committed: it was left by a crashed or failed save (a
// node that never finished, a daemon killed mid-save). "Newer" is judged by
// time: only directories last modified before the job's newest commit are
// removed, so a save still in progress elsewhere (its files keep changing)
// is left alone, and `in_flight` excludes what this daemon is writing. (A
// new save that reuses such an old name while gc runs may lose files to it
// and fail; the retry succeeds.)
//
// Thread-safety: safe from any thread; `in_flight` is called per candidate.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

// Removes the garbage of `job` (every job if empty); returns "job/name" of
// each removed checkpoint. `in_flight(job, name)` is true for checkpoints
// this daemon is writing.
absl::StatusOr<std::vector<std::string>> CollectGarbage(
    const CheckpointStore& store, absl::string_view job,
    const std::function<bool(const std::string&, const std::string&)>& in_flight);

}  // namespace ckpt

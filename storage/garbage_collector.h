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
// Only directories ckptd made are removed: one without the marker
// (kMarkerFileName), such as a DCP checkpoint a user copied under the root,
// is logged and left alone, as is a symlink (never listed).
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

struct GarbageCollection {
  std::vector<std::string> removed;  // "job/name" of each removed checkpoint
  std::vector<std::string> left;     // "job/name: why" of each one left
};

// Removes the garbage of `job` (every job if empty). `in_flight(job, name)`
// is true for checkpoints this daemon is writing.
absl::StatusOr<GarbageCollection> CollectGarbage(
    const CheckpointStore& store, absl::string_view job,
    const std::function<bool(const std::string&, const std::string&)>& in_flight);

}  // namespace ckpt

// ApplyRetention: keep the newest `keep_last` committed checkpoints of a job
// and delete the older ones (DaemonOptions::keep_last), and delete every
// committed generation of a name once a newer generation of that name has
// committed (a save again to a name, DCP's overwrite: common/names.h), with
// any keep_last, 0 included. Replaced generations do not count towards
// keep_last.
//
// Only committed checkpoints count and only older ones are deleted, so a
// checkpoint goes only after `keep_last` newer ones have committed, and
// LATEST (the newest) is never among them; uncommitted ones, in flight or
// left by a crash, are not touched (that is `ckptctl gc`). A checkpoint a
// load of this daemon is reading is skipped (CheckpointLeases) and goes at a
// later pass. Deletion removes COMMIT first, so the checkpoint disappears
// for readers atomically before its files do. A directory without ckptd's
// marker (kMarkerFileName) is logged and never deleted.
//
// Thread-safety: safe to call from any thread; concurrent passes over the
// same job are harmless (deletion is idempotent).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

absl::StatusOr<std::vector<std::string>> ApplyRetention(const CheckpointStore& store,
                                                        CheckpointLeases& leases,
                                                        const std::string& job,
                                                        uint32_t keep_last);

}  // namespace ckpt

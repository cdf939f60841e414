// Which user a job belongs to: the owner of its directory under the root.
//
// A job is created by the first save into it, and its directory is given to
// that save's user with mode 0700: only that user (and root) can reach the
// checkpoint files in it, by hand too (a stock torch.distributed.checkpoint
// load by the owner works; anyone else's fails). The owner is read back
// from the directory itself, which users other than the owner cannot
// change, so ownership needs no record that could be forged or lost. The
// daemon decides what a caller may do with a job from it
// (daemon/access_policy.h).
//
// The job's owner can rename or delete files in the directory: that can
// damage only their own job, and the daemon treats everything under the
// root as untrusted input anyway (storage/storage_dir.h).
//
// Thread-safety: free functions; ClaimJob serializes itself.
#pragma once

#include <sys/types.h>

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

// The uid owning `job`'s directory; nullopt if the job has none yet, or
// only an empty one of the daemon's own user (a first save between its
// mkdir and its chown, or a crash there), which ClaimJob gives to the first
// saver. Ordered against ClaimJob, so a rank never sees another rank's new
// directory before it has its owner.
absl::StatusOr<std::optional<uid_t>> JobOwner(const CheckpointStore& store,
                                              absl::string_view job);

// Makes sure `job`'s directory exists and belongs to `uid` before a save of
// that user writes into it: creates it as uid's with mode 0700, or checks
// that the existing one is uid's (PermissionDenied otherwise, naming the
// owner). A directory the daemon's own user created and left empty (a
// crash between its mkdir and its chown) is given to `uid`. Root (uid 0)
// may save into any job; a job root creates is root's.
absl::Status ClaimJob(const CheckpointStore& store, absl::string_view job, uid_t uid);

}  // namespace ckpt

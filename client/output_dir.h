// OpenOutputDir: the directory an export writes into (`ckptctl export
// --out`), reached without following a symbolic link another user could
// have placed.
//
// Root exports any job; a user's `~/out -> /root-only-dir` would otherwise
// have root write files of the user's choosing where the user may not
// (issue 33, item 5); the same goes for any caller and a path through
// another user's directory. So the path is walked one component at a time
// with O_PATH | O_NOFOLLOW, each from the descriptor of the directory
// before it, as storage/storage_dir.h resolves names under the root. A
// symbolic link is followed only if it and the directory holding it are the
// caller's or root's: nobody else could have put it there (`/scratch ->
// /mnt/scratch` of root's still works; a link in another user's directory
// is refused, naming it, and its target is never touched). Directories on
// the way are held open, so nothing can be swapped in behind the walk.
//
// Why not drop to the job owner's uid and let the kernel decide: the
// client does not know the owner without asking the daemon, credentials in
// a process with gRPC's threads are per thread for setfsuid but process-wide
// for the groups, and root could then no longer export into a directory of
// its own; the walk keeps "write where the caller said" and refuses only
// what another user could redirect.
//
// Thread-safety: a free function; no shared state.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace ckpt {

// Opens the directory `path` (O_RDONLY | O_DIRECTORY), making its last
// component with `mode` if it is missing (the ones above must exist).
// A symlink of another user on the way is FailedPrecondition naming it.
absl::StatusOr<UniqueFd> OpenOutputDir(const std::string& path, mode_t mode);

}  // namespace ckpt

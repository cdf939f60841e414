// ApplyRemoteRetention: retention and garbage collection of one job's
// checkpoints in the remote tier (--remote_keep_last), run by the node that
// moved the job's remote LATEST, after each remote commit, and by node 0 at
// start (storage/remote_tier.h).
//
// It keeps the newest `keep_last` checkpoints committed in the remote tier
// (by their COMMIT's commit time, the name breaking ties) and deletes the
// older ones, and it deletes the remnants of uncommitted remote checkpoints
// that are older than the one remote LATEST names. Its safety rules:
//
//  1. The checkpoint remote LATEST names is never deleted, whatever the
//     clocks say.
//  2. A checkpoint whose upload or remote commit this daemon has queued or
//     running (`in_flight`) is never deleted.
//  3. A checkpoint is deleted DELETING marker first, COMMIT next, so that
//     it stops being committed before any of its objects goes: a crash
//     mid-delete leaves an uncommitted, marked remnant, never a committed
//     partial checkpoint. Then the commit's working state (notices, group
//     records, node manifests: a commit of a remnant still gathering can no
//     longer complete), then the data files, then the server's unfinished
//     uploads under the prefix, the marker last.
//  4. Only objects ckptd creates are deleted: keys below `<job>/` that match
//     the layout of docs/FORMAT.md ("The remote tier's objects"). Anything
//     else is left where it is and logged (and returned in `foreign`).
//  5. An uncommitted checkpoint with the DELETING marker (a delete that a
//     crash cut short) is finished by the next pass, subject to rules 1
//     and 2. A committed one goes only if beyond keep_last or replaced,
//     marked or not.
//  6. An uncommitted checkpoint is a remnant only once it is older than
//     LATEST's: created (a node manifest's created_unix_micros, else
//     `created_locally`) more than `clock_skew` before LATEST's
//     checkpoint was. Another node may still be uploading a newer one; one
//     whose age cannot be told is left (and returned in `kept`).
//
// Whatever keep_last, a committed generation of a name that a newer
// committed generation replaced (common/names.h) is deleted (rules 1 and 2
// still hold), and does not count towards keep_last. `keep_last` 0 keeps
// every other checkpoint and every remnant.
//
// Cost per pass: one listing of `<job>/` by checkpoint, two HEADs per
// checkpoint, a GET of each COMMIT the cache has not seen (COMMIT never
// changes) and of one node manifest per uncommitted checkpoint, then one
// listing and one DELETE per object of each checkpoint deleted.
//
// Thread-safety: ApplyRemoteRetention may run from any thread; concurrent
// passes over one job are harmless (deletes are idempotent). A
// RemoteCommitCache is used by one pass at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "storage/object_store.h"

namespace ckpt {

// The key a delete in progress marks its checkpoint with (docs/FORMAT.md).
inline constexpr absl::string_view kRemoteDeletingName = "DELETING";

struct RemoteRetentionOptions {
  uint32_t keep_last = 0;  // 0: keep all
  // How much older than LATEST's an uncommitted checkpoint must be to be
  // a remnant: the nodes' clocks may disagree by this much.
  absl::Duration clock_skew = absl::Seconds(10);
  // The created_unix_micros of a checkpoint this node knows locally (its
  // local manifest), for a remnant with no node manifest in the remote
  // tier; nullopt if unknown. May be empty.
  std::function<std::optional<int64_t>(const std::string& job, const std::string& checkpoint)>
      created_locally;
};

// What a COMMIT said, kept between passes by its size (a COMMIT is written
// once and never changed while it exists).
struct RemoteCommitTimes {
  uint64_t size = 0;
  int64_t committed_unix_micros = 0;
  int64_t created_unix_micros = 0;
};
using RemoteCommitCache = std::map<std::string, RemoteCommitTimes>;  // key: COMMIT's key

struct RemoteRetentionResult {
  std::vector<std::string> deleted;   // committed checkpoints deleted, oldest first
  std::vector<std::string> remnants;  // uncommitted remnants deleted
  std::vector<std::string> kept;      // uncommitted, not deleted: "<name>: why"
  std::vector<std::string> foreign;   // keys left: not ckptd's
  uint64_t objects_deleted = 0;
};

// One pass over `job` (see above). `latest` is the checkpoint remote
// LATEST names (empty: none yet, and nothing is deleted). Returns the first
// error of a request after which the pass could not go on (a checkpoint
// left half deleted is marked and finished by a later pass).
absl::StatusOr<RemoteRetentionResult> ApplyRemoteRetention(
    ObjectStore& store, const std::string& job, const std::string& latest,
    const std::set<std::string>& in_flight, const RemoteRetentionOptions& options,
    RemoteCommitCache* cache = nullptr);

// Whether `rest`, a key below "<job>/<checkpoint>/", is one ckptd writes
// there (data file, node manifest, group record, notice, COMMIT, DELETING,
// and the node-local commit's keys below local-commit/).
bool IsRemoteCheckpointObject(absl::string_view rest);

}  // namespace ckpt

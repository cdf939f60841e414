// RecoverAtStart: what a daemon does to the storage root before it serves,
// to clean up after an earlier run of its node that crashed.
//
// A crash (kill -9, power loss) never harms a committed checkpoint, but it
// leaves three kinds of debris, which this removes or repairs, logging
// each action:
//
//  1. Temporaries of WriteFileDurably ("<name>.tmp.<tag>.<n>") that were
//     never renamed. Other nodes write temporaries of the same names (COMMIT,
//     LATEST, the marker) into the same directories, and one of theirs may
//     be about to be renamed right now, so only this node's are removed: a
//     temporary whose tag an earlier daemon of this node recorded in the
//     node lock (storage/node_lock.h), one of this node's own manifest
//     (node-NNNN.manifest.tmp.*, which no other node writes), or, on a
//     single-node root, any: no other daemon writes there.
//  2. Uncommitted checkpoints this node was saving. Its saves in flight died
//     with it, so nothing will ever write its missing files or manifest:
//       - one node (nodes == 1): the checkpoint can never commit; its whole
//         directory goes (marker last), unless it holds another node's
//         manifest, which would mean it is not this daemon's alone;
//       - several nodes, this node's manifest missing: the checkpoint can
//         never commit. This node's data files are the ones no other
//         node's manifest lists, which can be told only when every other
//         node's manifest is there; then they go (and the directory, if
//         only the marker is left). Otherwise they stay for gc;
//       - several nodes, this node's manifest written: another node that
//         finishes last may still commit it with these files, so nothing
//         is touched (gc removes it once a newer checkpoint commits).
//     A directory without ckptd's marker is never touched, with one
//     exception that is still this node's: a crash while the marker was
//     being written leaves the directory holding only the marker's
//     temporary; once that temporary (this node's, as in 1.) is removed,
//     the directory, if empty, is removed too (rmdir: never anything in it).
//  3. LATEST behind: a crash between COMMIT and LATEST leaves LATEST naming
//     an older checkpoint (or missing). It is moved to the newest committed
//     checkpoint (committed_unix_micros, then name), forward only
//     (CheckpointStore::UpdateLatest), so a concurrent commit of another
//     node is never undone by it.
//
// Run it before the daemon accepts any save (its own saves would look like
// leftovers) and with the node lock held (another daemon of the node would
// too). A problem with one job or checkpoint is logged and recorded, and
// recovery goes on with the next; only a root that cannot be listed fails it.
//
// Thread-safety: stateless; call it once, at start-up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

struct StartupRecoveryOptions {
  uint32_t node_id = 0;
  uint32_t nodes = 1;
  // Tags of earlier daemons of this node (NodeLock::earlier_temp_tags).
  std::vector<std::string> earlier_temp_tags;
};

// What recovery did, each entry a path or name relative to the root; every
// entry was also logged.
struct StartupRecovery {
  std::vector<std::string> temporaries_removed;  // "job/step-2/COMMIT.tmp.…"
  std::vector<std::string> checkpoints_removed;  // "job/step-2", whole
  std::vector<std::string> parts_removed;  // "job/step-2": this node's files
  // "job/step-2": left empty once its marker's temporary was removed.
  std::vector<std::string> empty_directories_removed;
  std::vector<std::string> latest_repaired;  // "job: step-1 -> step-2"
  std::vector<std::string> left;    // "job/step-2: why it stays"
  std::vector<std::string> errors;  // what could not be done, and why

  // One line for the log: the counts.
  std::string Summary() const;
};

absl::StatusOr<StartupRecovery> RecoverAtStart(
    const CheckpointStore& store, const StartupRecoveryOptions& options);

}  // namespace ckpt

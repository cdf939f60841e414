// Where each checkpoint `ckptctl list` shows is (ListCheckpoints): in this
// daemon's memory tier, in the local root, in the remote tier, and how far
// this node's upload of it has come.
//
// The local root's list comes in (CheckpointStore::List); each entry gets
// its tiers ("memory", "local", "remote") and its upload's progress, and
// the checkpoints committed in the remote tier alone (local retention took
// them, or another node saved them) are added, per job, before that job's
// local ones, oldest first. The remote tier is asked one listing per job
// and one HEAD per checkpoint there, plus a GET of each COMMIT found there
// alone (its size and commit time).
//
// Thread-safety: call from any thread (a gRPC worker); the tiers are.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/v1/control.pb.h"
#include "storage/memory_tier.h"
#include "storage/remote_tier.h"

namespace ckpt {

// Annotates `list` (see above). `memory` and `remote` may be null (off);
// `job` is the list's filter ("" for every job); `shows` says which jobs
// the caller may see; `checkpoint`, if not empty (`job` is not then), asks
// the remote tier for that name and its generations alone. Returns the
// remote tier's error, if asking it failed: the list is still whole for the
// other tiers then.
absl::Status AddCheckpointLocations(const MemoryTier* memory, const RemoteTier* remote,
                                    const std::string& job, const std::string& checkpoint,
                                    const std::function<bool(const std::string&)>& shows,
                                    std::vector<v1::CheckpointInfo>* list);

}  // namespace ckpt

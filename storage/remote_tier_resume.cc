// RemoteTier's resuming, at a daemon's start, of the uploads an earlier
// daemon of this node left unfinished (ResumeUnfinished in
// storage/remote_tier.h), in a file of its own beside the uploads
// (storage/remote_tier.cc).
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "storage/remote_tier.h"
#include "storage/remote_tier_internal.h"

namespace ckpt {

using remote_tier_internal::CheckpointPrefix;

void RemoteTier::ResumeUnfinished() {
  absl::MutexLock lock(&mu_);
  resume_pending_ = true;
}

void RemoteTier::FindUnfinished() {
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = local_->List("");
  if (!all.ok()) {
    LogWarning("remote tier: cannot list the local checkpoints to resume their uploads: ",
               all.status().ToString());
    return;
  }
  std::vector<v1::CheckpointInfo> committed;
  for (const v1::CheckpointInfo& c : *all) {
    if (c.committed()) committed.push_back(c);
  }
  std::sort(committed.begin(), committed.end(), [](const auto& a, const auto& b) {
    return a.committed_unix_micros() > b.committed_unix_micros();
  });
  int resumed = 0;
  std::set<std::string> latest_checked;  // jobs
  // Remote LATEST's commit time per job, read once (0: none).
  std::map<std::string, int64_t> latest_of;
  for (const v1::CheckpointInfo& c : committed) {
    if (stopping_.load()) return;
    // Only checkpoints this node has a part of (its manifest is there).
    if (!local_->ReadNodeManifest(c.job(), c.checkpoint(), options_.node_id).ok()) continue;
    const std::string commit_key = absl::StrCat(CheckpointPrefix(c.job(), c.checkpoint()),
                                                "COMMIT");
    absl::StatusOr<ObjectInfo> remote_commit = remote_->Head(commit_key);
    if (remote_commit.ok()) {
      // A daemon killed between writing COMMIT and moving the remote LATEST
      // (found by the crash test at REMOTE.commit_written) left LATEST
      // naming an older checkpoint: a replacement node restoring "latest"
      // from the remote tier would take that one. The upload itself is
      // done, so it is not queued again; the root moves LATEST forward for
      // the newest one committed there (UpdateLatest never moves it back).
      // The root only: one request per job at start, not one per node.
      if (options_.node_id == 0 && latest_checked.insert(c.job()).second) {
        absl::Status latest = UpdateLatest(c.job(), c.checkpoint());
        if (!latest.ok()) {
          LogWarning(LogFields().Job(c.job()).Checkpoint(c.checkpoint()),
                     "remote tier: cannot check the remote LATEST at start: ",
                     latest.ToString());
        }
      }
      continue;
    }
    if (!absl::IsNotFound(remote_commit.status())) {
      LogWarning(LogFields().Job(c.job()).Checkpoint(c.checkpoint()),
                 "remote tier: cannot tell whether it is committed there: ",
                 remote_commit.status().ToString());
      continue;
    }
    if (options_.retention.keep_last > 0 && OlderThanRemoteLatest(c, latest_of)) {
      continue;  // retention would delete it (it may be one it deleted)
    }
    absl::MutexLock lock(&mu_);
    absl::Status queued = EnqueueLocked(c.job(), c.checkpoint(), /*resumed=*/true);
    if (absl::IsResourceExhausted(queued)) break;
    if (!queued.ok()) {
      LogWarning(LogFields().Job(c.job()).Checkpoint(c.checkpoint()),
                 "remote tier: not resumed: ", queued.ToString());
      continue;
    }
    ++resumed;
  }
  if (resumed > 0) {
    LogInfo("remote tier: resuming ", resumed,
            " upload(s) an earlier daemon left unfinished, newest first");
  }
  RetainAtStart();
}

bool RemoteTier::OlderThanRemoteLatest(const v1::CheckpointInfo& c,
                                       std::map<std::string, int64_t>& latest_of) const {
  auto it = latest_of.find(c.job());
  if (it == latest_of.end()) {
    absl::StatusOr<RemoteLatest> latest = ReadLatest(c.job());
    it = latest_of.emplace(c.job(), latest.ok() ? latest->committed_unix_micros : 0).first;
  }
  return c.committed_unix_micros() < it->second;
}

}  // namespace ckpt

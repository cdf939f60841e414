// RemoteTier's remote retention (storage/remote_retention.h): the passes
// it runs after a remote commit and at start, in a file of their own beside
// the uploads (storage/remote_tier.cc).
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/names.h"
#include "storage/remote_tier.h"

namespace ckpt {

void RemoteTier::RetainAtStart() {
  // A delete an earlier daemon's retention left half done is finished
  // here (and the remnants it would have taken go), by node 0 only, after
  // the resumed uploads are queued (so that they count as in flight).
  if (options_.retention.keep_last == 0 || options_.node_id != 0) return;
  absl::StatusOr<ObjectListing> jobs = remote_->List("", "/");
  if (!jobs.ok()) {
    LogWarning("remote retention: cannot list the jobs of ", remote_->Describe(""), ": ",
               jobs.status().ToString());
    return;
  }
  for (const std::string& prefix : jobs->prefixes) {
    if (stopping_.load()) return;
    absl::string_view job = absl::StripSuffix(prefix, "/");
    if (ValidateStorageName(job, "job").ok()) ApplyRetention(std::string(job));
  }
}

void RemoteTier::ApplyRetention(const std::string& job) {
  absl::StatusOr<RemoteLatest> latest = ReadLatest(job);
  if (!latest.ok()) {
    if (!absl::IsNotFound(latest.status())) {
      LogWarning(LogFields().Job(job), "remote retention: skipped: ",
                 latest.status().ToString());
    }
    return;
  }
  std::set<std::string> in_flight;
  {
    absl::MutexLock lock(&mu_);
    if (running_ != nullptr && running_->progress.job == job &&
        running_->progress.state != RemoteState::kCommitted) {
      in_flight.insert(running_->progress.checkpoint);
    }
    for (const auto& queued : queue_) {
      if (queued->progress.job == job) in_flight.insert(queued->progress.checkpoint);
    }
  }
  RemoteRetentionOptions options = options_.retention;
  // A remnant with no node manifest left is dated by this node's copy.
  options.created_locally = [this](const std::string& j,
                                   const std::string& c) -> std::optional<int64_t> {
    absl::StatusOr<v1::Manifest> manifest = local_->ReadNodeManifest(j, c, options_.node_id);
    if (!manifest.ok()) return std::nullopt;
    return manifest->created_unix_micros();
  };
  absl::StatusOr<RemoteRetentionResult> result = ApplyRemoteRetention(
      *remote_, job, latest->checkpoint, in_flight, options, &retention_cache_);
  if (!result.ok()) {
    LogWarning(LogFields().Job(job), result.status().ToString(),
               " (the next remote commit or start finishes it)");
    return;
  }
  DaemonMetrics::Get().remote_deleted_committed.Add(result->deleted.size());
  DaemonMetrics::Get().remote_deleted_remnants.Add(result->remnants.size());
  if (!result->deleted.empty() || !result->remnants.empty()) {
    LogInfo(LogFields()
                .Job(job)
                .Set("deleted", result->deleted.size())
                .Set("remnants", result->remnants.size())
                .Set("objects", result->objects_deleted),
            "remote retention: deleted checkpoints beyond remote_keep_last ",
            options_.retention.keep_last, " from ", remote_->Describe(absl::StrCat(job, "/")));
  }
}

}  // namespace ckpt

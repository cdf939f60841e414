#include "storage/retention.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "common/log.h"
#include "common/status.h"

namespace ckpt {

absl::StatusOr<std::vector<std::string>> ApplyRetention(const CheckpointStore& store,
                                                        CheckpointLeases& leases,
                                                        const std::string& job,
                                                        uint32_t keep_last) {
  std::vector<std::string> deleted;
  if (keep_last == 0) return deleted;
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> all, store.List(job));
  std::vector<v1::CheckpointInfo> committed;
  for (auto& info : all) {
    if (info.committed()) committed.push_back(std::move(info));
  }
  // Newest first; the name breaks ties so every node picks the same victims.
  std::sort(committed.begin(), committed.end(), [](const auto& a, const auto& b) {
    if (a.committed_unix_micros() != b.committed_unix_micros()) {
      return a.committed_unix_micros() > b.committed_unix_micros();
    }
    return a.checkpoint() > b.checkpoint();
  });
  for (size_t i = keep_last; i < committed.size(); ++i) {
    const std::string& name = committed[i].checkpoint();
    if (committed[i].latest()) continue;  // never, even with skewed clocks
    // Only what ckptd made (a committed checkpoint copied here from another
    // root by hand, or one from before markers, stays).
    const absl::StatusOr<bool> marked = store.IsMarked(job, name);
    if (!marked.ok() || !*marked) {
      LogWarning(LogFields().Job(job).Checkpoint(name),
                 "retention: leaving it: not created by ckptd (no ", kMarkerFileName,
                 marked.ok() ? ")" : absl::StrCat(": ", marked.status().ToString(), ")"));
      continue;
    }
    if (!leases.ClaimForDeletion(job, name)) {
      LogInfo(LogFields().Job(job).Checkpoint(name),
              "retention: being read; deleting it later");
      continue;
    }
    absl::Status status = store.DeleteCommitted(job, name);
    leases.Deleted(job, name);
    RETURN_IF_ERROR(status);
    LogInfo(LogFields().Job(job).Checkpoint(name), "retention: deleted");
    deleted.push_back(name);
  }
  return deleted;
}

}  // namespace ckpt

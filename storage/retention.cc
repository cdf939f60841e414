#include "storage/retention.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

#include "common/log.h"
#include "common/names.h"
#include "common/status.h"

namespace ckpt {

absl::StatusOr<std::vector<std::string>> ApplyRetention(const CheckpointStore& store,
                                                        CheckpointLeases& leases,
                                                        const std::string& job,
                                                        uint32_t keep_last) {
  std::vector<std::string> deleted;
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> all, store.List(job));
  std::vector<v1::CheckpointInfo> committed;
  for (auto& info : all) {
    if (info.committed()) committed.push_back(std::move(info));
  }
  // The newest committed generation of each name (common/names.h).
  std::map<std::string, uint64_t> newest;
  for (const auto& info : committed) {
    const NameGeneration g = SplitGeneration(info.checkpoint());
    uint64_t& n = newest[std::string(g.base)];
    n = std::max(n, g.generation);
  }
  auto superseded = [&](const v1::CheckpointInfo& info) {
    const NameGeneration g = SplitGeneration(info.checkpoint());
    return g.generation < newest[std::string(g.base)];
  };
  // Newest first; the name breaks ties so every node picks the same victims.
  std::sort(committed.begin(), committed.end(), [](const auto& a, const auto& b) {
    if (a.committed_unix_micros() != b.committed_unix_micros()) {
      return a.committed_unix_micros() > b.committed_unix_micros();
    }
    return a.checkpoint() > b.checkpoint();
  });
  uint32_t kept = 0;  // of the ones no newer generation replaced
  for (const v1::CheckpointInfo& info : committed) {
    const std::string& name = info.checkpoint();
    const bool replaced = superseded(info);
    if (!replaced && (keep_last == 0 || kept++ < keep_last)) continue;
    if (info.latest()) continue;  // never, even with skewed clocks
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
              "retention: being read or uploaded; deleting it later");
      continue;
    }
    absl::Status status = store.DeleteCommitted(job, name);
    leases.Deleted(job, name);
    RETURN_IF_ERROR(status);
    LogInfo(LogFields().Job(job).Checkpoint(name), "retention: deleted (",
            replaced ? "a newer generation of its name committed"
                     : absl::StrCat("beyond keep_last ", keep_last),
            ")");
    deleted.push_back(name);
  }
  return deleted;
}

}  // namespace ckpt

#include "storage/garbage_collector.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {

absl::StatusOr<GarbageCollection> CollectGarbage(
    const CheckpointStore& store, absl::string_view job,
    const std::function<bool(const std::string&, const std::string&)>& in_flight) {
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> all, store.List(job));
  std::map<std::string, int64_t> newest;  // job -> newest commit time
  for (const auto& info : all) {
    if (!info.committed()) continue;
    int64_t& t = newest[info.job()];
    t = std::max(t, info.committed_unix_micros());
  }
  GarbageCollection result;
  for (const auto& info : all) {
    auto it = newest.find(info.job());
    if (info.committed() || it == newest.end()) continue;
    const std::string key = absl::StrCat(info.job(), "/", info.checkpoint());
    auto dir = store.OpenCheckpoint(info.job(), info.checkpoint());
    if (!dir.ok()) continue;  // gone since it was listed
    // Only what ckptd made: a directory someone copied under the root (a
    // DCP checkpoint) has no marker and is reported, never deleted.
    const absl::StatusOr<bool> marked = dir->HasFile(kMarkerFileName);
    if (!marked.ok() || !*marked) {
      result.left.push_back(absl::StrCat(
          key, ": not created by ckptd (no ", kMarkerFileName,
          marked.ok() ? ")" : absl::StrCat(": ", marked.status().ToString(), ")")));
      LogWarning(LogFields().Job(info.job()).Checkpoint(info.checkpoint()),
                 "gc: leaving ", result.left.back());
      continue;
    }
    struct stat st;
    if (::fstat(dir->fd(), &st) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("stat ", dir->path()));
    }
    const int64_t modified =
        int64_t{st.st_mtim.tv_sec} * 1'000'000 + st.st_mtim.tv_nsec / 1000;
    if (modified >= it->second) continue;  // may still be in progress elsewhere
    if (in_flight(info.job(), info.checkpoint())) continue;
    // DeleteUncommitted checks the marker and COMMIT again right before it
    // removes anything.
    absl::Status status = store.DeleteUncommitted(info.job(), info.checkpoint());
    if (absl::IsFailedPrecondition(status)) {
      result.left.push_back(absl::StrCat(key, ": ", status.message()));
      LogWarning(LogFields().Job(info.job()).Checkpoint(info.checkpoint()),
                 "gc: leaving ", result.left.back());
      continue;
    }
    RETURN_IF_ERROR(status);
    LogInfo(LogFields().Job(info.job()).Checkpoint(info.checkpoint()),
            "gc: removed uncommitted ", key);
    result.removed.push_back(key);
  }
  return result;
}

}  // namespace ckpt

#include "storage/garbage_collector.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/durable_file.h"

namespace ckpt {

absl::StatusOr<std::vector<std::string>> CollectGarbage(
    const CheckpointStore& store, absl::string_view job,
    const std::function<bool(const std::string&, const std::string&)>& in_flight) {
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> all, store.List(job));
  std::map<std::string, int64_t> newest;  // job -> newest commit time
  for (const auto& info : all) {
    if (!info.committed()) continue;
    int64_t& t = newest[info.job()];
    t = std::max(t, info.committed_unix_micros());
  }
  std::vector<std::string> removed;
  for (const auto& info : all) {
    auto it = newest.find(info.job());
    if (info.committed() || it == newest.end()) continue;
    const std::string dir = store.CheckpointDir(info.job(), info.checkpoint());
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) continue;
    const int64_t modified =
        int64_t{st.st_mtim.tv_sec} * 1'000'000 + st.st_mtim.tv_nsec / 1000;
    if (modified >= it->second) continue;  // may still be in progress elsewhere
    if (in_flight(info.job(), info.checkpoint()) ||
        store.IsCommitted(info.job(), info.checkpoint())) {
      continue;
    }
    RETURN_IF_ERROR(RemoveTree(dir));
    const std::string key = absl::StrCat(info.job(), "/", info.checkpoint());
    LogInfo("gc: removed uncommitted ", key);
    removed.push_back(key);
  }
  return removed;
}

}  // namespace ckpt

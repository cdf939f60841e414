#include "daemon/checkpoint_locations.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/names.h"
#include "common/status.h"

namespace ckpt {

namespace {

std::string Key(const std::string& job, const std::string& checkpoint) {
  return absl::StrCat(job, "/", checkpoint);
}

// The checkpoints of `job` committed in the remote tier, by name (only
// `only` and its generations, if it is not empty).
absl::StatusOr<std::set<std::string>> RemoteCommitted(const RemoteTier& remote,
                                                      const std::string& job,
                                                      const std::string& only) {
  ObjectStore& store = remote.remote();
  ASSIGN_OR_RETURN(ObjectListing listing, store.List(absl::StrCat(job, "/", only), "/"));
  std::set<std::string> committed;
  for (const std::string& prefix : listing.prefixes) {
    absl::string_view name = prefix;
    if (!absl::ConsumePrefix(&name, absl::StrCat(job, "/")) ||
        !absl::ConsumeSuffix(&name, "/") || !ValidateStorageName(name, "checkpoint").ok() ||
        (!only.empty() && !IsGenerationOf(name, only))) {
      continue;
    }
    absl::StatusOr<ObjectInfo> commit = store.Head(absl::StrCat(prefix, "COMMIT"));
    if (commit.ok()) {
      committed.insert(std::string(name));
    } else if (!absl::IsNotFound(commit.status())) {
      return commit.status();
    }
  }
  return committed;
}

}  // namespace

absl::Status AddCheckpointLocations(const MemoryTier* memory, const RemoteTier* remote,
                                    const std::string& job, const std::string& checkpoint,
                                    const std::function<bool(const std::string&)>& shows,
                                    std::vector<v1::CheckpointInfo>* list) {
  for (v1::CheckpointInfo& info : *list) {
    if (memory != nullptr && memory->HoldsComplete(info.job(), info.checkpoint())) {
      info.add_tiers("memory");
    }
    if (info.committed()) info.add_tiers("local");
  }
  if (remote == nullptr) return absl::OkStatus();

  // This node's uploads, the newest record of each checkpoint.
  std::map<std::string, RemoteProgress> uploads;
  for (RemoteProgress& p : remote->Progress()) {
    const std::string key = Key(p.job, p.checkpoint);
    uploads[key] = std::move(p);
  }
  std::set<std::string> jobs;
  if (!job.empty()) {
    jobs.insert(job);
  } else {
    for (const v1::CheckpointInfo& info : *list) jobs.insert(info.job());
    absl::StatusOr<ObjectListing> all = remote->remote().List("", "/");
    if (!all.ok()) return Annotate(all.status(), "listing the remote tier's jobs");
    for (const std::string& prefix : all->prefixes) {
      absl::string_view name = absl::StripSuffix(prefix, "/");
      if (ValidateStorageName(name, "job").ok()) jobs.insert(std::string(name));
    }
  }
  absl::Status failed;
  std::vector<v1::CheckpointInfo> remote_only;
  std::map<std::string, v1::CheckpointInfo*> local;
  for (v1::CheckpointInfo& info : *list) local[Key(info.job(), info.checkpoint())] = &info;
  for (const std::string& j : jobs) {
    if (!shows(j)) continue;
    absl::StatusOr<std::set<std::string>> committed = RemoteCommitted(*remote, j, checkpoint);
    if (!committed.ok()) {
      failed.Update(Annotate(committed.status(), absl::StrCat("job ", j)));
      continue;
    }
    for (const std::string& name : *committed) {
      auto it = local.find(Key(j, name));
      if (it != local.end()) {
        it->second->add_tiers("remote");
        continue;
      }
      absl::StatusOr<v1::CommitRecord> record = remote->ReadCommit(j, name);
      if (absl::IsNotFound(record.status())) continue;  // deleted meanwhile
      if (!record.ok()) {
        failed.Update(record.status());
        continue;
      }
      v1::CheckpointInfo info;
      info.set_job(j);
      info.set_checkpoint(name);
      info.set_committed(true);
      uint64_t bytes = 0;
      for (const v1::DataFile& file : record->index().files()) bytes += file.size();
      info.set_total_bytes(bytes);
      info.set_world_size(record->index().world_size());
      info.set_committed_unix_micros(record->committed_unix_micros());
      info.add_tiers("remote");
      remote_only.push_back(std::move(info));
    }
  }
  for (v1::CheckpointInfo& info : *list) {
    auto it = uploads.find(Key(info.job(), info.checkpoint()));
    if (it != uploads.end()) FillRemoteUpload(it->second, info.mutable_upload());
  }
  // Remote-only ones before the job's local ones, oldest first (the
  // local list is sorted by job and name; std::stable_sort keeps that).
  for (v1::CheckpointInfo& info : remote_only) list->push_back(std::move(info));
  const size_t local_count = list->size() - remote_only.size();
  std::vector<size_t> order(list->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const v1::CheckpointInfo& x = (*list)[a];
    const v1::CheckpointInfo& y = (*list)[b];
    if (x.job() != y.job()) return x.job() < y.job();
    const bool x_remote_only = a >= local_count;
    const bool y_remote_only = b >= local_count;
    if (x_remote_only != y_remote_only) return x_remote_only;
    if (x_remote_only) return x.committed_unix_micros() < y.committed_unix_micros();
    return false;
  });
  std::vector<v1::CheckpointInfo> sorted;
  sorted.reserve(list->size());
  for (size_t i : order) sorted.push_back(std::move((*list)[i]));
  *list = std::move(sorted);
  return failed;
}

}  // namespace ckpt

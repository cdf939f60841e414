#include "storage/startup_recovery.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/durable_file.h"

namespace ckpt {
namespace {

// The node id of a node manifest's exact name ("node-NNNN.manifest").
std::optional<uint32_t> ManifestNode(absl::string_view name) {
  absl::string_view id_text = name;
  uint32_t id = 0;
  if (absl::ConsumePrefix(&id_text, "node-") &&
      absl::ConsumeSuffix(&id_text, ".manifest") &&
      absl::SimpleAtoi(id_text, &id) &&
      CheckpointStore::NodeManifestName(id) == name) {
    return id;
  }
  return std::nullopt;
}

// A name the planner gives data files (plan/node_planner.cc).
bool IsDataFileName(absl::string_view name) {
  return absl::StartsWith(name, "shard-") &&
         absl::EndsWith(name, ".safetensors") &&
         ValidateStorageName(name, "data file").ok();
}

// The files ckptd writes through WriteFileDurably, hence the only targets
// of temporaries it may take for its own without a tag.
bool IsDurableTarget(absl::string_view target) {
  return target == kCommitFileName || target == kLatestFileName ||
         target == kMarkerFileName || ManifestNode(target).has_value();
}

// One recovery pass; collects what it does in `result`.
class Recovery {
 public:
  Recovery(const CheckpointStore& store, const StartupRecoveryOptions& options)
      : store_(store),
        options_(options),
        earlier_tags_(options.earlier_temp_tags.begin(),
                      options.earlier_temp_tags.end()) {}

  absl::Status Run() {
    ASSIGN_OR_RETURN(const StorageDir* root, store_.Root());
    ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, root->List());
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    // ckptd writes no temporary in the root itself; one with an earlier
    // daemon's tag is still its own.
    RemoveTemporaries(*root, "", entries);
    for (const StorageDir::Entry& e : entries) {
      // A symlink is not a directory here: never entered.
      if (!e.is_dir || !ValidateStorageName(e.name, "job").ok()) continue;
      Record(RecoverJob(e.name), e.name);
    }
    return absl::OkStatus();
  }

  StartupRecovery result;

 private:
  // Whether a temporary is this node's (startup_recovery.h says why).
  bool IsOwn(const TemporaryName& temp) const {
    if (earlier_tags_.contains(temp.tag)) return true;
    if (!IsDurableTarget(temp.target)) return false;
    if (temp.target == CheckpointStore::NodeManifestName(options_.node_id)) {
      return true;
    }
    return options_.nodes == 1;
  }

  // Removes this node's temporaries among `entries` of `dir` (`where`: its
  // path under the root, "" for the root) and drops them from `entries`.
  // Returns whether one it removed was of the marker.
  bool RemoveTemporaries(const StorageDir& dir, absl::string_view where,
                         std::vector<StorageDir::Entry>& entries) {
    bool marker_temporary_removed = false;
    std::vector<StorageDir::Entry> kept;
    for (StorageDir::Entry& e : entries) {
      const std::optional<TemporaryName> temp = ParseTemporaryName(e.name);
      if (!e.is_regular || !temp.has_value() || !IsOwn(*temp)) {
        kept.push_back(std::move(e));
        continue;
      }
      const std::string path =
          where.empty() ? e.name : absl::StrCat(where, "/", e.name);
      const absl::Status removed = dir.Unlink(e.name);
      if (removed.ok()) {
        LogInfo("startup recovery: removed temporary ", path);
        result.temporaries_removed.push_back(path);
        if (temp->target == kMarkerFileName) marker_temporary_removed = true;
      } else {
        Record(removed, path);
      }
    }
    entries = std::move(kept);
    return marker_temporary_removed;
  }

  absl::Status RecoverJob(const std::string& job) {
    ASSIGN_OR_RETURN(StorageDir dir, store_.OpenJob(job));
    ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    RemoveTemporaries(dir, job, entries);
    for (const StorageDir::Entry& e : entries) {
      if (!e.is_dir || !ValidateStorageName(e.name, "checkpoint").ok()) continue;
      const std::string key = absl::StrCat(job, "/", e.name);
      Record(RecoverCheckpoint(dir, job, e.name, key), key);
    }
    return RepairLatest(job);
  }

  absl::Status RecoverCheckpoint(const StorageDir& job_dir,
                                 const std::string& job,
                                 const std::string& name,
                                 const std::string& key) {
    ASSIGN_OR_RETURN(StorageDir dir, store_.OpenCheckpoint(job, name));
    ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
    if (RemoveTemporaries(dir, key, entries) && entries.empty()) {
      return RemoveEmptyDirectory(job_dir, dir, name, key);
    }
    bool committed = false, marked = false;
    std::set<uint32_t> manifests;
    std::vector<std::string> data_files;
    for (const StorageDir::Entry& e : entries) {
      // COMMIT of any kind (a symlink planted under its name too) keeps the
      // directory out of reach: never removed as uncommitted.
      if (e.name == kCommitFileName) committed = true;
      if (e.name == kMarkerFileName && e.is_regular) marked = true;
      if (!e.is_regular) continue;
      if (const std::optional<uint32_t> node = ManifestNode(e.name)) {
        manifests.insert(*node);
      } else if (IsDataFileName(e.name)) {
        data_files.push_back(e.name);
      }
    }
    // Not ckptd's, or nothing left to do.
    if (committed || !marked) return absl::OkStatus();
    if (options_.nodes == 1) return RemoveUncommitted(job, name, key, manifests);
    if (manifests.contains(options_.node_id)) {
      Leave(key,
            "this node's part is complete and another node may still commit "
            "the checkpoint with it (ckptctl gc removes it once a newer one "
            "commits)");
      return absl::OkStatus();
    }
    return RemoveNodePart(job, name, key, manifests, data_files);
  }

  // A save makes the checkpoint directory, then writes the marker durably
  // (temporary, rename) before anything else, so a crash before the rename
  // leaves a directory that holds only the marker's temporary: unmarked,
  // hence out of reach of gc and retention. Once recovery removed that
  // temporary, this node's own, the directory is this node's leftover: it
  // goes if it is empty. Another node's save may have made the same
  // directory (multi-node), but that node writes its marker temporary before
  // anything else too; rmdir fails on any entry, so nothing it wrote is
  // deleted (at worst its marker write, racing this, fails the save, which
  // a retry makes again). A directory without this node's marker temporary
  // never reaches here.
  absl::Status RemoveEmptyDirectory(const StorageDir& job_dir,
                                    const StorageDir& dir,
                                    const std::string& name,
                                    const std::string& key) {
    ASSIGN_OR_RETURN(const bool removed, job_dir.RemoveEmptySubdir(name, dir));
    if (!removed) {
      Leave(key,
            "its marker's temporary was removed, but the directory is no "
            "longer empty (another node writes into it): not removing it");
      return absl::OkStatus();
    }
    LogInfo("startup recovery: removed empty checkpoint directory ", key,
            " (its save died before the marker was in place)");
    result.empty_directories_removed.push_back(key);
    return absl::OkStatus();
  }

  // One node: an uncommitted checkpoint of this root is this daemon's and
  // can never commit.
  absl::Status RemoveUncommitted(const std::string& job, const std::string& name,
                                 const std::string& key,
                                 const std::set<uint32_t>& manifests) {
    std::vector<uint32_t> others;
    for (uint32_t node : manifests) {
      if (node != options_.node_id) others.push_back(node);
    }
    if (!others.empty()) {
      Leave(key, absl::StrCat("holds the manifests of nodes [",
                              absl::StrJoin(others, ","),
                              "] though this daemon is its root's only node: "
                              "not removing what may be another daemon's"));
      return absl::OkStatus();
    }
    // Checks the marker and COMMIT again right before it removes anything.
    RETURN_IF_ERROR(store_.DeleteUncommitted(job, name));
    LogInfo("startup recovery: removed uncommitted checkpoint ", key,
            " (its save died with the previous daemon)");
    result.checkpoints_removed.push_back(key);
    return absl::OkStatus();
  }

  // Several nodes, this node's manifest missing: the checkpoint can never
  // commit. Removes this node's data files if they can be told apart.
  absl::Status RemoveNodePart(const std::string& job, const std::string& name,
                              const std::string& key,
                              const std::set<uint32_t>& manifests,
                              const std::vector<std::string>& data_files) {
    std::vector<uint32_t> missing;
    for (uint32_t node = 0; node < options_.nodes; ++node) {
      if (node != options_.node_id && !manifests.contains(node)) {
        missing.push_back(node);
      }
    }
    if (!missing.empty()) {
      if (!data_files.empty()) {
        Leave(key, absl::StrCat(
                       "can never commit (this node's part died with the "
                       "previous daemon), but nodes [",
                       absl::StrJoin(missing, ","),
                       "] have not written their manifests either, so this "
                       "node's data files cannot be told from theirs "
                       "(ckptctl gc removes them once a newer checkpoint "
                       "commits)"));
      }
      return absl::OkStatus();
    }
    // Every other node's part is complete and names its files: the rest
    // are this node's.
    std::set<std::string> listed;
    for (uint32_t node : manifests) {
      if (node == options_.node_id) continue;
      ASSIGN_OR_RETURN(v1::Manifest manifest,
                       store_.ReadNodeManifest(job, name, node));
      for (const v1::DataFile& f : manifest.files()) listed.insert(f.name());
    }
    std::vector<std::string> own;
    for (const std::string& file : data_files) {
      if (!listed.contains(file)) own.push_back(file);
    }
    if (own.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(store_.RemoveNodePart(job, name, options_.node_id, own));
    LogInfo("startup recovery: removed this node's ", own.size(),
            " data files of uncommitted ", key,
            " (its part died with the previous daemon; the checkpoint can "
            "never commit)");
    result.parts_removed.push_back(key);
    return absl::OkStatus();
  }

  // Moves LATEST to the newest committed checkpoint if it is behind.
  absl::Status RepairLatest(const std::string& job) {
    ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> all, store_.List(job));
    const v1::CheckpointInfo* newest = nullptr;
    const v1::CheckpointInfo* current = nullptr;
    for (const v1::CheckpointInfo& info : all) {
      if (!info.committed()) continue;
      if (info.latest()) current = &info;
      if (newest == nullptr ||
          std::make_pair(info.committed_unix_micros(), info.checkpoint()) >
              std::make_pair(newest->committed_unix_micros(),
                             newest->checkpoint())) {
        newest = &info;
      }
    }
    if (newest == nullptr || current == newest) return absl::OkStatus();
    // Committed at the same moment as the newest: not behind.
    if (current != nullptr &&
        current->committed_unix_micros() >= newest->committed_unix_micros()) {
      return absl::OkStatus();
    }
    const absl::StatusOr<std::string> before = store_.ResolveLatest(job);
    RETURN_IF_ERROR(store_.UpdateLatest(job, newest->checkpoint(),
                                        newest->committed_unix_micros()));
    const std::string was =
        current != nullptr ? current->checkpoint()
        : before.ok()      ? absl::StrCat(*before, " (not committed)")
                           : "none";
    const std::string entry =
        absl::StrCat(job, ": ", was, " -> ", newest->checkpoint());
    LogInfo("startup recovery: LATEST of ", entry,
            " (a crash fell between COMMIT and LATEST)");
    result.latest_repaired.push_back(entry);
    return absl::OkStatus();
  }

  void Leave(const std::string& key, absl::string_view why) {
    result.left.push_back(absl::StrCat(key, ": ", why));
    LogInfo("startup recovery: leaving ", result.left.back());
  }

  void Record(const absl::Status& status, absl::string_view where) {
    if (status.ok()) return;
    result.errors.push_back(absl::StrCat(where, ": ", status.ToString()));
    LogError("startup recovery: ", result.errors.back());
  }

  const CheckpointStore& store_;
  const StartupRecoveryOptions& options_;
  const std::set<std::string> earlier_tags_;
};

}  // namespace

std::string StartupRecovery::Summary() const {
  return absl::StrCat(
      "startup recovery: removed ", temporaries_removed.size(),
      " temporaries, ", checkpoints_removed.size(),
      " uncommitted checkpoints and this node's part of ", parts_removed.size(),
      " more; removed ", empty_directories_removed.size(),
      " empty checkpoint directories; repaired LATEST of ",
      latest_repaired.size(), " jobs; left ",
      left.size(), " uncommitted checkpoints; ", errors.size(), " errors");
}

absl::StatusOr<StartupRecovery> RecoverAtStart(
    const CheckpointStore& store, const StartupRecoveryOptions& options) {
  Recovery recovery(store, options);
  RETURN_IF_ERROR(recovery.Run());
  LogInfo(recovery.result.Summary());
  return std::move(recovery.result);
}

}  // namespace ckpt

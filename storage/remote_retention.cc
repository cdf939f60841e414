#include "storage/remote_retention.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "format/manifest_check.h"
#include "format/manifest_file.h"
#include "storage/tree_local_commit.h"

namespace ckpt {

namespace {

constexpr int kTreeIdDigits = 7;  // storage/tree_commit.cc's ids
// A node manifest is well under this (its checks refuse larger ones).
constexpr size_t kMaxManifestBytes = kMaxFramedFileBytes;

// Takes exactly kTreeIdDigits decimal digits from the front of `text`.
bool ConsumeId(absl::string_view& text) {
  if (text.size() < kTreeIdDigits) return false;
  for (int i = 0; i < kTreeIdDigits; ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  text.remove_prefix(kTreeIdDigits);
  return true;
}

// "g-GGGGGGG/node-NNNNNNN.manifest"
bool IsNodeManifestKey(absl::string_view rest) {
  return absl::ConsumePrefix(&rest, "g-") && ConsumeId(rest) &&
         absl::ConsumePrefix(&rest, "/node-") && ConsumeId(rest) && rest == ".manifest";
}

// "g-GGGGGGG/COMMITTED"
bool IsNoticeKey(absl::string_view rest) {
  return absl::ConsumePrefix(&rest, "g-") && ConsumeId(rest) && rest == "/COMMITTED";
}

// "groups/g-GGGGGGG.manifests"
bool IsGroupRecordKey(absl::string_view rest) {
  return absl::ConsumePrefix(&rest, "groups/g-") && ConsumeId(rest) && rest == ".manifests";
}

// A key of a tree commit's working state or its COMMIT, below its prefix
// (the checkpoint's, or its node-local commit's: storage/tree_local_commit.h).
bool IsMeetingKey(absl::string_view rest) {
  return rest == "COMMIT" || IsNodeManifestKey(rest) || IsGroupRecordKey(rest) ||
         IsNoticeKey(rest);
}

// A data file as a manifest may name it (format/manifest_check.cc).
bool IsDataFileKey(absl::string_view rest) {
  return absl::EndsWith(rest, ".safetensors") && ValidateStorageName(rest, "data file").ok();
}

// The order of a delete (rule 3): smaller goes first. The node-local
// commit's keys go with the working state, its COMMIT first among them.
int DeleteRank(absl::string_view rest) {
  if (rest == "COMMIT") return 0;
  if (absl::ConsumePrefix(&rest, kLocalCommitPrefix)) return rest == "COMMIT" ? 1 : DeleteRank(rest);
  if (IsNoticeKey(rest)) return 1;
  if (IsGroupRecordKey(rest)) return 2;
  if (IsNodeManifestKey(rest)) return 3;
  return 4;  // data files
}

struct RemoteCheckpoint {
  std::string name;
  bool committed = false;
  bool marked = false;  // DELETING is there
  bool damaged = false;  // a COMMIT that does not parse: left alone
  RemoteCommitTimes times;
};

class Pass {
 public:
  Pass(ObjectStore& store, const std::string& job, const std::set<std::string>& in_flight,
       const RemoteRetentionOptions& options, RemoteCommitCache* cache)
      : store_(store), job_(job), in_flight_(in_flight), options_(options), cache_(cache) {}

  absl::StatusOr<RemoteRetentionResult> Run(const std::string& latest);

 private:
  std::string Prefix(const std::string& checkpoint) const {
    return absl::StrCat(job_, "/", checkpoint, "/");
  }
  absl::StatusOr<RemoteCheckpoint> Inspect(const std::string& name);
  // created_unix_micros of a node manifest of an uncommitted checkpoint,
  // else of the local copy; nullopt if neither says.
  absl::StatusOr<std::optional<int64_t>> CreatedOf(const std::string& name);
  absl::Status Delete(const RemoteCheckpoint& checkpoint);

  ObjectStore& store_;
  const std::string& job_;
  const std::set<std::string>& in_flight_;
  const RemoteRetentionOptions& options_;
  RemoteCommitCache* const cache_;
  RemoteRetentionResult result_;
};

absl::StatusOr<RemoteCheckpoint> Pass::Inspect(const std::string& name) {
  RemoteCheckpoint c;
  c.name = name;
  const std::string commit_key = absl::StrCat(Prefix(name), "COMMIT");
  absl::StatusOr<ObjectInfo> commit = store_.Head(commit_key);
  if (!commit.ok() && !absl::IsNotFound(commit.status())) return commit.status();
  absl::StatusOr<ObjectInfo> marker =
      store_.Head(absl::StrCat(Prefix(name), kRemoteDeletingName));
  if (!marker.ok() && !absl::IsNotFound(marker.status())) return marker.status();
  c.marked = marker.ok();
  if (!commit.ok()) return c;
  c.committed = true;
  if (cache_ != nullptr) {
    auto it = cache_->find(commit_key);
    if (it != cache_->end() && it->second.size == commit->size) {
      c.times = it->second;
      return c;
    }
  }
  absl::StatusOr<std::string> bytes = GetSmallObject(store_, commit_key, kMaxFramedFileBytes);
  if (absl::IsNotFound(bytes.status())) {
    c.committed = false;  // deleted since the HEAD: a concurrent pass
    return c;
  }
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<v1::CommitRecord> record = ParseCommitFile(*bytes, store_.Describe(commit_key));
  if (!record.ok()) {
    LogWarning(LogFields().Job(job_).Checkpoint(name),
               "remote retention: leaving it: ", record.status().ToString());
    c.damaged = true;
    return c;
  }
  c.times.size = commit->size;
  c.times.committed_unix_micros = record->committed_unix_micros();
  c.times.created_unix_micros = record->index().created_unix_micros();
  if (cache_ != nullptr) (*cache_)[commit_key] = c.times;
  return c;
}

absl::StatusOr<std::optional<int64_t>> Pass::CreatedOf(const std::string& name) {
  const std::string groups = absl::StrCat(Prefix(name), "g-");
  ASSIGN_OR_RETURN(ObjectListing listing, store_.List(groups));
  for (const ObjectInfo& object : listing.objects) {
    absl::string_view rest = object.key;
    if (!absl::ConsumePrefix(&rest, Prefix(name)) || !IsNodeManifestKey(rest)) continue;
    absl::StatusOr<std::string> bytes = GetSmallObject(store_, object.key, kMaxManifestBytes);
    if (absl::IsNotFound(bytes.status())) continue;  // deleted meanwhile
    if (!bytes.ok()) return bytes.status();
    v1::Manifest manifest;
    absl::Status parsed = ParseFramedMessage(kNodeManifestMagic, *bytes,
                                             store_.Describe(object.key), &manifest);
    if (!parsed.ok()) {
      LogWarning(LogFields().Job(job_).Checkpoint(name),
                 "remote retention: cannot date it by its node manifest: ", parsed.ToString());
      continue;
    }
    return std::optional<int64_t>(manifest.created_unix_micros());
  }
  if (options_.created_locally) return options_.created_locally(job_, name);
  return std::optional<int64_t>();
}

absl::Status Pass::Delete(const RemoteCheckpoint& checkpoint) {
  const std::string prefix = Prefix(checkpoint.name);
  const std::string marker = absl::StrCat(prefix, kRemoteDeletingName);
  // Rule 5: marked first, so that a crash anywhere below leaves a
  // checkpoint the next pass recognizes and finishes.
  if (!checkpoint.marked) {
    RETURN_IF_ERROR(Annotate(store_.Put(marker, ""), "remote retention: mark for deletion"));
  }
  // Rule 3: COMMIT before anything else: from here on it is not committed.
  const std::string commit_key = absl::StrCat(prefix, "COMMIT");
  RETURN_IF_ERROR(store_.Delete(commit_key));
  if (cache_ != nullptr) cache_->erase(commit_key);
  ASSIGN_OR_RETURN(ObjectListing listing, store_.List(prefix));
  std::vector<std::pair<int, std::string>> ours;
  for (ObjectInfo& object : listing.objects) {
    absl::string_view rest = object.key;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    if (rest == kRemoteDeletingName || rest == "COMMIT") continue;
    // Rule 4: only what ckptd writes.
    if (!IsRemoteCheckpointObject(rest)) {
      LogWarning(LogFields().Job(job_).Checkpoint(checkpoint.name),
                 "remote retention: leaving ", store_.Describe(object.key),
                 ": not an object ckptd writes");
      result_.foreign.push_back(std::move(object.key));
      continue;
    }
    ours.emplace_back(DeleteRank(rest), std::move(object.key));
  }
  std::stable_sort(ours.begin(), ours.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [rank, key] : ours) {
    RETURN_IF_ERROR(store_.Delete(key));
    ++result_.objects_deleted;
  }
  // What a crashed writer left unfinished under the prefix (S3 multipart
  // uploads are billed until aborted; a directory's temporaries).
  ASSIGN_OR_RETURN(int aborted, store_.AbortUnfinished(prefix, absl::Now()));
  if (aborted > 0) {
    LogInfo(LogFields().Job(job_).Checkpoint(checkpoint.name), "remote retention: aborted ",
            aborted, " unfinished upload(s) under ", store_.Describe(prefix));
  }
  // The marker last: the delete is whole.
  RETURN_IF_ERROR(store_.Delete(marker));
  return absl::OkStatus();
}

absl::StatusOr<RemoteRetentionResult> Pass::Run(const std::string& latest) {
  if (latest.empty()) return result_;
  ASSIGN_OR_RETURN(ObjectListing top, store_.List(absl::StrCat(job_, "/"), "/"));
  for (const ObjectInfo& object : top.objects) {
    if (object.key != absl::StrCat(job_, "/LATEST")) {
      LogWarning(LogFields().Job(job_), "remote retention: leaving ",
                 store_.Describe(object.key), ": not an object ckptd writes");
      result_.foreign.push_back(object.key);
    }
  }
  std::vector<RemoteCheckpoint> checkpoints;
  std::optional<RemoteCheckpoint> latest_checkpoint;
  for (const std::string& p : top.prefixes) {
    absl::string_view name = p;
    if (!absl::ConsumePrefix(&name, absl::StrCat(job_, "/")) ||
        !absl::ConsumeSuffix(&name, "/") || !ValidateStorageName(name, "checkpoint").ok()) {
      LogWarning(LogFields().Job(job_), "remote retention: leaving ", store_.Describe(p),
                 ": not a checkpoint ckptd writes");
      result_.foreign.push_back(p);
      continue;
    }
    ASSIGN_OR_RETURN(RemoteCheckpoint c, Inspect(std::string(name)));
    if (c.name == latest) latest_checkpoint = c;
    if (c.damaged) {
      result_.kept.push_back(absl::StrCat(c.name, ": damaged COMMIT"));
      continue;
    }
    checkpoints.push_back(std::move(c));
  }
  if (!latest_checkpoint.has_value() || !latest_checkpoint->committed ||
      latest_checkpoint->damaged) {
    // LATEST names a checkpoint that is not committed (moved by hand, or a
    // listing that lags): nothing can be dated against it.
    LogWarning(LogFields().Job(job_).Checkpoint(latest),
               "remote retention: skipped: remote LATEST names a checkpoint without COMMIT");
    return result_;
  }
  // Rules 1 and 2: never LATEST's, never one in flight here.
  auto protected_checkpoint = [&](const RemoteCheckpoint& c) {
    return c.name == latest || in_flight_.count(c.name) > 0;
  };

  std::vector<const RemoteCheckpoint*> committed;
  for (const RemoteCheckpoint& c : checkpoints) {
    if (c.committed) committed.push_back(&c);
  }
  // Newest first; the name breaks ties.
  std::sort(committed.begin(), committed.end(), [](const auto* a, const auto* b) {
    if (a->times.committed_unix_micros != b->times.committed_unix_micros) {
      return a->times.committed_unix_micros > b->times.committed_unix_micros;
    }
    return a->name > b->name;
  });
  // What goes: every committed generation of a name that a newer
  // committed generation replaced (common/names.h), and beyond keep_last
  // of the others (0: none of them).
  std::map<std::string, uint64_t> newest;
  for (const RemoteCheckpoint* c : committed) {
    const NameGeneration g = SplitGeneration(c->name);
    uint64_t& n = newest[std::string(g.base)];
    n = std::max(n, g.generation);
  }
  std::set<std::string> beyond, replaced;
  size_t kept = 0;
  for (const RemoteCheckpoint* c : committed) {
    const NameGeneration g = SplitGeneration(c->name);
    if (g.generation < newest[std::string(g.base)]) {
      beyond.insert(c->name);
      replaced.insert(c->name);
    } else if (options_.keep_last > 0 && kept++ >= options_.keep_last) {
      beyond.insert(c->name);
    }
  }

  // Oldest first, so that a pass cut short has removed the oldest.
  std::vector<const RemoteCheckpoint*> order;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) order.push_back(*it);
  for (const RemoteCheckpoint& c : checkpoints) {
    if (!c.committed) order.push_back(&c);
  }
  for (const RemoteCheckpoint* c : order) {
    if (protected_checkpoint(*c)) {
      if (c->marked || beyond.count(c->name) > 0) {
        LogInfo(LogFields().Job(job_).Checkpoint(c->name), "remote retention: kept: ",
                c->name == latest ? "remote LATEST names it" : "its upload is in flight here");
      }
      if (!c->committed) {
        result_.kept.push_back(absl::StrCat(c->name, ": ",
                                            c->name == latest ? "LATEST" : "in flight"));
      }
      continue;
    }
    if (c->committed) {
      // Kept by keep_last. A DELETING marker on one within it is stale (a
      // checkpoint committed again after a delete was cut short): only
      // what is beyond keep_last goes, marked or not.
      if (beyond.count(c->name) == 0) continue;
      RETURN_IF_ERROR(Delete(*c));
      LogInfo(LogFields().Job(job_).Checkpoint(c->name), "remote retention: deleted (",
              replaced.count(c->name) > 0 ? "a newer generation of its name committed"
                  : absl::StrCat("beyond remote_keep_last ", options_.keep_last),
              ")");
      result_.deleted.push_back(c->name);
      continue;
    }
    // Uncommitted: remnants go only under a keep_last (0 keeps all). A
    // marked one is a delete a crash cut short (rule 5).
    if (options_.keep_last == 0 && !c->marked) continue;
    if (!c->marked) {
      // Rule 6: only when older than LATEST's checkpoint.
      ASSIGN_OR_RETURN(std::optional<int64_t> created, CreatedOf(c->name));
      const int64_t latest_created = latest_checkpoint->times.created_unix_micros;
      if (!created.has_value()) {
        result_.kept.push_back(absl::StrCat(c->name, ": age unknown"));
        LogInfo(LogFields().Job(job_).Checkpoint(c->name),
                "remote retention: uncommitted remnant left: no node manifest tells its age");
        continue;
      }
      if (*created + absl::ToInt64Microseconds(options_.clock_skew) >= latest_created) {
        result_.kept.push_back(absl::StrCat(c->name, ": not older than LATEST"));
        continue;  // may still be uploading on another node
      }
    }
    RETURN_IF_ERROR(Delete(*c));
    LogInfo(LogFields().Job(job_).Checkpoint(c->name),
            "remote retention: deleted an uncommitted remnant older than remote LATEST");
    result_.remnants.push_back(c->name);
  }
  return std::move(result_);
}

}  // namespace

bool IsRemoteCheckpointObject(absl::string_view rest) {
  if (absl::ConsumePrefix(&rest, kLocalCommitPrefix)) return IsMeetingKey(rest);
  return rest == "COMMIT" || rest == kRemoteDeletingName || IsDataFileKey(rest) ||
         IsMeetingKey(rest);
}

absl::StatusOr<RemoteRetentionResult> ApplyRemoteRetention(
    ObjectStore& store, const std::string& job, const std::string& latest,
    const std::set<std::string>& in_flight, const RemoteRetentionOptions& options,
    RemoteCommitCache* cache) {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  Pass pass(store, job, in_flight, options, cache);
  absl::StatusOr<RemoteRetentionResult> result = pass.Run(latest);
  if (!result.ok()) {
    return Annotate(result.status(),
                    absl::StrCat("remote retention of ", store.Describe(absl::StrCat(job, "/"))));
  }
  return result;
}

}  // namespace ckpt

#include "storage/checkpoint_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/crash_point.h"
#include "common/names.h"
#include "common/status.h"
#include "format/manifest_check.h"
#include "format/manifest_file.h"
#include "storage/durable_file.h"
#include "storage/object_store.h"

namespace ckpt {
namespace {

// LATEST holds one name and a newline.
constexpr uint64_t kMaxLatestBytes = 4096;

// The keys of the commit protocol's objects in the root's driver: the same
// as the remote tier gives them (storage/remote_tier.h). Names validated
// by the caller.
std::string CheckpointKey(absl::string_view job, absl::string_view checkpoint,
                          absl::string_view name) {
  return absl::StrCat(job, "/", checkpoint, "/", name);
}
std::string LatestKey(absl::string_view job) { return absl::StrCat(job, "/", kLatestFileName); }

absl::StatusOr<std::shared_ptr<PosixObjectStore>> OpenDriver(const std::string& root) {
  ASSIGN_OR_RETURN(std::unique_ptr<PosixObjectStore> driver, PosixObjectStore::Open(root));
  return std::shared_ptr<PosixObjectStore>(std::move(driver));
}

absl::Status ValidateCheckpointName(absl::string_view job,
                                    absl::string_view checkpoint) {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  return ValidateStorageName(checkpoint, "checkpoint");
}

// Deletion is only ever of what ckptd made: a directory without its marker
// (a DCP checkpoint copied under the root, say) is refused.
absl::Status RequireMarked(const StorageDir& dir) {
  ASSIGN_OR_RETURN(bool marked, dir.HasFile(kMarkerFileName));
  if (!marked) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir.path(), " was not created by ckptd (no ", kMarkerFileName,
        "): not deleting it"));
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointStore::CheckpointStore(std::string root)
    : root_(std::move(root)), objects_(OpenDriver(root_)) {}

absl::StatusOr<PosixObjectStore*> CheckpointStore::Driver() const {
  RETURN_IF_ERROR(objects_.status());
  return objects_->get();
}

absl::StatusOr<const StorageDir*> CheckpointStore::Root() const {
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  return &driver->root_dir();
}

absl::StatusOr<std::shared_ptr<PosixObjectStore>> CheckpointStore::Objects() const {
  return objects_;
}

absl::StatusOr<std::string> CheckpointStore::ReadObject(absl::string_view key,
                                                        uint64_t max_bytes) const {
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  return GetSmallObject(*driver, key, max_bytes);
}

std::string CheckpointStore::JobDir(absl::string_view job) const {
  return absl::StrCat(root_, "/", job);
}

std::string CheckpointStore::CheckpointDir(absl::string_view job,
                                           absl::string_view checkpoint) const {
  return absl::StrCat(root_, "/", job, "/", checkpoint);
}

std::string CheckpointStore::NodeManifestName(uint32_t node_id) {
  return absl::StrFormat("node-%04u.manifest", node_id);
}

absl::StatusOr<StorageDir> CheckpointStore::OpenJob(absl::string_view job) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  ASSIGN_OR_RETURN(const StorageDir* root, Root());
  return root->OpenSubdir(job);
}

absl::StatusOr<StorageDir> CheckpointStore::OpenCheckpoint(
    absl::string_view job, absl::string_view checkpoint) const {
  RETURN_IF_ERROR(ValidateCheckpointName(job, checkpoint));
  ASSIGN_OR_RETURN(const StorageDir* root, Root());
  return root->OpenSubdir(absl::StrCat(job, "/", checkpoint));
}

absl::StatusOr<bool> CheckpointStore::IsMarked(absl::string_view job,
                                               absl::string_view checkpoint) const {
  ASSIGN_OR_RETURN(StorageDir dir, OpenCheckpoint(job, checkpoint));
  return dir.HasFile(kMarkerFileName);
}

absl::Status CheckpointStore::PrepareForSave(absl::string_view job,
                                             absl::string_view checkpoint,
                                             uint32_t node_id, FileOps& ops) const {
  RETURN_IF_ERROR(ValidateCheckpointName(job, checkpoint));
  if (checkpoint == kLatestAlias) {
    return absl::InvalidArgumentError(
        "checkpoint name 'latest' is reserved for loading the newest one");
  }
  if (IsCommitted(job, checkpoint)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "checkpoint ", job, "/", checkpoint, " is already committed"));
  }
  ASSIGN_OR_RETURN(const StorageDir* root, Root());
  ASSIGN_OR_RETURN(StorageDir job_dir, root->MakeSubdir(job));
  bool created = false;
  ASSIGN_OR_RETURN(StorageDir dir, job_dir.MakeSubdir(checkpoint, &created));
  ASSIGN_OR_RETURN(bool marked, dir.HasFile(kMarkerFileName));
  if (!marked) {
    // Another node may have made the directory a moment ago: its marker may
    // still be a temporary, or may have been renamed into place since the
    // check above (and its data files may follow). Anything else without a
    // marker means the directory is not ckptd's.
    ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
    const std::string marker_tmp = absl::StrCat(kMarkerFileName, ".tmp.");
    for (const StorageDir::Entry& e : entries) {
      if (e.name == kMarkerFileName && e.is_regular) marked = true;
    }
    for (const StorageDir::Entry& e : entries) {
      if (marked || created || absl::StartsWith(e.name, marker_tmp)) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          dir.path(), " exists and was not created by ckptd (no ", kMarkerFileName,
          "; it holds ", e.name,
          "): refusing to save into it; choose another checkpoint name"));
    }
  }
  if (!marked) {
    // Before any data file: gc and retention delete only marked directories.
    RETURN_IF_ERROR(WriteFileDurably(dir, kMarkerFileName, kMarkerContent, ops));
  }
  return dir.Unlink(NodeManifestName(node_id));
}

absl::Status CheckpointStore::WriteNodeManifest(const v1::Manifest& manifest,
                                                FileOps& ops) const {
  RETURN_IF_ERROR(ValidateCheckpointName(manifest.job(), manifest.checkpoint()));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  return driver->PutThrough(
      CheckpointKey(manifest.job(), manifest.checkpoint(), NodeManifestName(manifest.node_id())),
      FrameMessage(kNodeManifestMagic, manifest), ops,
      PosixObjectStore::MissingDirs::kNotFound);
}

absl::StatusOr<bool> CheckpointStore::CommitExists(
    absl::string_view job, absl::string_view checkpoint) const {
  RETURN_IF_ERROR(ValidateCheckpointName(job, checkpoint));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  absl::StatusOr<ObjectInfo> commit = driver->Head(CheckpointKey(job, checkpoint, kCommitFileName));
  if (absl::IsNotFound(commit.status())) return false;
  RETURN_IF_ERROR(commit.status());
  return true;
}

bool CheckpointStore::IsCommitted(absl::string_view job,
                                  absl::string_view checkpoint) const {
  const absl::StatusOr<bool> exists = CommitExists(job, checkpoint);
  return exists.ok() && *exists;
}

absl::Status CheckpointStore::WriteCommit(const v1::CommitRecord& record,
                                          FileOps& ops) const {
  const v1::Manifest& index = record.index();
  RETURN_IF_ERROR(ValidateCheckpointName(index.job(), index.checkpoint()));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  return driver->PutThrough(CheckpointKey(index.job(), index.checkpoint(), kCommitFileName),
                            FrameMessage(kCommitMagic, record), ops,
                            PosixObjectStore::MissingDirs::kNotFound);
}

absl::Status CheckpointStore::WithdrawCommit(absl::string_view job,
                                             absl::string_view checkpoint) const {
  RETURN_IF_ERROR(ValidateCheckpointName(job, checkpoint));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  // The driver's Delete fsyncs the directory: durably gone before any data
  // file goes, never a COMMIT that a power loss brings back over removed
  // files.
  return driver->Delete(CheckpointKey(job, checkpoint, kCommitFileName));
}

absl::Status CheckpointStore::UpdateLatest(absl::string_view job,
                                           absl::string_view checkpoint,
                                           int64_t committed_unix_micros,
                                           FileOps& ops) const {
  // LATEST moves only after COMMIT is durable, so a reader that follows it
  // always finds a committed checkpoint; and only forward, so a slow commit
  // of an older checkpoint cannot pull it back.
  absl::MutexLock lock(&latest_mu_);
  auto current = ReadCommit(job, kLatestAlias);
  if (current.ok() && current->index().checkpoint() != checkpoint &&
      current->committed_unix_micros() > committed_unix_micros) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ValidateCheckpointName(job, checkpoint));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  return driver->PutThrough(LatestKey(job), absl::StrCat(checkpoint, "\n"), ops,
                            PosixObjectStore::MissingDirs::kNotFound);
}

absl::StatusOr<std::vector<uint32_t>> CheckpointStore::ListNodeManifests(
    absl::string_view job, absl::string_view checkpoint) const {
  RETURN_IF_ERROR(ValidateCheckpointName(job, checkpoint));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  const std::string dir_key = CheckpointKey(job, checkpoint, "");
  // The directory itself must be there: a checkpoint gc removed meanwhile
  // is NotFound, not a checkpoint without manifests yet.
  ASSIGN_OR_RETURN(const StorageDir* root, Root());
  RETURN_IF_ERROR(root->OpenSubdir(absl::StrCat(job, "/", checkpoint)).status());
  ASSIGN_OR_RETURN(ObjectListing listing,
                   driver->List(absl::StrCat(dir_key, "node-"), /*delimiter=*/"/"));
  std::vector<uint32_t> ids;
  for (const ObjectInfo& object : listing.objects) {
    // Exactly "node-NNNN.manifest" (the driver never lists temporaries).
    absl::string_view name = absl::string_view(object.key).substr(dir_key.size());
    const absl::string_view full = name;
    uint32_t id = 0;
    if (absl::ConsumePrefix(&name, "node-") && absl::ConsumeSuffix(&name, ".manifest") &&
        absl::SimpleAtoi(name, &id) && NodeManifestName(id) == full) {
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::StatusOr<v1::Manifest> CheckpointStore::ReadNodeManifest(
    absl::string_view job, absl::string_view checkpoint, uint32_t node_id) const {
  RETURN_IF_ERROR(ValidateCheckpointName(job, checkpoint));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  const std::string key = CheckpointKey(job, checkpoint, NodeManifestName(node_id));
  const std::string path = driver->Describe(key);
  ASSIGN_OR_RETURN(std::string bytes, ReadObject(key, kMaxFramedFileBytes));
  ASSIGN_OR_RETURN(v1::Manifest manifest, ParseNodeManifestFile(bytes, path));
  if (manifest.job() != job || manifest.checkpoint() != checkpoint ||
      manifest.node_id() != node_id) {
    return absl::DataLossError(absl::StrCat(
        path, ": holds the manifest of ", manifest.job(), "/", manifest.checkpoint(),
        " node ", manifest.node_id()));
  }
  return manifest;
}

absl::Status CheckpointStore::RemoveNodePart(
    absl::string_view job, absl::string_view checkpoint, uint32_t node_id,
    const std::vector<std::string>& files) const {
  if (IsCommitted(job, checkpoint)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to remove files of committed checkpoint ", job, "/", checkpoint));
  }
  ASSIGN_OR_RETURN(StorageDir dir, OpenCheckpoint(job, checkpoint));
  std::vector<std::string> names = files;
  names.push_back(NodeManifestName(node_id));
  for (const std::string& name : names) {
    // Names the planner made; checked anyway, since they become paths.
    RETURN_IF_ERROR(ValidateStorageName(name, "data file"));
    RETURN_IF_ERROR(dir.Unlink(name));
  }
  // Other nodes' files keep the directory; that is their part to remove.
  // With only the marker left (and the nodes' meeting, which no node's
  // files stand behind any more), the directory goes, marker last: a
  // later attempt at the name meets afresh.
  ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
  for (const StorageDir::Entry& e : entries) {
    if (e.name != kMarkerFileName && !(e.is_dir && e.name == kMeetingDirName)) {
      return absl::OkStatus();
    }
  }
  ASSIGN_OR_RETURN(StorageDir job_dir, OpenJob(job));
  return job_dir.RemoveTree(checkpoint, kMarkerFileName);
}

absl::Status CheckpointStore::DeleteCommitted(absl::string_view job,
                                              absl::string_view checkpoint) const {
  ASSIGN_OR_RETURN(StorageDir dir, OpenCheckpoint(job, checkpoint));
  RETURN_IF_ERROR(RequireMarked(dir));
  RETURN_IF_ERROR(WithdrawCommit(job, checkpoint));
  CrashPoint("delete_committed", "commit_removed");  // common/crash_point.h
  ASSIGN_OR_RETURN(StorageDir job_dir, OpenJob(job));
  return job_dir.RemoveTree(checkpoint, kMarkerFileName);
}

absl::Status CheckpointStore::DeleteUncommitted(absl::string_view job,
                                                absl::string_view checkpoint) const {
  ASSIGN_OR_RETURN(StorageDir dir, OpenCheckpoint(job, checkpoint));
  RETURN_IF_ERROR(RequireMarked(dir));
  ASSIGN_OR_RETURN(bool committed, dir.HasFile(kCommitFileName));
  if (committed) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir.path(), " is committed: not deleting it as garbage"));
  }
  ASSIGN_OR_RETURN(StorageDir job_dir, OpenJob(job));
  return job_dir.RemoveTree(checkpoint, kMarkerFileName);
}

absl::StatusOr<std::string> CheckpointStore::ResolveLatest(
    absl::string_view job) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  absl::StatusOr<std::string> latest = ReadObject(LatestKey(job), kMaxLatestBytes);
  if (!latest.ok()) {
    if (absl::IsNotFound(latest.status())) {
      return absl::NotFoundError(
          absl::StrCat("job ", job, " has no committed checkpoint"));
    }
    return latest.status();
  }
  std::string name(absl::StripAsciiWhitespace(*latest));
  RETURN_IF_ERROR(Annotate(ValidateStorageName(name, "checkpoint"),
                           absl::StrCat("LATEST of job ", job)));
  return name;
}

absl::StatusOr<v1::CommitRecord> CheckpointStore::ReadCommit(
    absl::string_view job, absl::string_view checkpoint) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  std::string name(checkpoint);
  if (checkpoint == kLatestAlias) {
    ASSIGN_OR_RETURN(name, ResolveLatest(job));
  }
  auto not_found = [&] {
    return absl::NotFoundError(absl::StrCat("checkpoint ", job, "/", name,
                                            " does not exist or is not committed"));
  };
  RETURN_IF_ERROR(ValidateStorageName(name, "checkpoint"));
  ASSIGN_OR_RETURN(PosixObjectStore * driver, Driver());
  const std::string key = CheckpointKey(job, name, kCommitFileName);
  const std::string path = driver->Describe(key);
  auto bytes = ReadObject(key, kMaxFramedFileBytes);
  if (!bytes.ok()) return absl::IsNotFound(bytes.status()) ? not_found() : bytes.status();
  ASSIGN_OR_RETURN(v1::CommitRecord record, ParseCommitFile(*bytes, path));
  // A COMMIT copied from another checkpoint would send readers to that
  // one's directory while the lease is on this one.
  if (record.index().job() != job || record.index().checkpoint() != name) {
    return absl::DataLossError(absl::StrCat(path, ": holds the index of ",
                                            record.index().job(), "/",
                                            record.index().checkpoint()));
  }
  return record;
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::ListDirs(
    const StorageDir& dir) {
  ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
  std::vector<std::string> names;
  for (StorageDir::Entry& e : entries) {
    // A symlink to a directory is not listed: nothing reaches through it.
    if (!e.is_dir || !ValidateStorageName(e.name, "entry").ok()) continue;
    names.push_back(std::move(e.name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> CheckpointStore::List(
    absl::string_view job) const {
  std::vector<std::string> jobs;
  if (job.empty()) {
    ASSIGN_OR_RETURN(const StorageDir* root, Root());
    ASSIGN_OR_RETURN(jobs, ListDirs(*root));
  } else {
    RETURN_IF_ERROR(ValidateStorageName(job, "job"));
    jobs.emplace_back(job);
  }
  std::vector<v1::CheckpointInfo> out;
  for (const std::string& j : jobs) {
    auto job_dir = OpenJob(j);
    if (!job_dir.ok()) {
      if (absl::IsNotFound(job_dir.status())) continue;
      return job_dir.status();
    }
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirs(*job_dir));
    auto latest = ResolveLatest(j);
    for (const std::string& name : names) {
      v1::CheckpointInfo info;
      info.set_job(j);
      info.set_checkpoint(name);
      auto record = ReadCommit(j, name);
      if (record.ok()) {
        info.set_committed(true);
        info.set_latest(latest.ok() && *latest == name);
        info.set_world_size(record->index().world_size());
        info.set_committed_unix_micros(record->committed_unix_micros());
        uint64_t total = 0;
        for (const auto& f : record->index().files()) total += f.size();
        info.set_total_bytes(total);
      }
      out.push_back(std::move(info));
    }
  }
  return out;
}

}  // namespace ckpt

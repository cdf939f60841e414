#include "storage/checkpoint_store.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/names.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "format/manifest_file.h"
#include "storage/durable_file.h"

namespace ckpt {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

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

absl::Status CheckpointStore::PrepareForSave(absl::string_view job,
                                             absl::string_view checkpoint,
                                             uint32_t node_id) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  RETURN_IF_ERROR(ValidateStorageName(checkpoint, "checkpoint"));
  if (checkpoint == kLatestAlias) {
    return absl::InvalidArgumentError(
        "checkpoint name 'latest' is reserved for loading the newest one");
  }
  if (IsCommitted(job, checkpoint)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "checkpoint ", job, "/", checkpoint, " is already committed"));
  }
  RETURN_IF_ERROR(MakeDirDurably(root_, job));
  RETURN_IF_ERROR(MakeDirDurably(JobDir(job), checkpoint));
  const std::string stale = absl::StrCat(CheckpointDir(job, checkpoint), "/",
                                         NodeManifestName(node_id));
  if (::unlink(stale.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("remove stale ", stale));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::WriteNodeManifest(
    const v1::Manifest& manifest) const {
  return WriteFileDurably(CheckpointDir(manifest.job(), manifest.checkpoint()),
                          NodeManifestName(manifest.node_id()),
                          FrameMessage(kNodeManifestMagic, manifest));
}

bool CheckpointStore::IsCommitted(absl::string_view job,
                                  absl::string_view checkpoint) const {
  return Exists(absl::StrCat(CheckpointDir(job, checkpoint), "/",
                             kCommitFileName));
}

absl::Status CheckpointStore::WriteCommit(const v1::CommitRecord& record) const {
  const v1::Manifest& index = record.index();
  return WriteFileDurably(CheckpointDir(index.job(), index.checkpoint()),
                          kCommitFileName, FrameMessage(kCommitMagic, record));
}

absl::Status CheckpointStore::UpdateLatest(absl::string_view job,
                                           absl::string_view checkpoint,
                                           int64_t committed_unix_micros) const {
  // LATEST moves only after COMMIT is durable, so a reader that follows it
  // always finds a committed checkpoint; and only forward, so a slow commit
  // of an older checkpoint cannot pull it back.
  absl::MutexLock lock(&latest_mu_);
  auto current = ReadCommit(job, kLatestAlias);
  if (current.ok() && current->index().checkpoint() != checkpoint &&
      current->committed_unix_micros() > committed_unix_micros) {
    return absl::OkStatus();
  }
  return WriteFileDurably(JobDir(job), kLatestFileName,
                          absl::StrCat(checkpoint, "\n"));
}

absl::StatusOr<std::vector<uint32_t>> CheckpointStore::ListNodeManifests(
    absl::string_view job, absl::string_view checkpoint) const {
  const std::string dir = CheckpointDir(job, checkpoint);
  std::vector<uint32_t> ids;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, absl::StrCat("opendir ", dir));
  while (dirent* e = ::readdir(d)) {
    // Exactly "node-NNNN.manifest"; temporaries have a longer tail.
    absl::string_view name = e->d_name;
    uint32_t id = 0;
    if (absl::ConsumePrefix(&name, "node-") &&
        absl::ConsumeSuffix(&name, ".manifest") && absl::SimpleAtoi(name, &id) &&
        NodeManifestName(id) == e->d_name) {
      ids.push_back(id);
    }
  }
  ::closedir(d);
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::StatusOr<v1::Manifest> CheckpointStore::ReadNodeManifest(
    absl::string_view job, absl::string_view checkpoint, uint32_t node_id) const {
  const std::string path = absl::StrCat(CheckpointDir(job, checkpoint), "/",
                                        NodeManifestName(node_id));
  ASSIGN_OR_RETURN(std::string bytes, ReadSmallFile(path));
  v1::Manifest manifest;
  RETURN_IF_ERROR(ParseFramedMessage(kNodeManifestMagic, bytes, path, &manifest));
  return manifest;
}

absl::Status CheckpointStore::RemoveNodePart(
    absl::string_view job, absl::string_view checkpoint, uint32_t node_id,
    const std::vector<std::string>& files) const {
  const std::string dir = CheckpointDir(job, checkpoint);
  if (IsCommitted(job, checkpoint)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to remove files of committed checkpoint ", job, "/", checkpoint));
  }
  std::vector<std::string> names = files;
  names.push_back(NodeManifestName(node_id));
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("remove ", path));
    }
  }
  // Other nodes' files keep the directory; that is their part to remove.
  if (::rmdir(dir.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST &&
      errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("rmdir ", dir));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::DeleteCommitted(absl::string_view job,
                                              absl::string_view checkpoint) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  RETURN_IF_ERROR(ValidateStorageName(checkpoint, "checkpoint"));
  const std::string dir = CheckpointDir(job, checkpoint);
  const std::string commit = absl::StrCat(dir, "/", kCommitFileName);
  if (::unlink(commit.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("remove ", commit));
  }
  RETURN_IF_ERROR(DefaultFileOps().FsyncDir(dir));
  return RemoveTree(dir);
}

absl::StatusOr<std::string> CheckpointStore::ResolveLatest(
    absl::string_view job) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  auto latest = ReadSmallFile(absl::StrCat(JobDir(job), "/", kLatestFileName));
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
  RETURN_IF_ERROR(ValidateStorageName(name, "checkpoint"));
  const std::string path =
      absl::StrCat(CheckpointDir(job, name), "/", kCommitFileName);
  auto bytes = ReadSmallFile(path);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status())) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", job, "/", name,
                                              " does not exist or is not "
                                              "committed"));
    }
    return bytes.status();
  }
  v1::CommitRecord record;
  RETURN_IF_ERROR(ParseFramedMessage(kCommitMagic, *bytes, path, &record));
  return record;
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::ListDirs(
    const std::string& dir) const {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return names;
    return ErrnoToStatus(errno, absl::StrCat("opendir ", dir));
  }
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (!ValidateStorageName(name, "entry").ok()) continue;
    if (Exists(absl::StrCat(dir, "/", name, "/.")) ) names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> CheckpointStore::List(
    absl::string_view job) const {
  std::vector<std::string> jobs;
  if (job.empty()) {
    ASSIGN_OR_RETURN(jobs, ListDirs(root_));
  } else {
    RETURN_IF_ERROR(ValidateStorageName(job, "job"));
    jobs.emplace_back(job);
  }
  std::vector<v1::CheckpointInfo> out;
  for (const std::string& j : jobs) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirs(JobDir(j)));
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

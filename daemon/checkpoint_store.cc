#include "daemon/checkpoint_store.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/names.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "daemon/durable_file.h"
#include "daemon/manifest_file.h"

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
                                             absl::string_view checkpoint) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  RETURN_IF_ERROR(ValidateStorageName(checkpoint, "checkpoint"));
  if (checkpoint == kLatestAlias) {
    return absl::InvalidArgumentError(
        "checkpoint name 'latest' is reserved for loading the newest one");
  }
  const std::string dir = CheckpointDir(job, checkpoint);
  if (Exists(absl::StrCat(dir, "/", kCommitFileName))) {
    return absl::AlreadyExistsError(absl::StrCat(
        "checkpoint ", job, "/", checkpoint, " is already committed"));
  }
  if (Exists(dir)) RETURN_IF_ERROR(RemoveTree(dir));
  RETURN_IF_ERROR(MakeDirDurably(root_, job));
  return MakeDirDurably(JobDir(job), checkpoint);
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
                                           absl::string_view checkpoint) const {
  // LATEST moves only after COMMIT is durable: a reader that follows it
  // always finds a committed checkpoint.
  std::lock_guard lock(latest_mu_);
  return WriteFileDurably(JobDir(job), kLatestFileName,
                          absl::StrCat(checkpoint, "\n"));
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

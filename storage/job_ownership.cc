#include "storage/job_ownership.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/storage_dir.h"

namespace ckpt {
namespace {

// Orders the mkdir-then-chown of one save against another save's check of
// the same new directory, so that two users racing to create a job cannot
// both come away owning it.
absl::Mutex claim_mu(absl::kConstInit);

absl::Status GiveTo(const StorageDir& dir, uid_t uid) {
  // The mode first, while the daemon still owns the directory: a daemon
  // that is not root (the systemd unit's) may chown (CAP_CHOWN) but has no
  // CAP_FOWNER to chmod what it gave away. The group stays; with mode 0700
  // it grants nothing.
  if (::fchmod(dir.fd(), 0700) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chmod 0700 ", dir.path()));
  }
  if (::fchown(dir.fd(), uid, static_cast<gid_t>(-1)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chown ", dir.path(), " to uid ", uid));
  }
  return dir.Fsync();
}

absl::StatusOr<struct stat> StatDir(const StorageDir& dir) {
  struct stat st {};
  if (::fstat(dir.fd(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", dir.path()));
  }
  return st;
}

}  // namespace

absl::StatusOr<std::optional<uid_t>> JobOwner(const CheckpointStore& store,
                                              absl::string_view job) {
  // Under the claim lock: another rank's first save may be between its
  // mkdir and its chown, when the new directory is still the daemon's own.
  absl::MutexLock lock(&claim_mu);
  absl::StatusOr<StorageDir> dir = store.OpenJob(job);
  if (absl::IsNotFound(dir.status())) return std::optional<uid_t>();
  if (!dir.ok()) return dir.status();
  ASSIGN_OR_RETURN(struct stat st, StatDir(*dir));
  // An empty directory of the daemon's own user belongs to nobody yet (a
  // crash between a mkdir and its chown): ClaimJob gives it to the first
  // saver.
  if (st.st_uid == ::geteuid()) {
    ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir->List());
    if (entries.empty()) return std::optional<uid_t>();
  }
  return std::optional<uid_t>(st.st_uid);
}

absl::Status ClaimJob(const CheckpointStore& store, absl::string_view job, uid_t uid) {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  ASSIGN_OR_RETURN(const StorageDir* root, store.Root());
  absl::MutexLock lock(&claim_mu);
  bool created = false;
  ASSIGN_OR_RETURN(StorageDir dir, root->MakeSubdir(job, &created));
  if (created) return GiveTo(dir, uid);
  ASSIGN_OR_RETURN(struct stat st, StatDir(dir));
  if (st.st_uid == uid || uid == 0) return absl::OkStatus();
  if (st.st_uid == ::geteuid()) {
    ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
    if (entries.empty()) return GiveTo(dir, uid);
  }
  return absl::PermissionDeniedError(absl::StrCat(
      store.JobDir(job), " is owned by uid ", st.st_uid, ", not by uid ", uid));
}

}  // namespace ckpt

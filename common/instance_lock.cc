#include "common/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

// The file's content, up to kMaxRecordBytes.
absl::StatusOr<std::string> ReadRecord(int fd, const std::string& path) {
  std::string record(InstanceLock::kMaxRecordBytes, '\0');
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::pread(fd, record.data() + done, record.size() - done,
                              static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  record.resize(done);
  return record;
}

}  // namespace

absl::StatusOr<InstanceLock> InstanceLock::Acquire(UniqueFd fd,
                                                   std::string path,
                                                   absl::string_view what,
                                                   bool unsupported_ok) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file: cannot use it as a lock"));
  }
  int locked = -1;
  do {
    locked = ::flock(fd.get(), LOCK_EX | LOCK_NB);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    const int err = errno;
    // What file systems without flock answer (Lustre: ENOSYS; NFS mounted
    // nolock: ENOLCK).
    if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK || err == EINVAL) {
      const absl::Status unsupported = ErrnoToStatus(
          err, absl::StrCat("lock ", path, " (the file system has no flock)"));
      if (!unsupported_ok) return unsupported;
      LogWarning(unsupported.ToString(), ": nothing stops a second daemon for ",
                 what, "; mount it with flock support (Lustre: -o flock)");
      ASSIGN_OR_RETURN(std::string previous, ReadRecord(fd.get(), path));
      return InstanceLock(std::move(fd), std::move(path), std::move(previous),
                          /*locked=*/false);
    }
    if (err != EWOULDBLOCK) {
      return ErrnoToStatus(err, absl::StrCat("lock ", path));
    }
    // The first line of the holder's record says who it is; it may not
    // have written it yet.
    absl::StatusOr<std::string> holder = ReadRecord(fd.get(), path);
    const std::string who =
        holder.ok()
            ? std::string(absl::StripAsciiWhitespace(
                  absl::string_view(*holder).substr(0, holder->find('\n'))))
            : std::string(holder.status().message());
    return absl::FailedPreconditionError(absl::StrCat(
        "another ckptd already serves ", what, ": it holds the lock ", path,
        " (", who.empty() ? "it has not recorded its pid yet" : who,
        "); refusing to start a second daemon"));
  }
  ASSIGN_OR_RETURN(std::string previous, ReadRecord(fd.get(), path));
  return InstanceLock(std::move(fd), std::move(path), std::move(previous),
                      /*locked=*/true);
}

absl::StatusOr<InstanceLock> InstanceLock::AcquireAt(std::string path,
                                                     absl::string_view what) {
  UniqueFd fd(
      ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("open lock file ", path));
  }
  return Acquire(std::move(fd), std::move(path), what);
}

absl::Status InstanceLock::WriteRecord(absl::string_view record) {
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::pwrite(fd_.get(), record.data() + done,
                               record.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path_));
    }
    done += static_cast<size_t>(n);
  }
  if (::ftruncate(fd_.get(), static_cast<off_t>(record.size())) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
  }
  if (::fsync(fd_.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync ", path_));
  }
  return absl::OkStatus();
}

}  // namespace ckpt

#include "storage/storage_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/crash_point.h"
#include "common/regular_file.h"
#include "common/status.h"

namespace ckpt {
namespace {

// openat2 has no glibc wrapper on Debian 12 (glibc 2.36).
int OpenBeneath(int dir_fd, const std::string& name, int flags, mode_t mode) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  while (true) {
    const long fd = ::syscall(SYS_openat2, dir_fd, name.c_str(), &how, sizeof(how));
    if (fd >= 0 || errno != EINTR) return static_cast<int>(fd);
  }
}

// The errors that mean "a symlink or a way out of the root was refused" get
// a message that says so; the rest go through ErrnoToStatus.
absl::Status OpenError(int err, const std::string& path) {
  if (err == ELOOP || err == EXDEV) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing ", path,
        ": it is, or goes through, a symbolic link or leads outside the "
        "storage root"));
  }
  if (err == ENOSYS) {
    return absl::UnimplementedError(absl::StrCat(
        "open ", path, ": openat2 is not available (Linux 5.6 or newer is "
        "required to resolve names safely under the storage root)"));
  }
  return ErrnoToStatus(err, absl::StrCat("open ", path));
}

}  // namespace

absl::StatusOr<StorageDir> StorageDir::OpenRoot(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(
          "storage root ", path, " is a symbolic link or not a directory"));
    }
    return ErrnoToStatus(errno, absl::StrCat("open storage root ", path));
  }
  return StorageDir(std::move(fd), path);
}

std::string StorageDir::PathOf(absl::string_view name) const {
  return absl::StrCat(path_, "/", name);
}

absl::StatusOr<UniqueFd> StorageDir::OpenFile(absl::string_view name, int flags,
                                              mode_t mode) const {
  const std::string n(name);
  UniqueFd fd(OpenBeneath(fd_.get(), n, flags, mode));
  if (!fd.valid()) return OpenError(errno, PathOf(name));
  return fd;
}

absl::StatusOr<StorageDir> StorageDir::OpenSubdir(absl::string_view name) const {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(name, O_RDONLY | O_DIRECTORY));
  return StorageDir(std::move(fd), PathOf(name));
}

absl::StatusOr<StorageDir> StorageDir::MakeSubdir(absl::string_view name,
                                                  bool* created) const {
  const std::string n(name);
  // mkdirat does not follow a symlink in its last component (EEXIST); the
  // OpenSubdir below then refuses it.
  const bool made = ::mkdirat(fd_.get(), n.c_str(), 0755) == 0;
  if (!made && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", PathOf(name)));
  }
  if (created != nullptr) *created = made;
  if (made) RETURN_IF_ERROR(Fsync());  // the new entry survives a crash
  return OpenSubdir(name);
}

absl::StatusOr<struct stat> StorageDir::Stat(absl::string_view name) const {
  const std::string n(name);
  struct stat st;
  if (::fstatat(fd_.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", PathOf(name)));
  }
  return st;
}

absl::StatusOr<bool> StorageDir::HasFile(absl::string_view name) const {
  // O_PATH opens without reading; openat2 still refuses every symlink.
  UniqueFd fd(OpenBeneath(fd_.get(), std::string(name), O_PATH, 0));
  if (!fd.valid()) {
    if (errno == ENOENT) return false;
    return OpenError(errno, PathOf(name));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", PathOf(name)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(PathOf(name), " is not a regular file"));
  }
  return true;
}

absl::StatusOr<std::string> StorageDir::ReadFile(absl::string_view name,
                                                 uint64_t max_bytes) const {
  // O_NONBLOCK: a FIFO planted under the name must not hang the open.
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(name, O_RDONLY | O_NONBLOCK));
  return ReadRegularFile(fd.get(), PathOf(name), max_bytes);
}

absl::Status StorageDir::Unlink(absl::string_view name, bool missing_ok) const {
  const std::string n(name);
  if (::unlinkat(fd_.get(), n.c_str(), 0) != 0 && !(missing_ok && errno == ENOENT)) {
    return ErrnoToStatus(errno, absl::StrCat("remove ", PathOf(name)));
  }
  return absl::OkStatus();
}

absl::Status StorageDir::RemoveTree(absl::string_view name,
                                    absl::string_view last) const {
  const std::string n(name);
  struct stat st;
  if (::fstatat(fd_.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, absl::StrCat("stat ", PathOf(name)));
  }
  // Anything but a real directory (a symlink to one above all) goes as
  // itself.
  if (!S_ISDIR(st.st_mode)) return Unlink(name);
  ASSIGN_OR_RETURN(StorageDir dir, OpenSubdir(name));
  ASSIGN_OR_RETURN(std::vector<Entry> entries, dir.List());
  bool has_last = false;
  for (const Entry& e : entries) {
    if (!last.empty() && e.name == last) {
      has_last = true;
      continue;
    }
    if (e.is_dir) {
      RETURN_IF_ERROR(dir.RemoveTree(e.name));
    } else {
      RETURN_IF_ERROR(dir.Unlink(e.name));
    }
  }
  // common/crash_point.h: everything but `last` (the marker) is gone.
  if (has_last) CrashPoint("remove_tree", "last_left");
  if (has_last) RETURN_IF_ERROR(dir.Unlink(last));
  if (::unlinkat(fd_.get(), n.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("rmdir ", PathOf(name)));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> StorageDir::RemoveEmptySubdir(
    absl::string_view name, const StorageDir& expected) const {
  const std::string n(name);
  struct stat held, named;
  if (::fstat(expected.fd(), &held) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", expected.path()));
  }
  if (::fstatat(fd_.get(), n.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    return ErrnoToStatus(errno, absl::StrCat("stat ", PathOf(name)));
  }
  if (!S_ISDIR(named.st_mode) || named.st_dev != held.st_dev ||
      named.st_ino != held.st_ino) {
    return false;
  }
  if (::unlinkat(fd_.get(), n.c_str(), AT_REMOVEDIR) != 0) {
    // Someone wrote into it (or removed it) since it was listed: theirs.
    if (errno == ENOTEMPTY || errno == EEXIST || errno == ENOENT) return false;
    return ErrnoToStatus(errno, absl::StrCat("rmdir ", PathOf(name)));
  }
  RETURN_IF_ERROR(Fsync());
  return true;
}

absl::StatusOr<std::vector<StorageDir::Entry>> StorageDir::List() const {
  // fdopendir takes the descriptor it is given: a fresh one of the same
  // directory, so ours stays open and its position is not shared.
  const int own = ::openat(fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (own < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path_));
  DIR* d = ::fdopendir(own);
  if (d == nullptr) {
    const int err = errno;
    ::close(own);
    return ErrnoToStatus(err, absl::StrCat("opendir ", path_));
  }
  std::vector<Entry> entries;
  absl::Status status;
  while (true) {
    errno = 0;
    dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) status = ErrnoToStatus(errno, absl::StrCat("readdir ", path_));
      break;
    }
    const absl::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    Entry entry;
    entry.name = std::string(name);
    unsigned char type = e->d_type;
    if (type == DT_UNKNOWN) {  // some file systems do not fill d_type
      struct stat st;
      if (::fstatat(own, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed since it was listed
        status = ErrnoToStatus(errno, absl::StrCat("stat ", PathOf(name)));
        break;
      }
      type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_LNK;
    }
    entry.is_dir = type == DT_DIR;
    entry.is_regular = type == DT_REG;
    entries.push_back(std::move(entry));
  }
  ::closedir(d);
  RETURN_IF_ERROR(status);
  return entries;
}

absl::Status StorageDir::Fsync() const {
  if (::fsync(fd_.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync dir ", path_));
  }
  return absl::OkStatus();
}

}  // namespace ckpt

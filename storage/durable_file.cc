#include "storage/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ckpt {

absl::StatusOr<int> FileOps::CreateExclusive(const StorageDir& dir,
                                             const std::string& name) {
  ASSIGN_OR_RETURN(UniqueFd fd,
                   dir.OpenFile(name, O_WRONLY | O_CREAT | O_EXCL, 0644));
  return fd.release();
}

absl::Status FileOps::WriteAll(int fd, absl::string_view bytes,
                               const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FileOps::Fsync(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

absl::Status FileOps::Truncate(int fd, uint64_t size, const std::string& path) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("ftruncate ", path, " to ", size, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status FileOps::Rename(const StorageDir& dir, const std::string& from,
                            const std::string& to) {
  if (::renameat(dir.fd(), from.c_str(), dir.fd(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", dir.PathOf(from), " to ",
                                             dir.PathOf(to)));
  }
  return absl::OkStatus();
}

absl::Status FileOps::FsyncDir(const StorageDir& dir) { return dir.Fsync(); }

FileOps& DefaultFileOps() {
  static FileOps ops;
  return ops;
}

absl::Status WriteFileDurably(const StorageDir& dir, absl::string_view name,
                              absl::string_view bytes, FileOps& ops) {
  // pid, a random per-process salt (daemons on different machines can share
  // a pid and a directory) and a counter: unique among all writers.
  static const uint64_t salt = std::random_device()() * uint64_t{0x9e3779b97f4a7c15};
  static std::atomic<uint64_t> counter{0};
  const std::string target(name);
  const std::string tmp = absl::StrCat(name, ".tmp.", ::getpid(), ".",
                                       absl::Hex(salt), ".", counter.fetch_add(1));
  const std::string tmp_path = dir.PathOf(tmp);
  ASSIGN_OR_RETURN(int raw_fd, ops.CreateExclusive(dir, tmp));
  UniqueFd fd(raw_fd);
  absl::Status status = ops.WriteAll(fd.get(), bytes, tmp_path);
  if (status.ok()) status = ops.Fsync(fd.get(), tmp_path);
  fd.reset();
  // renameat replaces whatever `name` is, a planted symlink included, and
  // never writes through it.
  if (status.ok()) status = ops.Rename(dir, tmp, target);
  if (!status.ok()) {
    // Best effort: a stray temporary is harmless, and the error to report
    // is the step's.
    dir.Unlink(tmp).IgnoreError();
    return status;
  }
  return ops.FsyncDir(dir);
}

absl::Status WriteFileDurably(const std::string& dir, absl::string_view name,
                              absl::string_view bytes, FileOps& ops) {
  ASSIGN_OR_RETURN(StorageDir open, StorageDir::OpenRoot(dir));
  return WriteFileDurably(open, name, bytes, ops);
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::string out;
  char chunk[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(chunk, static_cast<size_t>(n));
  }
  return out;
}

absl::Status MakeDirDurably(const std::string& parent, absl::string_view name) {
  ASSIGN_OR_RETURN(StorageDir dir, StorageDir::OpenRoot(parent));
  return dir.MakeSubdir(name).status();
}

}  // namespace ckpt

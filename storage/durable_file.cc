#include "storage/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ckpt {

absl::StatusOr<int> FileOps::CreateExclusive(const std::string& path) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
  return fd;
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

absl::Status FileOps::Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", from, " to ", to));
  }
  return absl::OkStatus();
}

absl::Status FileOps::FsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open dir ", dir));
  if (::fsync(fd.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync dir ", dir));
  }
  return absl::OkStatus();
}

FileOps& DefaultFileOps() {
  static FileOps ops;
  return ops;
}

absl::Status WriteFileDurably(const std::string& dir, absl::string_view name,
                              absl::string_view bytes, FileOps& ops) {
  const std::string path = absl::StrCat(dir, "/", name);
  // pid, a random per-process salt (daemons on different machines can share
  // a pid and a directory) and a counter: unique among all writers.
  static const uint64_t salt = std::random_device()() * uint64_t{0x9e3779b97f4a7c15};
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".",
                                       absl::Hex(salt), ".", counter.fetch_add(1));
  ASSIGN_OR_RETURN(int raw_fd, ops.CreateExclusive(tmp));
  UniqueFd fd(raw_fd);
  absl::Status status = ops.WriteAll(fd.get(), bytes, tmp);
  if (status.ok()) status = ops.Fsync(fd.get(), tmp);
  fd.reset();
  if (status.ok()) status = ops.Rename(tmp, path);
  if (!status.ok()) {
    ::unlink(tmp.c_str());  // best effort: a stray temporary is harmless
    return status;
  }
  return ops.FsyncDir(dir);
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
  const std::string path = absl::StrCat(parent, "/", name);
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno == EEXIST) return absl::OkStatus();
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", path));
  }
  return DefaultFileOps().FsyncDir(parent);
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("remove ", path));
  return absl::OkStatus();
}

}  // namespace ckpt

#include "storage/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/crash_point.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ckpt {

absl::StatusOr<int> FileOps::CreateExclusive(const StorageDir& dir,
                                             const std::string& name) {
  ASSIGN_OR_RETURN(UniqueFd fd,
                   dir.OpenFile(name, O_WRONLY | O_CREAT | O_EXCL, 0644));
  return fd.release();
}

absl::StatusOr<int> FileOps::CreateDirect(const StorageDir& dir,
                                          const std::string& name) {
  ASSIGN_OR_RETURN(UniqueFd fd, dir.OpenFile(name, O_WRONLY | O_CREAT | O_EXCL | O_DIRECT,
                                             0644));
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

const std::string& TemporaryTag() {
  // pid and a random per-process salt (daemons on different machines can
  // share a pid and a directory): unique among all writers.
  static const std::string* const tag = [] {
    const uint64_t salt = std::random_device()() * uint64_t{0x9e3779b97f4a7c15};
    return new std::string(absl::StrCat(::getpid(), ".", absl::Hex(salt)));
  }();
  return *tag;
}

std::optional<TemporaryName> ParseTemporaryName(absl::string_view name) {
  // From the end: ".<n>", ".<salt>", ".<pid>", ".tmp", and a target before.
  std::vector<absl::string_view> tail;
  absl::string_view rest = name;
  for (int i = 0; i < 3; ++i) {
    const size_t dot = rest.rfind('.');
    if (dot == absl::string_view::npos) return std::nullopt;
    tail.push_back(rest.substr(dot + 1));
    rest = rest.substr(0, dot);
  }
  const absl::string_view n = tail[0], salt = tail[1], pid = tail[2];
  const auto all = [](absl::string_view s, bool (*is)(unsigned char)) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [is](char c) {
      return is(static_cast<unsigned char>(c));
    });
  };
  if (!all(n, absl::ascii_isdigit) || !all(salt, absl::ascii_isxdigit) ||
      !all(pid, absl::ascii_isdigit) ||
      !absl::ConsumeSuffix(&rest, ".tmp") || rest.empty()) {
    return std::nullopt;
  }
  return TemporaryName{std::string(rest), absl::StrCat(pid, ".", salt)};
}

absl::Status WriteFileDurably(const StorageDir& dir, absl::string_view name,
                              absl::string_view bytes, FileOps& ops) {
  return WriteFileDurablyFrom(
      dir, name,
      [&](int fd, const std::string& path) { return ops.WriteAll(fd, bytes, path); }, ops);
}

absl::Status WriteFileDurablyFrom(const StorageDir& dir, absl::string_view name,
                                  const BodyWriter& write_body, FileOps& ops) {
  // The writer's tag and a counter: unique among all writers.
  static std::atomic<uint64_t> counter{0};
  const std::string target(name);
  const std::string tmp = absl::StrCat(name, ".tmp.", TemporaryTag(), ".",
                                       counter.fetch_add(1));
  const std::string tmp_path = dir.PathOf(tmp);
  ASSIGN_OR_RETURN(int raw_fd, ops.CreateExclusive(dir, tmp));
  UniqueFd fd(raw_fd);
  // Crash points (common/crash_point.h; inert unless a test arms one):
  // "<name>.tmp_created", ".tmp_written", ".tmp_synced", ".renamed",
  // ".dir_synced", each right after its step.
  CrashPoint(target, "tmp_created");
  absl::Status status = write_body(fd.get(), tmp_path);
  if (status.ok()) CrashPoint(target, "tmp_written");
  if (status.ok()) status = ops.Fsync(fd.get(), tmp_path);
  if (status.ok()) CrashPoint(target, "tmp_synced");
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
  CrashPoint(target, "renamed");
  RETURN_IF_ERROR(ops.FsyncDir(dir));
  CrashPoint(target, "dir_synced");
  return absl::OkStatus();
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

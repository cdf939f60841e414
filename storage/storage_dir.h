// StorageDir: a directory under the storage root, held open, and the only
// way the daemon names anything inside the root.
//
// The storage root is untrusted input: other nodes write it, an operator
// may copy things into it, and a user with write access to a job directory
// could plant a symbolic link there. The daemon runs as root, so following
// such a link would let it read, overwrite or delete any file of the host.
// Hence every path below the root is resolved relative to a directory
// descriptor with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS): a symlink anywhere in the name (the last component
// included) or a ".." that would climb out fails with ELOOP/EXDEV, reported
// as FailedPrecondition naming the path. The root itself is opened once, by
// the path the operator gave (trusted), with O_NOFOLLOW on its last
// component. Deletion walks with descriptors and unlinkat; a symlink inside
// a tree is removed as a link, never descended.
//
// Linux 5.6+ (openat2). On an older kernel every open fails with a message
// that says so, rather than falling back to following links.
//
// Ownership: owns its descriptor (move-only). Thread-safety: const methods
// may be called concurrently (each uses its own syscalls on the shared fd;
// none changes the fd's offset).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"

namespace ckpt {

class StorageDir {
 public:
  // Opens `path` as a directory: O_DIRECTORY | O_NOFOLLOW, so a root whose
  // last component is a symlink is refused. The components above it are
  // the operator's choice and are followed.
  static absl::StatusOr<StorageDir> OpenRoot(const std::string& path);

  StorageDir(StorageDir&&) = default;
  StorageDir& operator=(StorageDir&&) = default;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  // "<path>/<name>", for messages.
  std::string PathOf(absl::string_view name) const;

  // Opens `name` (a relative path, resolved beneath this directory without
  // following any symlink) with open(2) `flags` and `mode`.
  absl::StatusOr<UniqueFd> OpenFile(absl::string_view name, int flags,
                                    mode_t mode = 0) const;
  // Opens the subdirectory `name`, beneath this one, without symlinks.
  absl::StatusOr<StorageDir> OpenSubdir(absl::string_view name) const;
  // mkdirat (an existing directory is fine; `*created` says which), fsync of
  // this directory when it was created, then OpenSubdir.
  absl::StatusOr<StorageDir> MakeSubdir(absl::string_view name,
                                        bool* created = nullptr) const;

  // lstat of `name` beneath this directory (a symlink is reported as one).
  absl::StatusOr<struct stat> Stat(absl::string_view name) const;
  // True if `name` exists as a regular file beneath this directory, reached
  // without symlinks; false if it does not exist; an error otherwise.
  absl::StatusOr<bool> HasFile(absl::string_view name) const;

  // Reads a whole regular file of at most `max_bytes`; larger files are
  // refused (FailedPrecondition) rather than read into memory.
  absl::StatusOr<std::string> ReadFile(absl::string_view name,
                                       uint64_t max_bytes) const;

  // unlinkat(name); ENOENT is OK when `missing_ok`.
  absl::Status Unlink(absl::string_view name, bool missing_ok = true) const;
  // Removes the subdirectory `name` and everything in it: files and links
  // are unlinked (a link is never followed), subdirectories emptied the same
  // way, walking with descriptors. `last`, if set, is removed after every
  // other entry of `name` itself (the marker that says ckptd made it, so an
  // interrupted removal can be finished later). ENOENT for `name` is OK.
  absl::Status RemoveTree(absl::string_view name,
                          absl::string_view last = {}) const;

  // Removes the subdirectory `name` if it is empty and is still the
  // directory `expected` (held open): unlinkat(AT_REMOVEDIR) fails on a
  // non-empty directory and on a symlink, so what another writer put there
  // meanwhile is never deleted, and the device and inode checked first keep
  // a directory someone swapped in under the name from being removed in its
  // place. Then fsyncs this directory, so the removal survives a power loss.
  // True if removed; false if it was not empty, was replaced or is gone.
  absl::StatusOr<bool> RemoveEmptySubdir(absl::string_view name,
                                         const StorageDir& expected) const;

  struct Entry {
    std::string name;
    bool is_dir = false;      // a real directory (not a link to one)
    bool is_regular = false;  // a regular file
  };
  // Every entry except "." and "..", unsorted.
  absl::StatusOr<std::vector<Entry>> List() const;

  absl::Status Fsync() const;

 private:
  StorageDir(UniqueFd fd, std::string path)
      : fd_(std::move(fd)), path_(std::move(path)) {}

  UniqueFd fd_;
  std::string path_;
};

}  // namespace ckpt

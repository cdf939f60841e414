// Durable small-file writes and directory syncs: the building blocks of the
// commit protocol.
//
// WriteFileDurably(dir, name, bytes) makes `name` appear atomically with
// exactly `bytes` and survive power loss:
//   1. write `bytes` to "<name>.tmp.<pid>.<salt>.<n>" (created O_EXCL; the
//      random salt and counter keep concurrent writers, even daemons on
//      other machines sharing the directory, from sharing a temporary),
//   2. fsync the temporary,
//   3. rename it over `name`,
//   4. fsync the directory so the rename itself is durable.
// A crash before step 3 leaves only a stray temporary that readers ignore; a
// crash after it leaves the complete new file. FileOps is the test seam: a
// test fails each step on purpose and checks the Status that comes back and
// that the old content of `name` is intact.
//
// FileOps is also the seam of the data files' first and last steps (the
// O_DIRECT create, ftruncate to the exact size, fsync: save/shard_writer.cc).
// Their bulk writes go through io/'s IoQueue instead, which sits below
// storage/ and has its own seam.
//
// Every name is resolved beneath an open StorageDir without following
// symlinks (storage/storage_dir.h): the temporary is created O_EXCL beneath
// the directory descriptor, renamed within it, and the same descriptor is
// fsynced, so a link planted under the final or the temporary name is
// neither followed nor written through.
//
// Thread-safety: the functions are; FileOps implementations must be.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/storage_dir.h"

namespace ckpt {

// The syscalls the protocol uses, one method per step so tests can fail any.
class FileOps {
 public:
  virtual ~FileOps() = default;
  // Creates `name` in `dir` O_EXCL (a symlink under the name is not
  // followed: EEXIST).
  virtual absl::StatusOr<int> CreateExclusive(const StorageDir& dir,
                                              const std::string& name);
  // The same for a data file, opened O_DIRECT for the IoQueue's writes
  // (save/shard_writer.cc).
  virtual absl::StatusOr<int> CreateDirect(const StorageDir& dir,
                                           const std::string& name);
  virtual absl::Status WriteAll(int fd, absl::string_view bytes,
                                const std::string& path);
  virtual absl::Status Fsync(int fd, const std::string& path);
  // Sets the size of the open file `fd` (named `path` in errors).
  virtual absl::Status Truncate(int fd, uint64_t size, const std::string& path);
  // renameat within `dir`.
  virtual absl::Status Rename(const StorageDir& dir, const std::string& from,
                              const std::string& to);
  virtual absl::Status FsyncDir(const StorageDir& dir);
};

// The real syscalls.
FileOps& DefaultFileOps();

absl::Status WriteFileDurably(const StorageDir& dir, absl::string_view name,
                              absl::string_view bytes,
                              FileOps& ops = DefaultFileOps());
// The same with the body written by `write_body` into the temporary (open
// for writing, named `path` in errors), piece by piece: a large object
// streamed in bounded memory (posix_object_store.h's PutFromSource).
using BodyWriter = std::function<absl::Status(int fd, const std::string& path)>;
absl::Status WriteFileDurablyFrom(const StorageDir& dir, absl::string_view name,
                                  const BodyWriter& write_body,
                                  FileOps& ops = DefaultFileOps());
// The same in the directory at `dir` (a trusted path: the root itself or a
// test's directory; opened like StorageDir::OpenRoot).
absl::Status WriteFileDurably(const std::string& dir, absl::string_view name,
                              absl::string_view bytes,
                              FileOps& ops = DefaultFileOps());

// The part of this process's temporaries' names that no other writer's
// share: "<pid>.<salt>" (step 1 above). A daemon records it where the next
// daemon of its node finds it (storage/node_lock.h), so that startup
// recovery removes exactly the temporaries an earlier, crashed run left.
const std::string& TemporaryTag();

// A WriteFileDurably temporary's name, taken apart:
// "<target>.tmp.<tag>.<n>", tag "<pid>.<salt>".
struct TemporaryName {
  std::string target;  // the name it was to be renamed to
  std::string tag;     // the writer's TemporaryTag()
};
// The parts of `name` if it has the form of a temporary; nullopt otherwise.
std::optional<TemporaryName> ParseTemporaryName(absl::string_view name);

// Reads a whole (small) file at a trusted path (/proc, a test's file).
// Names under the storage root are read with StorageDir::ReadFile.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

// mkdir that succeeds if the directory exists; then fsyncs the parent so the
// new entry is durable. `parent` is a trusted path.
absl::Status MakeDirDurably(const std::string& parent, absl::string_view name);

}  // namespace ckpt

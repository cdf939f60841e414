// PosixObjectStore: the ObjectStore driver (object_store.h) over a
// directory: a shared file system mounted on every node, or a local one.
// Key "job/step-100/COMMIT" is the file <root>/job/step-100/COMMIT.
//
// The directory is untrusted like the storage root (storage_dir.h): other
// nodes and users write it. The root is opened once, by the operator's
// path, and every key is resolved beneath it one component at a time
// without following any symlink; a symlink anywhere on a key's path is
// refused (FailedPrecondition), never followed, never listed.
//
// How each operation keeps object_store.h's semantics:
//  - Put makes the key's missing directories durably (mkdir, fsync of the
//    parent), then WriteFileDurably: a temporary beside the file, fsync,
//    rename over it, fsync of the directory. A crash leaves the old file
//    and at most a temporary, which AbortUnfinished removes.
//  - Get reads with pread (a range, or the whole file); Head is an fstatat.
//    Only regular files are objects: a directory is NotFound (S3 has no
//    object there either), anything else is refused.
//  - List walks the directories below the prefix's directory: string
//    prefixes like S3's ("job/step-1" matches "job/step-10/x"), sorted,
//    delimiter roll-ups, and a directory that holds no object (what Delete
//    leaves) is never rolled up into a prefix. Names that no key can name
//    (common/names.h) and temporaries are never listed.
//  - Delete unlinks the file (and fsyncs its directory); a missing object
//    is OK. The directories are left, even when empty: removing one would
//    race with a Put on another node that just made it and is about to
//    rename a file into it, and List hides empty directories anyway.
//  - AbortUnfinished removes the WriteFileDurably temporaries (durable_file.h)
//    of keys under the prefix whose last write (mtime) was before the
//    cutoff; a writer still writing touches its temporary and is spared.
//    On a shared file system mtime is set by the writing node's or the
//    server's clock, so the cutoff needs a margin larger than the skew.
//
// What a directory cannot hold, this driver refuses rather than S3:
//  - a key that is also a directory of other keys ("a" beside "a/b"): the
//    second Put fails FailedPrecondition.
//  - a key whose last component has the form of a temporary
//    ("x.tmp.<pid>.<salt>.<n>"): InvalidArgument, since it would be hidden.
//
// Thread-safety: every method may be called from many threads (each uses
// its own descriptors beneath the shared root).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "storage/durable_file.h"
#include "storage/object_store.h"
#include "storage/storage_dir.h"

namespace ckpt {

class PosixObjectStore : public ObjectStore {
 public:
  // Opens `root` (an existing directory; its last component must not be a
  // symlink: StorageDir::OpenRoot).
  static absl::StatusOr<std::unique_ptr<PosixObjectStore>> Open(const std::string& root);

  // "<root>/<key>".
  std::string Describe(absl::string_view key) const override;
  absl::Status Put(absl::string_view key, absl::string_view body) override;
  // Streamed into the temporary part by part (one part buffer), then
  // fsynced and renamed as Put does.
  absl::Status PutFromSource(absl::string_view key, uint64_t size, const PartSource& source,
                             size_t part_size) override;
  absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                             std::optional<ObjectRange> range = std::nullopt) override;
  absl::StatusOr<ObjectInfo> Head(absl::string_view key) override;
  absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                     absl::string_view delimiter = "") override;
  absl::Status Delete(absl::string_view key) override;
  absl::StatusOr<int> AbortUnfinished(absl::string_view prefix,
                                      absl::Time started_before) override;

  // The directory driver's own, for the local root (checkpoint_store.h):
  //  - a Put whose steps go through `ops` (the save's FileOps, so that a
  //    test can fail any of them), and which with `make_dirs` false finds
  //    a missing directory NotFound instead of making it: the root's
  //    checkpoint directories are made, and marked as ckptd's, by
  //    CheckpointStore::PrepareForSave alone;
  //  - the root, held open: what an object interface cannot say (a
  //    directory's foreign files, the O_DIRECT data files, removal of a
  //    tree with its marker last) is done on it, beneath it, without
  //    symlinks (storage_dir.h).
  enum class MissingDirs { kMake, kNotFound };
  absl::Status PutThrough(absl::string_view key, absl::string_view body, FileOps& ops,
                          MissingDirs missing_dirs);
  const StorageDir& root_dir() const { return root_; }

 private:
  // Put's steps (key checks, its directory made or required, the durable
  // write through `ops`) with the body written by `write_body`.
  absl::Status PutWith(absl::string_view key, const BodyWriter& write_body, FileOps& ops,
                       MissingDirs missing_dirs);
  // The directory a key's file lives in, and the file's name there.
  struct Location {
    std::optional<StorageDir> subdir;  // absent: the root itself
    std::string name;
  };

  explicit PosixObjectStore(StorageDir root) : root_(std::move(root)) {}

  // The directory of `key` ("a/b/c": a/b), opened component by component
  // beneath the root; with `create`, missing ones are made durably.
  // NotFound when a component is missing or is not a directory.
  absl::StatusOr<Location> Locate(absl::string_view key, bool create) const;
  const StorageDir& DirOf(const Location& location) const {
    return location.subdir.has_value() ? *location.subdir : root_;
  }

  const StorageDir root_;
};

}  // namespace ckpt

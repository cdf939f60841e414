#include "storage/posix_object_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/aligned_buffer.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "storage/durable_file.h"

namespace ckpt {
namespace {

// ValidateObjectKey, and no last component in the form of a
// WriteFileDurably temporary: List hides those and AbortUnfinished removes
// them, so such an object would vanish.
absl::Status ValidatePosixKey(absl::string_view key) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  const size_t slash = key.rfind('/');
  const absl::string_view name = slash == absl::string_view::npos ? key : key.substr(slash + 1);
  if (ParseTemporaryName(name).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "object key '", key, "': its last component has the form of a temporary "
        "file (<name>.tmp.<pid>.<salt>.<n>), which a directory store never lists"));
  }
  return absl::OkStatus();
}

// OK if `st` is an object's: a regular file. A directory is no object
// (NotFound, as S3 has none under a "directory's" key); a symlink or any
// other kind of file, which the store never makes, is refused.
absl::Status CheckIsObject(const struct stat& st, const std::string& path) {
  if (S_ISREG(st.st_mode)) return absl::OkStatus();
  if (S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("no object ", path, ": it is a directory"));
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("refusing ", path, ": it is a symbolic link"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("refusing ", path, ": it is not a regular file"));
}

// A listable object's file: a name a key can have, and no temporary.
bool IsObjectName(absl::string_view name, absl::string_view key) {
  return !ParseTemporaryName(name).has_value() && ValidateObjectKey(key).ok();
}

// Called with every regular file a walk meets: its directory, its name
// there and its key.
using FileVisitor = std::function<absl::Status(const StorageDir& dir, const std::string& name,
                                               const std::string& key)>;
// Called with every directory at the walk's first level (with its key and
// a trailing '/'): true to walk into it.
using TopDirFilter =
    std::function<absl::StatusOr<bool>(const StorageDir& subdir, const std::string& dir_key)>;

// Walks `dir` (whose keys begin with `dir_key`: "" or ending in '/') and
// the real directories below it, calling `visit` for every regular file;
// at this first level only the entries whose names begin with
// `name_prefix`. Symlinks and other files are skipped, never followed; a
// directory no key can name is not entered; an entry removed while the
// walk runs is skipped.
absl::Status VisitFiles(const StorageDir& dir, const std::string& dir_key,
                        absl::string_view name_prefix, const FileVisitor& visit,
                        const TopDirFilter& enter_top_dir = nullptr) {
  ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
  for (const StorageDir::Entry& entry : entries) {
    if (!absl::StartsWith(entry.name, name_prefix)) continue;
    const std::string key = absl::StrCat(dir_key, entry.name);
    if (entry.is_regular) {
      RETURN_IF_ERROR(visit(dir, entry.name, key));
      continue;
    }
    if (!entry.is_dir || !ValidateObjectKey(key).ok()) continue;
    absl::StatusOr<StorageDir> subdir = dir.OpenSubdir(entry.name);
    if (absl::IsNotFound(subdir.status())) continue;
    if (!subdir.ok()) return subdir.status();
    const std::string sub_key = absl::StrCat(key, "/");
    if (enter_top_dir) {
      ASSIGN_OR_RETURN(const bool enter, enter_top_dir(*subdir, sub_key));
      if (!enter) continue;
    }
    RETURN_IF_ERROR(VisitFiles(*subdir, sub_key, "", visit));
  }
  return absl::OkStatus();
}

// True if `dir` or a directory below it holds an object: whether List
// rolls it up into a prefix (S3 has no empty "directories").
absl::StatusOr<bool> HoldsObject(const StorageDir& dir, const std::string& dir_key) {
  ASSIGN_OR_RETURN(std::vector<StorageDir::Entry> entries, dir.List());
  for (const StorageDir::Entry& entry : entries) {
    const std::string key = absl::StrCat(dir_key, entry.name);
    if (entry.is_regular && IsObjectName(entry.name, key)) return true;
    if (!entry.is_dir || !ValidateObjectKey(key).ok()) continue;
    absl::StatusOr<StorageDir> subdir = dir.OpenSubdir(entry.name);
    if (absl::IsNotFound(subdir.status())) continue;
    if (!subdir.ok()) return subdir.status();
    ASSIGN_OR_RETURN(const bool holds, HoldsObject(*subdir, absl::StrCat(key, "/")));
    if (holds) return true;
  }
  return false;
}

// The keys after `prefix` that contain `delimiter` become the prefix up to
// and including it (S3's roll-up); `listing->objects` is sorted, so equal
// roll-ups are adjacent.
void RollUp(absl::string_view prefix, absl::string_view delimiter, ObjectListing* listing) {
  std::vector<ObjectInfo> kept;
  for (ObjectInfo& object : listing->objects) {
    const absl::string_view rest = absl::string_view(object.key).substr(prefix.size());
    const size_t cut = rest.find(delimiter);
    if (cut == absl::string_view::npos) {
      kept.push_back(std::move(object));
      continue;
    }
    std::string rolled = absl::StrCat(prefix, rest.substr(0, cut + delimiter.size()));
    if (listing->prefixes.empty() || listing->prefixes.back() != rolled) {
      listing->prefixes.push_back(std::move(rolled));
    }
  }
  listing->objects = std::move(kept);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PosixObjectStore>> PosixObjectStore::Open(
    const std::string& root) {
  ASSIGN_OR_RETURN(StorageDir dir, StorageDir::OpenRoot(root));
  return std::unique_ptr<PosixObjectStore>(new PosixObjectStore(std::move(dir)));
}

std::string PosixObjectStore::Describe(absl::string_view key) const {
  return root_.PathOf(key);
}

absl::StatusOr<PosixObjectStore::Location> PosixObjectStore::Locate(absl::string_view key,
                                                                    bool create) const {
  Location location;
  const size_t slash = key.rfind('/');
  if (slash == absl::string_view::npos) {
    location.name = std::string(key);
    return location;
  }
  location.name = std::string(key.substr(slash + 1));
  // A directory that exists already is not fsynced into its parent again:
  // its maker did that right after its mkdir (MakeSubdir). A Put racing
  // that maker may return before that fsync, a window of one fsync,
  // accepted rather than an fsync of every component on every Put.
  for (absl::string_view component : absl::StrSplit(key.substr(0, slash), '/')) {
    const StorageDir& parent = DirOf(location);
    absl::StatusOr<StorageDir> next =
        create ? parent.MakeSubdir(component) : parent.OpenSubdir(component);
    if (!next.ok()) {
      // A file where a directory should be (ENOTDIR: an object "a" when
      // "a/b" is named): there is no object under it, and none can be put.
      absl::StatusOr<struct stat> st = parent.Stat(component);
      if (st.ok() && !S_ISDIR(st->st_mode) && !S_ISLNK(st->st_mode)) {
        const std::string message =
            absl::StrCat(parent.PathOf(component), " is a file, not a directory, so no object ",
                         Describe(key), " can be there");
        return create ? absl::FailedPreconditionError(message) : absl::NotFoundError(message);
      }
      if (absl::IsNotFound(next.status())) {
        return absl::NotFoundError(
            absl::StrCat("no object ", Describe(key), " (", next.status().message(), ")"));
      }
      return Annotate(next.status(), Describe(key));
    }
    location.subdir.emplace(*std::move(next));
  }
  return location;
}

absl::Status PosixObjectStore::Put(absl::string_view key, absl::string_view body) {
  return PutThrough(key, body, DefaultFileOps(), MissingDirs::kMake);
}

absl::Status PosixObjectStore::PutThrough(absl::string_view key, absl::string_view body,
                                          FileOps& ops, MissingDirs missing_dirs) {
  return PutWith(
      key, [&](int fd, const std::string& path) { return ops.WriteAll(fd, body, path); }, ops,
      missing_dirs);
}

absl::Status PosixObjectStore::PutFromSource(absl::string_view key, uint64_t size,
                                             const PartSource& source, size_t part_size) {
  if (part_size == 0) return absl::InvalidArgumentError("part size 0");
  AlignedBuffer scratch;
  RETURN_IF_ERROR(scratch.Allocate(static_cast<size_t>(std::min<uint64_t>(part_size, size))));
  return PutWith(key, [&](int fd, const std::string& path) -> absl::Status {
    for (uint64_t offset = 0; offset < size; offset += part_size) {
      const size_t length = static_cast<size_t>(std::min<uint64_t>(part_size, size - offset));
      ASSIGN_OR_RETURN(absl::string_view part, source(offset, length, scratch.span()));
      if (part.size() != length) {
        return absl::InternalError(absl::StrCat("the source of ", Describe(key), " gave ",
                                                part.size(), " bytes at ", offset, ", not ",
                                                length));
      }
      RETURN_IF_ERROR(DefaultFileOps().WriteAll(fd, part, path));
    }
    return absl::OkStatus();
  }, DefaultFileOps(), MissingDirs::kMake);
}

absl::Status PosixObjectStore::PutWith(absl::string_view key, const BodyWriter& write_body,
                                       FileOps& ops, MissingDirs missing_dirs) {
  RETURN_IF_ERROR(ValidatePosixKey(key));
  ASSIGN_OR_RETURN(Location location, Locate(key, missing_dirs == MissingDirs::kMake));
  const StorageDir& dir = DirOf(location);
  // rename(2) cannot replace a directory (the key is a "directory" of
  // other keys); say so rather than fail at the rename.
  absl::StatusOr<struct stat> existing = dir.Stat(location.name);
  if (existing.ok() && S_ISDIR(existing->st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "put ", Describe(key), ": it is a directory of other objects"));
  }
  absl::Status written = WriteFileDurablyFrom(dir, location.name, write_body, ops);
  if (!written.ok()) return Annotate(written, absl::StrCat("put ", Describe(key)));
  return absl::OkStatus();
}

absl::StatusOr<size_t> PosixObjectStore::Get(absl::string_view key, absl::Span<char> into,
                                             std::optional<ObjectRange> range) {
  RETURN_IF_ERROR(ValidatePosixKey(key));
  ASSIGN_OR_RETURN(Location location, Locate(key, /*create=*/false));
  // O_NONBLOCK: a FIFO planted under the name must not hang the open.
  ASSIGN_OR_RETURN(UniqueFd fd, DirOf(location).OpenFile(location.name,
                                                         O_RDONLY | O_NONBLOCK | O_NOCTTY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", Describe(key)));
  }
  RETURN_IF_ERROR(CheckIsObject(st, Describe(key)));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  ASSIGN_OR_RETURN(const ObjectRange read, PlanObjectRead(size, into.size(), range, Describe(key)));
  uint64_t done = 0;
  while (done < read.length) {
    const ssize_t n = ::pread(fd.get(), into.data() + done, read.length - done,
                              static_cast<off_t>(read.offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", Describe(key)));
    }
    if (n == 0) {
      // Put replaces files by rename, so this file was truncated in place
      // by someone else.
      return absl::DataLossError(absl::StrCat(Describe(key), " ended at byte ",
                                              read.offset + done, " of the ", size,
                                              " it had when opened"));
    }
    done += static_cast<uint64_t>(n);
  }
  return static_cast<size_t>(read.length);
}

absl::StatusOr<ObjectInfo> PosixObjectStore::Head(absl::string_view key) {
  RETURN_IF_ERROR(ValidatePosixKey(key));
  ASSIGN_OR_RETURN(Location location, Locate(key, /*create=*/false));
  ASSIGN_OR_RETURN(const struct stat st, DirOf(location).Stat(location.name));
  RETURN_IF_ERROR(CheckIsObject(st, Describe(key)));
  return ObjectInfo{std::string(key), static_cast<uint64_t>(st.st_size)};
}

absl::StatusOr<ObjectListing> PosixObjectStore::List(absl::string_view prefix,
                                                     absl::string_view delimiter) {
  RETURN_IF_ERROR(ValidateObjectKey(prefix, /*prefix_only=*/true));
  ObjectListing listing;
  // "job/step-1": the entries of directory "job" whose names begin "step-1".
  absl::StatusOr<Location> location = Locate(prefix, /*create=*/false);
  if (absl::IsNotFound(location.status())) return listing;
  if (!location.ok()) return location.status();
  const std::string dir_key(prefix.substr(0, prefix.size() - location->name.size()));

  const FileVisitor add_object = [&listing](const StorageDir& dir, const std::string& name,
                                            const std::string& key) -> absl::Status {
    if (!IsObjectName(name, key)) return absl::OkStatus();
    absl::StatusOr<struct stat> st = dir.Stat(name);
    if (absl::IsNotFound(st.status())) return absl::OkStatus();  // deleted meanwhile
    if (!st.ok()) return st.status();
    if (!S_ISREG(st->st_mode)) return absl::OkStatus();  // replaced meanwhile
    listing.objects.push_back({key, static_cast<uint64_t>(st->st_size)});
    return absl::OkStatus();
  };
  // With "/", every key below a first-level directory rolls up into that
  // directory's prefix: one object found below it settles it, no need to
  // walk the rest.
  TopDirFilter roll_up_dirs;
  if (delimiter == "/") {
    roll_up_dirs = [&listing](const StorageDir& subdir,
                              const std::string& sub_key) -> absl::StatusOr<bool> {
      ASSIGN_OR_RETURN(const bool holds, HoldsObject(subdir, sub_key));
      if (holds) listing.prefixes.push_back(sub_key);
      return false;
    };
  }
  RETURN_IF_ERROR(VisitFiles(DirOf(*location), dir_key, location->name, add_object,
                             roll_up_dirs));

  const auto by_key = [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; };
  std::sort(listing.objects.begin(), listing.objects.end(), by_key);
  if (!delimiter.empty()) RollUp(prefix, delimiter, &listing);
  std::sort(listing.prefixes.begin(), listing.prefixes.end());
  listing.prefixes.erase(std::unique(listing.prefixes.begin(), listing.prefixes.end()),
                         listing.prefixes.end());
  return listing;
}

absl::Status PosixObjectStore::Delete(absl::string_view key) {
  RETURN_IF_ERROR(ValidatePosixKey(key));
  absl::StatusOr<Location> location = Locate(key, /*create=*/false);
  if (absl::IsNotFound(location.status())) return absl::OkStatus();
  if (!location.ok()) return location.status();
  const StorageDir& dir = DirOf(*location);
  absl::StatusOr<struct stat> st = dir.Stat(location->name);
  if (absl::IsNotFound(st.status())) return absl::OkStatus();
  if (!st.ok()) return st.status();
  absl::Status is_object = CheckIsObject(*st, Describe(key));
  if (absl::IsNotFound(is_object)) return absl::OkStatus();  // a directory: no object
  if (!is_object.ok()) return Annotate(is_object, "delete");
  RETURN_IF_ERROR(dir.Unlink(location->name, /*missing_ok=*/true));
  // The removal survives a crash, as the Put did.
  return dir.Fsync();
}

absl::StatusOr<int> PosixObjectStore::AbortUnfinished(absl::string_view prefix,
                                                      absl::Time started_before) {
  RETURN_IF_ERROR(ValidateObjectKey(prefix, /*prefix_only=*/true));
  absl::StatusOr<Location> location = Locate(prefix, /*create=*/false);
  if (absl::IsNotFound(location.status())) return 0;
  if (!location.ok()) return location.status();
  const std::string dir_key(prefix.substr(0, prefix.size() - location->name.size()));
  int removed = 0;
  const FileVisitor remove_stale = [&](const StorageDir& dir, const std::string& name,
                                       const std::string& key) -> absl::Status {
    const std::optional<TemporaryName> temporary = ParseTemporaryName(name);
    if (!temporary.has_value()) return absl::OkStatus();
    // The key the temporary was to become must be under the prefix (the
    // temporary's own name may match a prefix its target does not).
    const std::string target =
        absl::StrCat(absl::string_view(key).substr(0, key.size() - name.size()),
                     temporary->target);
    if (!absl::StartsWith(target, prefix)) return absl::OkStatus();
    absl::StatusOr<struct stat> st = dir.Stat(name);
    if (absl::IsNotFound(st.status())) return absl::OkStatus();  // renamed or removed
    if (!st.ok()) return st.status();
    if (!S_ISREG(st->st_mode) || absl::TimeFromTimespec(st->st_mtim) >= started_before) {
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(dir.Unlink(name, /*missing_ok=*/true));
    ++removed;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(VisitFiles(DirOf(*location), dir_key, location->name, remove_stale));
  return removed;
}

}  // namespace ckpt

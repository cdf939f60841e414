// ObjectStore: the storage seam of both tiers, a narrow key/value
// interface in the style of TensorStore's kvstore drivers and LevelDB's
// Env. Two drivers stand side by side:
//   storage/posix_object_store.h   a directory (a shared file system
//                                   mounted on every node, or a local one;
//                                   the local root's driver too, through
//                                   storage/checkpoint_store.h)
//   storage/s3/s3_object_store.h   an S3 bucket and prefix (s3_client.h)
// and one decorator, storage/counting_object_store.h, that counts the
// requests (the commit's scale simulation and the metrics).
//
// Keys are relative, '/'-separated paths ("job/step-100/COMMIT"); every
// component must be a valid storage name (common/names.h: [A-Za-z0-9._-],
// at most 128 bytes, not "." and no ".."), at most 1024 bytes in all (S3's
// limit). A driver maps them below its
// own root (a directory, or a bucket's prefix): nothing outside it can be
// named. ValidateObjectKey is the one check, and every driver calls it.
//
// The semantics every driver keeps (what the commit protocol relies on):
//  - Put is atomic and durable: once it returns OK the whole object is
//    there and survives a crash of this node; a reader sees the old object,
//    the new one, or none, never part of one. A Put that fails leaves the
//    old object (or none) in place, possibly with a leftover that
//    AbortUnfinished removes later (an S3 multipart upload, a temporary).
//  - After Put returns, Get, Head and List from any node see the object
//    (S3 has been strongly consistent since 2020; a shared file system
//    needs the mount options of docs/OPERATIONS.md).
//  - Delete of a missing object succeeds.
//
// Errors are absl::Status whose message names the object
// (Describe(key): "s3://bucket/prefix/key" or "/shared/dir/key") and the
// server's or the kernel's answer; NotFound means "no such object".
// Credentials never appear in them.
//
// Thread-safety: every driver's methods may be called from many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ckpt {

struct ObjectRange {
  uint64_t offset = 0;
  uint64_t length = 0;  // > 0
};

struct ObjectInfo {
  std::string key;  // relative to the store, as Put named it
  uint64_t size = 0;
};

struct ObjectListing {
  std::vector<ObjectInfo> objects;  // sorted by key
  // With a delimiter: the distinct key prefixes up to and including the
  // delimiter after `prefix` ("job/step-100/"), sorted.
  std::vector<std::string> prefixes;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // Where `key` lives, for messages: "s3://bucket/prefix/key", "/dir/key".
  virtual std::string Describe(absl::string_view key) const = 0;

  // Writes the whole object atomically and durably (see above). Large
  // bodies go in parts where the driver has them (S3 multipart).
  virtual absl::Status Put(absl::string_view key, absl::string_view body) = 0;

  // Supplies the bytes [offset, offset + length) of an object being
  // written: a view of the caller's own memory that stays valid until the
  // put returns (a memory-tier image: no copy), or of `scratch` after
  // filling it (4096-aligned, `length` rounded up to 4096 bytes at least:
  // room for an O_DIRECT read of a local file; the driver gives each part
  // in flight its own). Called one call at a time, in offset order.
  using PartSource = std::function<absl::StatusOr<absl::string_view>(
      uint64_t offset, size_t length, absl::Span<char> scratch)>;

  // Writes an object of `size` bytes taken from `source` in parts of at
  // most `part_size`, with the atomicity and durability of Put. The
  // default gathers the parts into one buffer of `size` bytes (or takes
  // one whole view) and Puts it; drivers for large objects stream them
  // (S3 multipart, a file written part by part) in bounded memory.
  virtual absl::Status PutFromSource(absl::string_view key, uint64_t size,
                                     const PartSource& source, size_t part_size);

  // Reads the object, or `range` of it, into `into`; returns the bytes
  // read. NotFound if there is no object; an error if the object (or
  // range) is larger than `into`, or the range ends past the object.
  virtual absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                                     std::optional<ObjectRange> range = std::nullopt) = 0;

  // Size of the object; NotFound if there is none.
  virtual absl::StatusOr<ObjectInfo> Head(absl::string_view key) = 0;

  // Every object whose key starts with `prefix` (a string prefix, like
  // S3's: "job/step-1" also matches "job/step-10/..."). With a delimiter
  // ("/"), keys with the delimiter after the prefix are rolled up into
  // `prefixes` instead. Leftovers of unfinished Puts are never listed.
  // A rolled-up prefix is a hint, not proof of an object below it: one
  // server (SeaweedFS) lists a prefix whose last object was just deleted
  // for a while (docs/ARCHITECTURE.md, "The object store seam").
  virtual absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                             absl::string_view delimiter = "") = 0;

  // Removes the object; OK if there is none.
  virtual absl::Status Delete(absl::string_view key) = 0;

  // Reads several whole small objects (as GetSmallObject below), up to
  // `parallelism` at a time, since each is a round trip to a server; one
  // result per key, in order. The default runs them on threads of its own;
  // a driver may do better (and the scale simulation charges its time).
  virtual std::vector<absl::StatusOr<std::string>> GetSmallObjects(
      absl::Span<const std::string> keys, size_t max_bytes, int parallelism);

  // Removes what Puts under `prefix` that began before `started_before`
  // left unfinished (a crashed writer's S3 multipart uploads, its
  // temporaries); returns how many. Writers still at work (started later)
  // are left alone.
  virtual absl::StatusOr<int> AbortUnfinished(absl::string_view prefix,
                                              absl::Time started_before) = 0;
};

// OK if `key` is a valid object key (see above); InvalidArgument naming
// the key otherwise. `prefix_only` (List's prefixes) also accepts "" and a
// key ending in '/'; a prefix's last component may be a part of one
// ("job/step-1"), checked by the same rule.
absl::Status ValidateObjectKey(absl::string_view key, bool prefix_only = false);

// For drivers: which bytes Get(key, into, range) reads from an object of
// `object_size` bytes, by Get's rules (`name` names it in errors): the
// whole object when `range` is absent (length 0 only for an empty
// object); OutOfRange if the range ends past the object; InvalidArgument
// for an empty range or bytes that do not fit `into_size`.
absl::StatusOr<ObjectRange> PlanObjectRead(uint64_t object_size, size_t into_size,
                                           std::optional<ObjectRange> range,
                                           absl::string_view name);

// Reads a whole small object (a manifest, COMMIT) into a string; an object
// larger than `max_bytes` is refused (InvalidArgument) without reading it.
absl::StatusOr<std::string> GetSmallObject(ObjectStore& store, absl::string_view key,
                                           size_t max_bytes);

}  // namespace ckpt

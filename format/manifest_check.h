// Semantic checks of a parsed node manifest or COMMIT record.
//
// The frame checksum (format/manifest_file.h) only says the bytes are the
// ones some writer framed; the storage root is shared and untrusted, so a
// frame can be valid and its fields hostile or simply wrong: a zero block
// size, a file index past the file list, a replica set of four billion
// ranks, ranges that overlap or run past the file's end, names with '/' in
// them. Every reader of a manifest (commit, restore, verify, inspect, list)
// runs these checks right after parsing, so that nothing downstream
// divides by zero, indexes out of range, allocates by a stored count or
// builds a path from an unchecked name. A failure is DataLoss naming the
// file and the field.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/manifest.pb.h"

namespace ckpt {

// Bounds on stored fields: far above any real checkpoint, low enough that
// nothing sized by them can exhaust the daemon.
inline constexpr uint32_t kMaxStoredWorldSize = 1u << 24;
inline constexpr uint32_t kMaxStoredNodes = 1u << 20;
inline constexpr uint64_t kMaxStoredChecksumBlockBytes = uint64_t{1} << 30;
inline constexpr int kMaxStoredTensorDims = 64;
// The largest node manifest or COMMIT file a reader reads (a merged index
// of a 70B model at 10,000 nodes is ~5 MB).
inline constexpr uint64_t kMaxFramedFileBytes = uint64_t{256} << 20;

// Checks one manifest (a node's, or a COMMIT's merged index). `what` names
// the file in errors.
absl::Status ValidateManifest(const v1::Manifest& manifest, absl::string_view what);

// Checks a COMMIT record: its own fields, then its index.
absl::Status ValidateCommitRecord(const v1::CommitRecord& record,
                                  absl::string_view what);

// The bytes of a COMMIT file or a node manifest file, as read from storage,
// to a checked message: the frame (magic, length, checksum;
// format/manifest_file.h), the payload's parse, then ValidateCommitRecord or
// ValidateManifest. The one path from stored bytes to a message that the
// store's readers take (and the fuzz targets in fuzz/ exercise).
absl::StatusOr<v1::CommitRecord> ParseCommitFile(absl::string_view bytes,
                                                 absl::string_view what);
absl::StatusOr<v1::Manifest> ParseNodeManifestFile(absl::string_view bytes,
                                                   absl::string_view what);

}  // namespace ckpt

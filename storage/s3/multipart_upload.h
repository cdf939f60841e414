// One large buffer of the caller's uploaded as an S3 multipart upload, with
// several parts in flight at once: the remote tier's bulk path (a node's
// checkpoint files from pinned buffers, issue 30).
//
// The buffer is cut into parts of part_size bytes (the last one shorter);
// parts_in_flight threads take the next part in turn and upload it from the
// caller's memory (no copy), each part retried on its own by the client's
// retry policy. The first part that fails for good stops the others from
// starting new parts, and the upload is aborted, so no half-made upload is
// left on the server to be billed (the abort's own failure is reported
// with the first error; AbortMultipartUploads below finds such leftovers,
// and a crashed daemon's). Memory: the buffer is the caller's; the helper
// holds one ETag per part. Time: each call ends within the client's
// retry.overall_deadline, so the whole upload ends within
// (ceil(parts / parts_in_flight) + 3) overall deadlines (the parts, then
// create, complete or abort), whatever the server does.
//
// Thread-safety: UploadMultipart may run concurrently with any other client
// call; it blocks until every thread it started has ended.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "storage/s3/part_slots.h"
#include "storage/s3/s3_client.h"

namespace ckpt::s3 {

// S3's limits on parts: every part but the last at least 5 MiB, at most
// 5 GiB, and at most 10,000 parts.
inline constexpr size_t kMinPartSize = 5ull << 20;
inline constexpr size_t kMaxPartSize = 5ull << 30;
inline constexpr int kMaxParts = 10'000;

struct MultipartOptions {
  size_t part_size = 64ull << 20;
  int parts_in_flight = 4;  // 1..64
  // Shared by the uploads that run side by side (part_slots.h): each part
  // holds a slot while it is read and sent, and takes its part buffer from
  // the slot. Null: the upload's parts_in_flight threads bound it alone,
  // each with a buffer of its own.
  PartSlots* slots = nullptr;
};

struct MultipartResult {
  std::string etag;
  int parts = 0;
};

absl::StatusOr<MultipartResult> UploadMultipart(S3Client& client, absl::string_view bucket,
                                                absl::string_view key, absl::string_view data,
                                                const MultipartOptions& options);

// The bytes of part `index` (0-based): [offset, offset + length) of the
// object, as a view of memory that stays valid until the upload returns,
// or of `scratch` (part_size bytes, 4096-aligned, the calling thread's own)
// after filling it. Called in part order, one call at a time.
using PartProvider = std::function<absl::StatusOr<absl::string_view>(
    int index, uint64_t offset, size_t length, absl::Span<char> scratch)>;

// The same for an object of `size` bytes whose parts come from `provider`
// (a file read part by part: memory is parts_in_flight part buffers, each
// allocated only when `scratch_needed`).
absl::StatusOr<MultipartResult> UploadMultipartFrom(S3Client& client,
                                                    absl::string_view bucket,
                                                    absl::string_view key, uint64_t size,
                                                    const PartProvider& provider,
                                                    bool scratch_needed,
                                                    const MultipartOptions& options);

struct AbortedUploads {
  int aborted = 0;
  int kept = 0;  // initiated at or after the cutoff, or at a time unreadable
};
// Aborts the unfinished multipart uploads under `prefix` (a crashed
// writer's, whose parts the server keeps, and bills, until aborted);
// with `initiated_before`, only those initiated before it, so that a
// writer still uploading under the prefix is left alone. Tries every one;
// the first failure comes back after the rest were tried.
absl::StatusOr<AbortedUploads> AbortMultipartUploads(
    S3Client& client, absl::string_view bucket, absl::string_view prefix,
    std::optional<absl::Time> initiated_before = std::nullopt);

}  // namespace ckpt::s3

#include "storage/s3/multipart_upload.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/aligned_buffer.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt::s3 {
namespace {

absl::Status CheckOptions(const MultipartOptions& options, size_t data_size, int parts) {
  if (options.part_size < kMinPartSize || options.part_size > kMaxPartSize) {
    return absl::InvalidArgumentError(absl::StrCat("part size ", options.part_size,
                                                   " is outside S3's 5 MiB to 5 GiB"));
  }
  if (options.parts_in_flight < 1 || options.parts_in_flight > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("parts_in_flight ", options.parts_in_flight, " is not 1 to 64"));
  }
  if (options.slots != nullptr && options.slots->part_size() < options.part_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "part slots of ", options.slots->part_size(), " bytes hold no part of ",
        options.part_size));
  }
  if (parts > kMaxParts) {
    return absl::InvalidArgumentError(absl::StrCat(
        data_size, " bytes in parts of ", options.part_size, " are more than S3's ",
        kMaxParts, " parts"));
  }
  return absl::OkStatus();
}

// The first error any part thread met.
class FirstError {
 public:
  void Set(absl::Status status) {
    absl::MutexLock lock(&mutex_);
    if (status_.ok()) status_ = std::move(status);
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  const std::atomic<bool>* failed_flag() const { return &failed_; }
  absl::Status Get() {
    absl::MutexLock lock(&mutex_);
    return status_;
  }

 private:
  absl::Mutex mutex_;
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
  std::atomic<bool> failed_{false};
};

}  // namespace

absl::StatusOr<MultipartResult> UploadMultipart(S3Client& client, absl::string_view bucket,
                                                absl::string_view key, absl::string_view data,
                                                const MultipartOptions& options) {
  return UploadMultipartFrom(
      client, bucket, key, data.size(),
      [data](int, uint64_t offset, size_t length,
             absl::Span<char>) -> absl::StatusOr<absl::string_view> {
        return data.substr(offset, length);
      },
      /*scratch_needed=*/false, options);
}

absl::StatusOr<MultipartResult> UploadMultipartFrom(S3Client& client,
                                                    absl::string_view bucket,
                                                    absl::string_view key, uint64_t size,
                                                    const PartProvider& provider,
                                                    bool scratch_needed,
                                                    const MultipartOptions& options) {
  // An empty object is still one (empty) part: S3 needs at least one.
  const int parts = std::max<int>(
      1, static_cast<int>((size + options.part_size - 1) / options.part_size));
  RETURN_IF_ERROR(CheckOptions(options, size, parts));
  ASSIGN_OR_RETURN(const std::string upload_id, client.CreateMultipartUpload(bucket, key));

  std::vector<CompletedPart> completed(static_cast<size_t>(parts));
  // The provider is called in part order, one call at a time: the part
  // index is taken and its bytes asked for under this lock.
  absl::Mutex provider_mu;
  int next_part = 0;
  FirstError first_error;
  // A shared slot's wait ends within the parts ahead of it (part_slots.h);
  // this bounds it as well: a part's read and its request.
  const absl::Duration slot_wait = 2 * client.options().retry.overall_deadline;
  auto upload_parts = [&] {
    AlignedBuffer own_scratch;
    if (scratch_needed && options.slots == nullptr) {
      if (absl::Status allocated = own_scratch.Allocate(options.part_size); !allocated.ok()) {
        first_error.Set(allocated);
        return;
      }
    }
    while (!first_error.failed()) {
      PartSlots::Slot slot;
      if (options.slots != nullptr) {
        absl::StatusOr<PartSlots::Slot> taken = options.slots->Acquire(
            scratch_needed, absl::Now() + slot_wait, first_error.failed_flag());
        if (!taken.ok()) {
          first_error.Set(Annotate(taken.status(), absl::StrCat("a part of ", key)));
          return;
        }
        slot = *std::move(taken);
      }
      const absl::Span<char> scratch = options.slots != nullptr ? slot.scratch()
                                                                : own_scratch.span();
      int index = 0;
      absl::StatusOr<absl::string_view> body;
      {
        absl::MutexLock lock(&provider_mu);
        index = next_part++;
        if (index >= parts || first_error.failed()) return;
        const uint64_t offset = static_cast<uint64_t>(index) * options.part_size;
        const size_t length =
            static_cast<size_t>(std::min<uint64_t>(options.part_size, size - offset));
        body = provider(index, offset, length, scratch);
        if (body.ok() && body->size() != length) {
          body = absl::InternalError(absl::StrCat("part ", index + 1, " of ", key, " has ",
                                                  body->size(), " bytes, not ", length));
        }
      }
      if (!body.ok()) {
        first_error.Set(body.status());
        return;
      }
      absl::StatusOr<std::string> etag =
          client.UploadPart(bucket, key, upload_id, index + 1, *body);
      if (!etag.ok()) {
        first_error.Set(etag.status());
        return;
      }
      // Each thread writes only the slots of the parts it took.
      completed[static_cast<size_t>(index)] = CompletedPart{index + 1, *std::move(etag)};
    }
  };
  std::vector<std::thread> threads;
  const int thread_count = std::min(options.parts_in_flight, parts);
  threads.reserve(static_cast<size_t>(thread_count));
  for (int i = 0; i < thread_count; ++i) threads.emplace_back(upload_parts);
  for (std::thread& thread : threads) thread.join();

  absl::Status failure = first_error.Get();
  absl::StatusOr<std::string> etag;
  if (failure.ok()) {
    etag = client.CompleteMultipartUpload(bucket, key, upload_id, completed);
    if (etag.ok()) return MultipartResult{*std::move(etag), parts};
    failure = etag.status();
  }
  // Nothing half-made stays on the server: abort, and say if that failed
  // too (the upload id lets an operator or startup recovery finish it).
  if (const absl::Status aborted = client.AbortMultipartUpload(bucket, key, upload_id);
      !aborted.ok()) {
    LogWarning(LogFields().Set("upload_id", upload_id),
               "aborting a failed multipart upload failed too: ", aborted.message());
    return Annotate(failure, absl::StrCat("multipart upload ", upload_id,
                                          " failed and could not be aborted (",
                                          aborted.message(), ")"));
  }
  return Annotate(failure, absl::StrCat("multipart upload ", upload_id, " aborted"));
}

absl::StatusOr<AbortedUploads> AbortMultipartUploads(S3Client& client,
                                                     absl::string_view bucket,
                                                     absl::string_view prefix,
                                                     std::optional<absl::Time> initiated_before) {
  ASSIGN_OR_RETURN(const std::vector<MultipartUploadSummary> uploads,
                   client.ListMultipartUploads(bucket, prefix));
  AbortedUploads result;
  absl::Status first_failure;
  for (const MultipartUploadSummary& upload : uploads) {
    if (initiated_before) {
      absl::Time initiated;
      std::string error;
      // S3 writes "2026-11-27T08:00:00.000Z".
      if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", upload.initiated, &initiated, &error) ||
          initiated >= *initiated_before) {
        ++result.kept;
        continue;
      }
    }
    const absl::Status aborted = client.AbortMultipartUpload(bucket, upload.key, upload.upload_id);
    if (aborted.ok()) {
      ++result.aborted;
    } else if (first_failure.ok()) {
      first_failure = aborted;
    }
  }
  if (!first_failure.ok()) return first_failure;
  return result;
}

}  // namespace ckpt::s3

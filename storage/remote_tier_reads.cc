// RemoteTier's read side (storage/remote_tier.h): what restores read from
// the remote tier (a checkpoint's COMMIT, a job's LATEST, windows of its
// data files) and the names they give in messages, in a file of their own
// beside the uploads (storage/remote_tier.cc). UpdateLatest, the one write
// here, sits beside ReadLatest: it reads LATEST to move it only forward, and
// the two share LATEST's format.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/names.h"
#include "common/status.h"
#include "format/manifest_check.h"
#include "storage/remote_tier.h"
#include "storage/remote_tier_internal.h"

namespace ckpt {

using remote_tier_internal::CheckpointPrefix;

namespace {

// "<checkpoint>\n<committed_unix_micros>\n" is well under this.
constexpr size_t kMaxRemoteLatestBytes = 1024;

}  // namespace

uint64_t RemoteTier::fetch_window_bytes() const {
  const uint64_t round =
      options_.part_size * std::max<uint64_t>(options_.fetch_requests_in_flight, 1);
  return std::max<uint64_t>(std::min(round, options_.fetch_bytes / 4), 1);
}

std::string RemoteTier::DescribeFile(const std::string& job, const std::string& checkpoint,
                                     const std::string& file) const {
  return remote_->Describe(absl::StrCat(CheckpointPrefix(job, checkpoint), file));
}

absl::StatusOr<v1::CommitRecord> RemoteTier::ReadCommit(const std::string& job,
                                                        const std::string& checkpoint) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  RETURN_IF_ERROR(ValidateStorageName(checkpoint, "checkpoint"));
  const std::string key = absl::StrCat(CheckpointPrefix(job, checkpoint), "COMMIT");
  absl::StatusOr<std::string> bytes = GetSmallObject(*remote_, key, kMaxFramedFileBytes);
  if (absl::IsNotFound(bytes.status())) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", job, "/", checkpoint,
                                            " is not committed in the remote tier either (",
                                            remote_->Describe(key), ")"));
  }
  if (!bytes.ok()) return bytes.status();
  ASSIGN_OR_RETURN(v1::CommitRecord record, ParseCommitFile(*bytes, remote_->Describe(key)));
  if (record.index().job() != job || record.index().checkpoint() != checkpoint) {
    return absl::DataLossError(absl::StrCat(
        remote_->Describe(key), " holds the COMMIT of ", record.index().job(), "/",
        record.index().checkpoint()));
  }
  return record;
}

absl::StatusOr<RemoteLatest> RemoteTier::ReadLatest(const std::string& job) const {
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  const std::string key = absl::StrCat(job, "/", kLatestFileName);
  ASSIGN_OR_RETURN(std::string bytes, GetSmallObject(*remote_, key, kMaxRemoteLatestBytes));
  // "<checkpoint>\n<committed_unix_micros>\n"
  std::vector<absl::string_view> lines = absl::StrSplit(bytes, '\n', absl::SkipEmpty());
  RemoteLatest latest;
  if (lines.size() != 2 || !absl::SimpleAtoi(lines[1], &latest.committed_unix_micros) ||
      !ValidateStorageName(lines[0], "checkpoint").ok()) {
    return absl::DataLossError(absl::StrCat(remote_->Describe(key),
                                            " is not a checkpoint name and a commit time"));
  }
  latest.checkpoint = std::string(lines[0]);
  return latest;
}

absl::Status RemoteTier::UpdateLatest(const std::string& job, const std::string& checkpoint) {
  ASSIGN_OR_RETURN(v1::CommitRecord record, local_->ReadCommit(job, checkpoint));
  absl::StatusOr<RemoteLatest> current = ReadLatest(job);
  if (current.ok() && current->checkpoint == checkpoint) return absl::OkStatus();  // there
  if (current.ok() && current->checkpoint != checkpoint &&
      current->committed_unix_micros > record.committed_unix_micros()) {
    return absl::OkStatus();  // only forward
  }
  if (!current.ok() && !absl::IsNotFound(current.status()) &&
      !absl::IsDataLoss(current.status())) {
    return current.status();
  }
  return remote_->Put(absl::StrCat(job, "/", kLatestFileName),
                      absl::StrCat(checkpoint, "\n", record.committed_unix_micros(), "\n"));
}

absl::StatusOr<std::shared_ptr<const FileImage>> RemoteTier::FetchRange(
    const std::string& job, const std::string& checkpoint, const std::string& file,
    uint64_t file_size, uint64_t offset, uint64_t length, FetchMemory memory) const {
  const std::string key = absl::StrCat(CheckpointPrefix(job, checkpoint), file);
  const std::string what = absl::StrCat("fetch of ", remote_->Describe(key), " bytes [",
                                        offset, ", ", offset + length, ")");
  if (offset > file_size || length > file_size - offset) {
    return absl::InternalError(absl::StrCat(what, ": beyond the file's ", file_size, " bytes"));
  }
  const uint64_t size = length;
  if (size == 0 || size > options_.fetch_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", size, " bytes, and restores from the remote tier fetch windows of 1 to ",
        options_.fetch_bytes, " bytes (fetch_bytes)"));
  }
  const absl::Time deadline = absl::Now() + options_.fetch_timeout;
  // From here the memory is this fetch's until its image is dropped.
  absl::StatusOr<std::shared_ptr<FileImage>> taken =
      fetch_buffers_->Take(size, memory == FetchMemory::kWait, deadline);
  if (!taken.ok()) return Annotate(taken.status(), what);
  if (*taken == nullptr) return nullptr;  // kIfFree, and no room now
  FileImage* const image = taken->get();
  // Parts of part_size, fetch_requests_in_flight GETs at a time: one
  // request at a time leaves a store's bandwidth unused, as a raw client
  // with one connection would.
  const uint64_t parts = (size + options_.part_size - 1) / options_.part_size;
  std::atomic<uint64_t> next_part{0};
  absl::Mutex failed_mu;
  absl::Status failed;  // the first part's failure; the others then stop
  std::atomic<bool> stop{false};
  auto fetch_parts = [&] {
    for (uint64_t p = next_part++; p < parts && !stop.load(); p = next_part++) {
      const uint64_t at = p * options_.part_size;
      const uint64_t part = std::min<uint64_t>(options_.part_size, size - at);
      absl::Status status;
      if (absl::Now() > deadline) {
        status = absl::DeadlineExceededError(
            absl::StrCat("not fetched within ", absl::FormatDuration(options_.fetch_timeout)));
      } else {
        absl::StatusOr<size_t> read = remote_->Get(
            key, absl::MakeSpan(image->data() + at, part), ObjectRange{offset + at, part});
        if (!read.ok()) {
          status = read.status();
        } else if (*read != part) {
          status = absl::DataLossError(absl::StrCat("read ", *read, " bytes at ", offset + at,
                                                    " where its COMMIT lists ", part));
        }
      }
      if (!status.ok()) {
        absl::MutexLock lock(&failed_mu);
        if (failed.ok()) failed = std::move(status);
        stop = true;
      }
    }
  };
  {
    const uint64_t helpers =
        std::min<uint64_t>(parts, std::max<size_t>(options_.fetch_requests_in_flight, 1)) - 1;
    std::vector<std::thread> threads;
    threads.reserve(helpers);
    for (uint64_t t = 0; t < helpers; ++t) threads.emplace_back(fetch_parts);
    fetch_parts();
    for (std::thread& t : threads) t.join();
  }
  if (!failed.ok()) return Annotate(failed, what);
  return std::shared_ptr<const FileImage>(*std::move(taken));
}

}  // namespace ckpt

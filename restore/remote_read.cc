// Reading a round's data files from the remote tier (restore/remote_read.h):
// ReadFromRemote, window by window with the next window read ahead; and
// RemoteFallback, the remote copy a local file that cannot be read is read
// from instead, once the round knows the remote COMMIT is the local one.
#include "restore/remote_read.h"

#include <algorithm>
#include <future>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/status.h"
#include "google/protobuf/util/message_differencer.h"
#include "restore/kept_images.h"
#include "restore/read_split.h"

namespace ckpt {

absl::StatusOr<uint64_t> ReadFromRemote(const RemoteTier& tier, const std::string& job,
                                        const std::string& checkpoint,
                                        const ShardReadRequest& request, ShardReader& reader) {
  uint64_t widened = 0;  // a zero block size is refused by Extent below
  for (const ItemRead& item : request.items) {
    if (request.checksum_block_bytes == 0 || !ItemReadInBounds(item, request.file_size)) break;
    const FileRange range = WidenedItemRange(item, request.checksum_block_bytes);
    widened += range.end - std::min(range.begin, range.end);
  }
  const uint64_t window = tier.fetch_window_bytes();
  const size_t windows = static_cast<size_t>(std::max<uint64_t>((widened + window - 1) / window, 1));
  std::vector<ShardReadRequest> parts = SplitShardRead(request, windows, /*min_part_bytes=*/0);
  std::vector<FileRange> extents;
  extents.reserve(parts.size());
  for (const ShardReadRequest& part : parts) {
    ASSIGN_OR_RETURN(const FileRange extent, reader.Extent(part));
    extents.push_back(extent);
  }
  using Fetched = absl::StatusOr<std::shared_ptr<const FileImage>>;
  auto fetch = [&](size_t i, RemoteTier::FetchMemory memory) -> Fetched {
    return tier.FetchRange(job, checkpoint, parts[i].name, parts[i].file_size,
                           extents[i].begin, extents[i].end - extents[i].begin, memory);
  };
  auto next_window = [&](size_t after) {
    size_t i = after;
    while (i < parts.size() && extents[i].end <= extents[i].begin) ++i;
    return i;
  };
  uint64_t fetched = 0;
  // The read-ahead of the next window: its thread ends before this returns
  // (a std::async future's destructor waits), whatever way it returns.
  std::future<Fetched> ahead;
  size_t ahead_index = parts.size();
  for (size_t i = next_window(0); i < parts.size(); i = next_window(i + 1)) {
    std::shared_ptr<const FileImage> image;
    if (ahead.valid() && ahead_index == i) {
      ASSIGN_OR_RETURN(image, ahead.get());  // null: its memory was not free
    }
    // Waits for memory only while this read holds none (no read-ahead
    // running, no window held), so reads never wait for each other.
    if (image == nullptr) {
      ASSIGN_OR_RETURN(image, fetch(i, RemoteTier::FetchMemory::kWait));
    }
    ahead_index = next_window(i + 1);
    if (ahead_index < parts.size()) {
      ahead = std::async(std::launch::async, fetch, ahead_index,
                         RemoteTier::FetchMemory::kIfFree);
    }
    ShardReadRequest& part = parts[i];
    part.memory_image = image->data();
    part.memory_image_offset = extents[i].begin;
    part.memory_image_end = extents[i].end;
    absl::StatusOr<uint64_t> n = reader.Read(part);
    if (!n.ok()) {
      if (HostMemoryInUse(n.status())) KeepImagesForever({image});
      return n.status();
    }
    fetched += image->size();
  }
  DaemonMetrics::Get().read_bytes_remote.Add(fetched);
  return fetched;
}

bool RemoteCopyMayMend(const absl::Status& status) {
  if (HostMemoryInUse(status)) return false;
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<uint64_t> RemoteFallback::Mend(const ShardReadRequest& request,
                                              ShardReader& reader,
                                              const absl::Status& local_error) {
  auto unmended = [&](const absl::Status& why) {
    return absl::Status(local_error.code(),
                        absl::StrCat(local_error.message(), " (the remote tier's copy did not "
                                     "mend it: ", why.message(), ")"));
  };
  if (absl::Status same = HoldsSame(); !same.ok()) return unmended(same);
  LogWarning("load of ", job_, "/", checkpoint_, ": local file ", request.name,
             " could not be read (", local_error.message(),
             "); reading the remote tier's copy");
  absl::StatusOr<uint64_t> n = ReadFromRemote(tier_, job_, checkpoint_, request, reader);
  if (!n.ok()) return unmended(n.status());
  ++files_mended_;
  return n;
}

absl::Status RemoteFallback::HoldsSame() {
  absl::call_once(checked_, [this] {
    absl::StatusOr<v1::CommitRecord> there = tier_.ReadCommit(job_, checkpoint_);
    if (absl::IsNotFound(there.status())) there = AwaitRemoteCommit(std::move(there).status());
    if (!there.ok()) {
      holds_same_ = there.status();
    } else if (!google::protobuf::util::MessageDifferencer::Equals(*there, local_)) {
      holds_same_ = absl::FailedPreconditionError(absl::StrCat(
          "the remote tier's COMMIT of ", job_, "/", checkpoint_,
          " differs from the local one"));
    }
  });
  return holds_same_;
}

absl::StatusOr<v1::CommitRecord> RemoteFallback::AwaitRemoteCommit(absl::Status not_there) const {
  std::optional<RemoteProgress> upload = tier_.Progress(job_, checkpoint_);
  if (!upload.has_value() || upload->state == RemoteState::kFailed) return not_there;
  if (upload->state != RemoteState::kCommitted) {
    LogInfo(LogFields().Job(job_).Checkpoint(checkpoint_),
            "load: waiting for the remote commit, which brings the other nodes' files");
    upload = tier_.WaitFor(job_, checkpoint_, tier_.upload_timeout());
  }
  if (!upload.has_value()) return not_there;
  if (upload->state == RemoteState::kFailed) {
    return absl::Status(not_there.code(),
                        absl::StrCat(not_there.message(), "; its upload failed: ", upload->error));
  }
  return tier_.ReadCommit(job_, checkpoint_);
}

}  // namespace ckpt

// RemoteTier (storage/remote_tier.h): the queue, the tier's thread and the
// uploads with their remote commit. Restores' reads are in remote_tier_reads.cc,
// resuming at start in remote_tier_resume.cc, retention in remote_tier_retention.cc.
#include "storage/remote_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crash_point.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "storage/remote_tier_internal.h"

namespace ckpt {

using remote_tier_internal::CheckpointPrefix;

namespace {

constexpr uint64_t kDirectIoBlock = 4096;

bool Same(const RemoteProgress& p, const std::string& job, const std::string& checkpoint) {
  return p.job == job && p.checkpoint == checkpoint;
}

// Reads `length` bytes at `offset` (a multiple of 4096) of `fd` into
// `scratch`, asking for whole blocks as O_DIRECT requires.
absl::Status ReadPart(int fd, uint64_t offset, size_t length, absl::Span<char> scratch,
                      const std::string& path) {
  const size_t whole = (length + kDirectIoBlock - 1) / kDirectIoBlock * kDirectIoBlock;
  if (whole > scratch.size()) {
    return absl::InternalError(absl::StrCat("part buffer of ", scratch.size(),
                                            " bytes is too small for ", whole));
  }
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, scratch.data() + done, whole - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("read ", path, " at ", offset + done));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, " ends at ", offset + done,
                                              ", before the ", offset + length,
                                              " bytes its manifest lists"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Whether the stop came before the upload was queued or while it waited in
// the queue, the caller hears the same thing: nothing of it was copied, and
// the next start picks it up (ResumeUnfinished).
std::string StoppedBeforeUpload(const std::string& job, const std::string& checkpoint) {
  return absl::StrCat("the daemon stopped before the upload of ", job, "/", checkpoint,
                      " began; the local copy stays committed, and the daemon's next start "
                      "resumes it");
}

}  // namespace

absl::string_view RemoteStateName(RemoteState state) {
  switch (state) {
    case RemoteState::kQueued: return "queued";
    case RemoteState::kUploading: return "uploading";
    case RemoteState::kCommitting: return "committing";
    case RemoteState::kCommitted: return "committed";
    case RemoteState::kFailed: return "failed";
  }
  return "unknown";
}

RemoteTier::RemoteTier(RemoteTierOptions options, const CheckpointStore* local,
                       MemoryTier* images, CheckpointLeases* leases,
                       std::shared_ptr<ObjectStore> remote)
    : options_([&] {
        // Parts start at multiples of part_size: whole blocks for O_DIRECT.
        options.part_size = std::max<size_t>(
            options.part_size / kDirectIoBlock * kDirectIoBlock, kDirectIoBlock);
        return options;
      }()),
      local_(local),
      images_(images),
      leases_(leases),
      remote_(std::move(remote)),
      pacer_(options_.max_bytes_per_second) {
  absl::MutexLock lock(&join_mu_);
  thread_ = std::thread([this] { Run(); });
}

void RemoteTier::StartResidentFetchWindows() {
  absl::MutexLock lock(&join_mu_);
  if (options_.fetch_resident_bytes == 0 || resident_started_ || stopping_.load()) return;
  resident_started_ = true;
  resident_thread_ = std::thread([this] { MakeFetchWindowsResident(); });
}

RemoteTier::~RemoteTier() { Stop(); }

void RemoteTier::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    stopping_.store(true);
  }
  {
    absl::MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
    if (resident_thread_.joinable()) resident_thread_.join();
  }
  absl::MutexLock queue_lock(&mu_);
  for (const auto& upload : queue_) {
    const RemoteProgress& p = upload->progress;
    EndLocked(*upload, absl::CancelledError(absl::StrCat(
                           "node ", options_.node_id, ": ",
                           StoppedBeforeUpload(p.job, p.checkpoint))));
  }
  queue_.clear();
}

absl::Status RemoteTier::Enqueue(const std::string& job, const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  return EnqueueLocked(job, checkpoint, /*resumed=*/false);
}

absl::Status RemoteTier::EnqueueLocked(const std::string& job, const std::string& checkpoint,
                                       bool resumed) {
  if (stopped_) {
    return absl::CancelledError(StoppedBeforeUpload(job, checkpoint));
  }
  if (running_ != nullptr && Same(running_->progress, job, checkpoint)) {
    return absl::OkStatus();
  }
  for (const auto& queued : queue_) {
    if (Same(queued->progress, job, checkpoint)) return absl::OkStatus();
  }
  if (queue_.size() >= options_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the remote tier has ", queue_.size(), " uploads waiting already (max_queued); ",
        job, "/", checkpoint, " stays local until a later save or ckptctl retries it"));
  }
  auto upload = std::make_unique<Upload>();
  ASSIGN_OR_RETURN(CheckpointLease lease, leases_->Hold(job, checkpoint));
  upload->lease.emplace(std::move(lease));
  upload->resumed = resumed;
  upload->progress.job = job;
  upload->progress.checkpoint = checkpoint;
  upload->progress.queued_at = absl::Now();
  upload->progress.started_at = absl::InfinitePast();
  upload->progress.committing_at = absl::InfinitePast();
  upload->progress.ended_at = absl::InfinitePast();
  queue_.push_back(std::move(upload));
  return absl::OkStatus();
}

void RemoteTier::EndLocked(Upload& upload, const absl::Status& status) {
  upload.progress.state = status.ok() ? RemoteState::kCommitted : RemoteState::kFailed;
  if (!status.ok()) upload.progress.error = std::string(status.message());
  upload.progress.ended_at = absl::Now();
  // The lease goes before the end is seen: once Progress or WaitFor says
  // ended, local retention may take the checkpoint.
  upload.lease.reset();
  finished_.push_back(upload.progress);
  while (finished_.size() > options_.history) finished_.pop_front();
}

size_t RemoteTier::Backlog() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + (running_ != nullptr ? 1 : 0);
}

std::vector<RemoteProgress> RemoteTier::Progress() const {
  absl::MutexLock lock(&mu_);
  std::vector<RemoteProgress> all(finished_.begin(), finished_.end());
  if (running_ != nullptr) all.push_back(running_->progress);
  for (const auto& queued : queue_) all.push_back(queued->progress);
  return all;
}

std::optional<RemoteProgress> RemoteTier::FindLocked(const std::string& job,
                                                     const std::string& checkpoint) const {
  // An upload still to end first: a retry of one that failed before.
  if (running_ != nullptr && Same(running_->progress, job, checkpoint)) {
    return running_->progress;
  }
  for (const auto& queued : queue_) {
    if (Same(queued->progress, job, checkpoint)) return queued->progress;
  }
  for (auto it = finished_.rbegin(); it != finished_.rend(); ++it) {
    if (Same(*it, job, checkpoint)) return *it;
  }
  return std::nullopt;
}

std::optional<RemoteProgress> RemoteTier::Progress(const std::string& job,
                                                   const std::string& checkpoint) const {
  absl::MutexLock lock(&mu_);
  return FindLocked(job, checkpoint);
}

std::optional<RemoteProgress> RemoteTier::WaitFor(const std::string& job,
                                                  const std::string& checkpoint,
                                                  absl::Duration timeout) const {
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopped_) return true;
    std::optional<RemoteProgress> p = FindLocked(job, checkpoint);
    return !p.has_value() || p->state == RemoteState::kCommitted ||
           p->state == RemoteState::kFailed;
  };
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
  return FindLocked(job, checkpoint);
}

void RemoteTier::Update(Upload& upload, RemoteState state, uint64_t more_bytes,
                        uint32_t more_files) {
  absl::MutexLock lock(&mu_);
  upload.progress.state = state;
  if (state == RemoteState::kCommitting) upload.progress.committing_at = absl::Now();
  upload.progress.bytes_uploaded += more_bytes;
  upload.progress.files_uploaded += more_files;
}

void RemoteTier::MakeFetchWindowsResident() {
  const absl::Time began = absl::Now();
  const uint64_t resident =
      fetch_buffers_->MakeResident(options_.fetch_resident_bytes, fetch_window_bytes(), stopping_);
  LogInfo("remote tier: ", resident, " bytes of fetch windows faulted in and kept, in ",
          absl::FormatDuration(absl::Now() - began));
}

void RemoteTier::Run() {
  while (true) {
    std::unique_ptr<Upload> upload;
    bool resume = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || resume_pending_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopped_) return;
      if (resume_pending_) {
        resume_pending_ = false;
        resume = true;
      } else {
        upload = std::move(queue_.front());
        queue_.pop_front();
        running_ = upload.get();
      }
    }
    if (resume) {
      FindUnfinished();
      continue;
    }
    const absl::Status status = UploadAndCommit(*upload);
    const RemoteProgress& p = upload->progress;
    (status.ok() ? DaemonMetrics::Get().remote_uploads_committed
                 : DaemonMetrics::Get().remote_uploads_failed)
        .Add();
    if (status.ok()) {
      LogInfo(LogFields()
                  .Job(p.job)
                  .Checkpoint(p.checkpoint)
                  .Set("node", options_.node_id)
                  .Set("bytes", p.bytes_total)
                  .Set("seconds", absl::ToDoubleSeconds(absl::Now() - p.queued_at))
                  // The commit's own requests, after the last file's: where
                  // an upload's time goes beyond the bytes.
                  .Set("commit_seconds", absl::ToDoubleSeconds(absl::Now() - p.committing_at))
                  .Set("bytes_per_second",
                       static_cast<uint64_t>(
                           p.bytes_total /
                           std::max(absl::ToDoubleSeconds(absl::Now() - p.started_at), 1e-3)))
                  .Set("backlog", Backlog() - 1),  // besides this one, still running
              "checkpoint committed in the remote tier");
    } else {
      LogError(LogFields().Job(p.job).Checkpoint(p.checkpoint).Set("node", options_.node_id),
               "remote tier: ", status.ToString(), " (the local copy stays committed)");
    }
    absl::MutexLock lock(&mu_);
    EndLocked(*upload, status);
    running_ = nullptr;
  }
}

absl::Status RemoteTier::UploadAndCommit(Upload& upload) {
  const std::string job = upload.progress.job;
  const std::string checkpoint = upload.progress.checkpoint;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.upload_timeout;
  ASSIGN_OR_RETURN(v1::Manifest manifest,
                   local_->ReadNodeManifest(job, checkpoint, options_.node_id));
  if (manifest.nodes() != options_.nodes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", options_.node_id, ": ", job, "/", checkpoint, " was saved by ",
        manifest.nodes(), " nodes, this daemon runs with ", options_.nodes));
  }
  ASSIGN_OR_RETURN(StorageDir dir, local_->OpenCheckpoint(job, checkpoint));
  uint64_t total = 0;
  for (const v1::DataFile& file : manifest.files()) total += file.size();
  {
    absl::MutexLock lock(&mu_);
    upload.progress.bytes_total = total;
    upload.progress.files_total = static_cast<uint32_t>(manifest.files_size());
    upload.progress.state = RemoteState::kUploading;
    upload.progress.started_at = start;
  }
  RETURN_IF_ERROR(UploadFiles(job, checkpoint, dir, manifest, deadline, upload));
  // The steps of the remote commit are crash points (common/crash_point.h;
  // the others are in tree_commit.cc).
  CrashPoint("REMOTE", "files_uploaded");
  if (absl::Now() > deadline) {
    // The last file's requests may have used up the time: the commit's own
    // requests would each take up to a request's deadline more.
    return absl::DeadlineExceededError(absl::StrCat(
        "node ", options_.node_id, ": ", job, "/", checkpoint, ": files uploaded, but not "
        "within ", absl::FormatDuration(options_.upload_timeout), "; not committed remotely"));
  }
  Update(upload, RemoteState::kCommitting, 0, 0);

  TreeCommitOptions commit = options_.commit;
  commit.timeout = std::min(commit.timeout, deadline - absl::Now());
  TreeCommitNode node(*remote_, CheckpointPrefix(job, checkpoint), std::move(manifest), commit,
                      absl::Now());
  while (std::optional<absl::Time> next = node.Advance(absl::Now())) {
    while (absl::Now() < *next) {
      if (stopping_.load()) {
        return absl::CancelledError(absl::StrCat(
            "node ", options_.node_id, ": remote commit of ", job, "/", checkpoint,
            " stopped: the daemon is stopping"));
      }
      absl::SleepFor(std::min(*next - absl::Now(), absl::Milliseconds(50)));
    }
  }
  if (node.outcome().ok() && node.wrote_commit()) {
    // Restores of "latest" on a node with an empty disk find it there.
    absl::Status latest = UpdateLatest(job, checkpoint);
    if (!latest.ok()) {
      LogWarning(LogFields().Job(job).Checkpoint(checkpoint),
                 "remote tier: committed, but LATEST not moved: ", latest.ToString());
    } else if (options_.retention.keep_last > 0 || SplitGeneration(checkpoint).generation > 0) {
      ApplyRetention(job);  // the node that moves LATEST; a generation replaces older ones
    }
    CrashPoint("REMOTE", "latest_moved");
  }
  if (!node.last_failure().ok() && node.outcome().ok()) {
    LogWarning(LogFields().Job(job).Checkpoint(checkpoint),
               "remote commit: a request failed and was retried: ",
               node.last_failure().ToString());
  }
  return node.outcome();
}

absl::Status RemoteTier::UploadFiles(const std::string& job, const std::string& checkpoint,
                                     const StorageDir& dir, const v1::Manifest& manifest,
                                     absl::Time deadline, Upload& upload) {
  constexpr int kFilesAtOnce = 2;
  std::atomic<int> next_file{0};
  std::atomic<bool> abandoned{false};
  absl::Mutex failed_mu;
  absl::Status failed;  // the first failure; `abandoned` is set after it
  auto upload_files = [&] {
    for (int i = next_file++; i < manifest.files_size() && !abandoned.load(); i = next_file++) {
      const v1::DataFile& file = manifest.files(i);
      absl::Status status =
          UploadFile(job, checkpoint, dir, file.name(), file.size(), deadline, upload, abandoned);
      if (!status.ok()) {
        absl::MutexLock lock(&failed_mu);
        if (failed.ok()) failed = std::move(status);
        abandoned = true;
      }
    }
  };
  std::vector<std::thread> others;
  for (int t = 1; t < std::min(kFilesAtOnce, manifest.files_size()); ++t) {
    others.emplace_back(upload_files);
  }
  upload_files();
  for (std::thread& t : others) t.join();
  return failed;
}

absl::Status RemoteTier::UploadFile(const std::string& job, const std::string& checkpoint,
                                    const StorageDir& dir, const std::string& file,
                                    uint64_t size, absl::Time deadline, Upload& upload,
                                    const std::atomic<bool>& abandoned) {
  const std::string key = absl::StrCat(CheckpointPrefix(job, checkpoint), file);
  const std::string what =
      absl::StrCat("node ", options_.node_id, ": upload of ", remote_->Describe(key));
  std::shared_ptr<const FileImage> image =
      images_ != nullptr ? images_->Find(job, checkpoint, file, size) : nullptr;
  UniqueFd fd;
  const std::string path = dir.PathOf(file);
  if (image == nullptr) {
    absl::StatusOr<UniqueFd> opened = dir.OpenFile(file, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (!opened.ok() && absl::IsInvalidArgument(opened.status())) {
      // A file system without O_DIRECT (tmpfs): read through the cache.
      opened = dir.OpenFile(file, O_RDONLY | O_CLOEXEC);
    }
    if (!opened.ok()) return Annotate(opened.status(), what);
    fd = *std::move(opened);
  }
  if (upload.resumed) {
    // An earlier daemon of this node may have died mid-upload of this very
    // key (only this node writes it): its multipart upload is billed until
    // aborted.
    absl::StatusOr<int> aborted = remote_->AbortUnfinished(key, started_);
    if (!aborted.ok()) return Annotate(aborted.status(), what);
    if (*aborted > 0) {
      LogInfo(LogFields().Job(job).Checkpoint(checkpoint), "remote tier: aborted ", *aborted,
              " unfinished upload(s) of ", remote_->Describe(key), " an earlier daemon left");
    }
  }
  ObjectStore::PartSource source =
      [&](uint64_t offset, size_t length,
          absl::Span<char> scratch) -> absl::StatusOr<absl::string_view> {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "not uploaded within ", absl::FormatDuration(options_.upload_timeout), " (at byte ",
          offset, " of ", size, ")"));
    }
    if (!pacer_.Acquire(length, &stopping_) || stopping_.load()) {
      return absl::CancelledError("the daemon is stopping");
    }
    if (abandoned.load()) {
      return absl::CancelledError("another file of the checkpoint failed to upload");
    }
    absl::string_view part;
    if (image != nullptr) {
      part = absl::string_view(image->data() + offset, length);
    } else {
      RETURN_IF_ERROR(ReadPart(fd.get(), offset, length, scratch, path));
      part = absl::string_view(scratch.data(), length);
    }
    Update(upload, RemoteState::kUploading, length, 0);
    DaemonMetrics::Get().remote_uploaded_bytes.Add(length);
    return part;
  };
  RETURN_IF_ERROR(Annotate(remote_->PutFromSource(key, size, source, options_.part_size), what));
  Update(upload, RemoteState::kUploading, 0, 1);
  return absl::OkStatus();
}

void FillRemoteUpload(const RemoteProgress& p, v1::RemoteUpload* upload) {
  upload->set_job(p.job);
  upload->set_checkpoint(p.checkpoint);
  upload->set_state(std::string(RemoteStateName(p.state)));
  upload->set_bytes_total(p.bytes_total);
  upload->set_bytes_uploaded(p.bytes_uploaded);
  upload->set_files_total(p.files_total);
  upload->set_files_uploaded(p.files_uploaded);
  upload->set_error(p.error);
  upload->set_queued_unix_micros(absl::ToUnixMicros(p.queued_at));
  if (p.started_at != absl::InfinitePast()) {
    upload->set_started_unix_micros(absl::ToUnixMicros(p.started_at));
  }
  if (p.ended_at != absl::InfinitePast()) {
    upload->set_ended_unix_micros(absl::ToUnixMicros(p.ended_at));
  }
}

}  // namespace ckpt

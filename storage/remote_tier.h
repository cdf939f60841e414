// RemoteTier: the second tier of durability. Once this node's part of a
// checkpoint is committed in the local root, its files are copied to the
// remote store (an S3 bucket, a shared file system) in the background, off
// the trainer's path, and the checkpoint is committed there by the tree
// commit (storage/tree_commit.h) once every node's part is there.
//
//   <remote>/<job>/<checkpoint>/<data file>        this node's files, as named
//                                                  in its node manifest
//   <remote>/<job>/<checkpoint>/g-.../node-...     manifests, group records,
//   <remote>/<job>/<checkpoint>/COMMIT             COMMIT: tree_commit.h
//
// A file's bytes come from the memory tier's image when it holds one (no
// copy: the part is sent from the image, pinned once a GPU trainer is
// connected), else from the local file read with O_DIRECT into one aligned
// part buffer (no page-cache copy), paced by `max_bytes_per_second`. The
// node's manifest is published only after all its files are written, and
// COMMIT only after every node's manifest: nothing incomplete is ever
// committed remotely.
//
// Each upload holds a lease on the local checkpoint (storage/
// checkpoint_leases.h), so local retention keeps its files until the
// remote commit ends, committed or failed. One upload runs at a time, in
// the order they were queued; each ends within `upload_timeout` (files
// and commit together; the driver's own deadlines bound each request), and
// a failure names the node, the object and the server's answer. The local
// checkpoint stays committed whatever happens here; a later Enqueue (the
// next save's, or an operator's) retries it. The tier calls nobody back:
// who wants an upload's end asks Progress (the save's remote phase,
// SaveProgress.remote_phase, is a step the save side's watcher advances
// that way: save/save_coordinator.h) or waits in WaitFor.
//
// Memory: the part buffers of the requests in flight (the S3 driver's
// part slots, shared by the two files uploaded at once; a directory
// store's one buffer per file), the queue (max_queued entries), and a
// bounded history of finished uploads for status.
// Thread-safety: all public methods may be called from any thread; the
// uploads run on the tier's own thread, and the resident fetch windows
// (fetch_resident_bytes) are faulted in on a second one once the daemon
// is ready (StartResidentFetchWindows).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/byte_rate_limiter.h"
#include "common/daemon_metrics.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/fetch_buffers.h"
#include "storage/memory_tier.h"
#include "storage/object_store.h"
#include "storage/remote_retention.h"
#include "storage/tree_commit.h"

namespace ckpt {

struct RemoteTierOptions {
  uint32_t node_id = 0;
  uint32_t nodes = 1;
  uint64_t max_bytes_per_second = 0;  // 0: uncapped
  size_t part_size = 64ull << 20;
  TreeCommitOptions commit;
  // One checkpoint's upload and remote commit together.
  absl::Duration upload_timeout = absl::Minutes(30);
  size_t max_queued = 16;
  size_t history = 64;  // finished uploads kept for status
  // Restores from the remote tier: memory for the file windows being
  // fetched at once (one window holds at most this much), and how long a
  // fetch waits for that memory and its requests together.
  uint64_t fetch_bytes = 4ull << 30;
  // Of that, the bytes faulted in by StartResidentFetchWindows and kept,
  // in windows (storage/fetch_buffers.h): a restore's first windows need
  // no zeroing of fresh pages. 0: none.
  uint64_t fetch_resident_bytes = 0;
  absl::Duration fetch_timeout = absl::Minutes(10);
  // Ranged GETs of part_size one window's fetch runs at once.
  size_t fetch_requests_in_flight = 8;
  // Remote retention (storage/remote_retention.h): run by the node that
  // moves a job's remote LATEST after each remote commit, and by node 0 at
  // start (ResumeUnfinished) over every job in the remote tier. keep_last
  // 0: keep all.
  RemoteRetentionOptions retention;
};

// The remote tier's LATEST: the newest checkpoint committed there, as the
// node that wrote its COMMIT recorded it.
struct RemoteLatest {
  std::string checkpoint;
  int64_t committed_unix_micros = 0;
};

enum class RemoteState { kQueued, kUploading, kCommitting, kCommitted, kFailed };
absl::string_view RemoteStateName(RemoteState state);

struct RemoteProgress {
  std::string job;
  std::string checkpoint;
  RemoteState state = RemoteState::kQueued;
  uint64_t bytes_total = 0;
  uint64_t bytes_uploaded = 0;
  uint32_t files_total = 0;
  uint32_t files_uploaded = 0;
  std::string error;  // for kFailed: node, object, server's answer
  absl::Time queued_at;
  absl::Time started_at;  // InfinitePast while queued
  absl::Time committing_at;  // the files all up; InfinitePast before
  absl::Time ended_at;  // InfinitePast until it ends
};

// An upload's progress as the list, DaemonStatus and the save's progress
// (SaveProgress.remote_upload) carry it.
void FillRemoteUpload(const RemoteProgress& progress, v1::RemoteUpload* upload);

class RemoteTier {
 public:
  // The store, memory tier (null: none) and leases must outlive the tier;
  // `remote` is shared (the tests' nodes share one). Starts its thread.
  RemoteTier(RemoteTierOptions options, const CheckpointStore* local, MemoryTier* images,
             CheckpointLeases* leases, std::shared_ptr<ObjectStore> remote);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // Queues the upload of this node's part of a checkpoint committed in the
  // local root, and leases it there until the upload ends. OK if it is
  // queued or uploading already (Progress follows that upload);
  // ResourceExhausted if max_queued wait; NotFound if the local checkpoint
  // is being deleted; Cancelled once stopped (with the words a queued
  // upload Stop drops ends with).
  absl::Status Enqueue(const std::string& job, const std::string& checkpoint);

  // Faults in fetch_resident_bytes of fetch windows on a thread of its own
  // (storage/fetch_buffers.h), once; a daemon calls it once it is ready,
  // so that neither its start nor the uploads wait for it (0.4 s per 512
  // MiB here). No-op when stopped or with none asked for.
  void StartResidentFetchWindows();

  // For a daemon that starts: queues, newest first, the locally committed
  // checkpoints that have a part of this node and no COMMIT in the remote
  // tier (a crashed or stopped daemon's unfinished uploads), up to
  // max_queued (with remote retention on, none committed before the one
  // remote LATEST names); then node 0 runs remote retention over every
  // job in the remote tier (finishing a delete a crash cut short); their files' multipart uploads left on the server by the
  // earlier daemon are aborted before they are uploaded again. Runs on the
  // tier's thread, before any upload; returns at once.
  void ResumeUnfinished();

  // Uploads waiting or running, then the recent finished ones, newest last.
  std::vector<RemoteProgress> Progress() const;
  // The checkpoint's upload: the one queued or running, else the newest
  // finished one; nullopt if there is none.
  std::optional<RemoteProgress> Progress(const std::string& job,
                                         const std::string& checkpoint) const;
  // One checkpoint's upload and remote commit together may take this long.
  absl::Duration upload_timeout() const { return options_.upload_timeout; }

  // Waits until the checkpoint's upload has ended (committed or failed) or
  // `timeout` passed; its progress then, nullopt if it was never queued.
  std::optional<RemoteProgress> WaitFor(const std::string& job, const std::string& checkpoint,
                                        absl::Duration timeout) const;

  // Stops the thread: the running upload ends at its next part or poll
  // (failed: "daemon stopping"), queued ones are dropped (they end failed,
  // as Progress then says). Idempotent.
  void Stop();

  ObjectStore& remote() const { return *remote_; }
  const std::shared_ptr<ObjectStore>& remote_store() const { return remote_; }
  // Uploads queued or running (ckptd_remote_backlog).
  size_t Backlog() const;
  uint32_t keep_last() const { return options_.retention.keep_last; }

  // Restores (restore/loader.h), from any thread:
  // The COMMIT of a checkpoint committed in the remote tier (parsed and
  // checked like a local one); NotFound if it is not committed there.
  absl::StatusOr<v1::CommitRecord> ReadCommit(const std::string& job,
                                              const std::string& checkpoint) const;
  // The remote tier's LATEST of `job`; NotFound if none.
  absl::StatusOr<RemoteLatest> ReadLatest(const std::string& job) const;
  // How a fetch waits for its memory: kWait up to fetch_timeout while
  // other fetches hold it; kIfFree not at all (a read-ahead, which must
  // not wait while its caller holds a window: with every worker doing so
  // they would wait for each other until the timeout).
  enum class FetchMemory { kWait, kIfFree };
  // Bytes [offset, offset + length) of a data file of `file_size` bytes of
  // a checkpoint committed there, fetched into memory with ranged GETs
  // (part_size each, fetch_requests_in_flight at once), within
  // fetch_bytes. With kIfFree, null (and OK) when the memory is not free
  // now. A file larger than a window is fetched window by window
  // (restore/remote_read.cc). The bytes are not verified here: the reader
  // verifies every block, as from storage.
  absl::StatusOr<std::shared_ptr<const FileImage>> FetchRange(
      const std::string& job, const std::string& checkpoint, const std::string& file,
      uint64_t file_size, uint64_t offset, uint64_t length,
      FetchMemory memory = FetchMemory::kWait) const;
  // The most one fetch may hold (fetch_bytes).
  uint64_t fetch_bytes() const { return options_.fetch_bytes; }
  // A round of loads ended: the fetches' spare mappings go if no fetch
  // holds memory now (storage/fetch_buffers.h).
  void TrimFetchBuffers() const { fetch_buffers_->Trim(); }
  // The window a restore fetches at once: one round of requests in flight
  // (part_size x fetch_requests_in_flight), so that the next window's
  // requests run while this one is verified, and at most a quarter of
  // fetch_bytes, so that several files' reads fetch at once.
  uint64_t fetch_window_bytes() const;
  // "s3://bucket/prefix/job/checkpoint/file", for messages.
  std::string DescribeFile(const std::string& job, const std::string& checkpoint,
                           const std::string& file) const;

 private:
  struct Upload {
    RemoteProgress progress;
    std::optional<CheckpointLease> lease;
    // Queued by ResumeUnfinished: an earlier daemon may have left
    // unfinished multipart uploads of its files.
    bool resumed = false;
  };

  void Run();
  // Faults in fetch_resident_bytes of fetch windows, once, at start.
  void MakeFetchWindowsResident();
  // The checkpoint's upload running or queued, else its newest finished.
  std::optional<RemoteProgress> FindLocked(const std::string& job,
                                           const std::string& checkpoint) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResumeUnfinished's work, on the tier's thread.
  void FindUnfinished();
  absl::Status EnqueueLocked(const std::string& job, const std::string& checkpoint,
                             bool resumed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that `upload` ended with `status` (the lease goes first) among
  // the finished ones.
  void EndLocked(Upload& upload, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Uploads the files and runs the remote commit of `upload` (on the tier's
  // thread, without the lock).
  absl::Status UploadAndCommit(Upload& upload);
  // This node's files of `manifest`, two at a time (the next file's parts
  // start while the last ones of the one before are in flight); the first
  // failure stops the other file and is returned.
  absl::Status UploadFiles(const std::string& job, const std::string& checkpoint,
                           const StorageDir& dir, const v1::Manifest& manifest,
                           absl::Time deadline, Upload& upload);
  // One file; gives up, Cancelled, once `abandoned` is true.
  absl::Status UploadFile(const std::string& job, const std::string& checkpoint,
                          const StorageDir& dir, const std::string& file, uint64_t size,
                          absl::Time deadline, Upload& upload,
                          const std::atomic<bool>& abandoned);
  // Moves the remote LATEST of `job` to `checkpoint` unless it names one
  // committed later (the node that wrote COMMIT, after writing it). In
  // storage/remote_tier_reads.cc, beside ReadLatest.
  absl::Status UpdateLatest(const std::string& job, const std::string& checkpoint);
  // One remote retention pass over `job` against its remote LATEST (on
  // the tier's thread); logs and counts what it did. These two live in
  // storage/remote_tier_retention.cc.
  void ApplyRetention(const std::string& job);
  // At start, after the resumed uploads are queued: node 0's pass over
  // every job in the remote tier (with retention on).
  void RetainAtStart();
  // With remote retention on, whether a local checkpoint committed before
  // the one remote LATEST names (not resumed at start: retention would
  // delete it). `latest_of` caches LATEST's commit time per job. In
  // storage/remote_tier_resume.cc, with ResumeUnfinished and FindUnfinished.
  bool OlderThanRemoteLatest(const v1::CheckpointInfo& c,
                             std::map<std::string, int64_t>& latest_of) const;
  // Records progress under the lock: the state, and bytes and files
  // uploaded since the last call.
  void Update(Upload& upload, RemoteState state, uint64_t more_bytes, uint32_t more_files);

  const RemoteTierOptions options_;
  const CheckpointStore* const local_;
  MemoryTier* const images_;
  CheckpointLeases* const leases_;
  const std::shared_ptr<ObjectStore> remote_;
  ByteRateLimiter pacer_;
  std::atomic<bool> stopping_{false};

  // Held while leases are taken and released (CheckpointLeases' lock is a
  // leaf below it).
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Upload>> queue_ ABSL_GUARDED_BY(mu_);
  // The upload running on the thread (not in queue_), null when idle.
  Upload* running_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<RemoteProgress> finished_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool resume_pending_ ABSL_GUARDED_BY(mu_) = false;
  // Uploads that began before this are an earlier daemon's.
  const absl::Time started_ = absl::Now();
  // COMMIT times remote retention has read (the tier's thread only).
  RemoteCommitCache retention_cache_;

  // The fetches' memory (fetch_bytes), its mappings reused.
  const std::shared_ptr<FetchBuffers> fetch_buffers_ =
      std::make_shared<FetchBuffers>(options_.fetch_bytes);

  absl::Mutex join_mu_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
  std::thread resident_thread_ ABSL_GUARDED_BY(join_mu_);
  bool resident_started_ ABSL_GUARDED_BY(join_mu_) = false;

  // Read at each metrics render; last, so unbound before what it reads goes.
  GaugeBinding backlog_gauge_ =
      DaemonMetrics::Get().remote_backlog.Bind([this] { return static_cast<double>(Backlog()); });
};

}  // namespace ckpt

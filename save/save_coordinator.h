// SaveCoordinator: turns rank save requests into committed checkpoints.
//
// Every rank of a job calls Save for the same checkpoint name; each call
// becomes a Part: the data files that rank writes under the node plan (the
// chunks it owns among their replicas). Submit validates the request and
// queues the part on the I/O workers, so the call returns at ACCEPTED. A
// worker stages and writes the part (ShardWriter); when the last of this
// node's local_world_size parts is durable, that worker writes the node
// manifest (DURABLE) and tries to commit (CommitProtocol). If other nodes
// are not done yet, a watcher thread retries until COMMIT exists (written by
// whichever node finished last) or commit_timeout_ms passes. Any part
// failing, a cancel, or a rank whose session closes before it submitted
// fails the whole checkpoint: its other parts are cancelled and this node's
// files removed, so nothing partial is ever committed.
//
// Progress is published per part with a version number; WatchNext lets a
// gRPC stream wait for the next version without blocking a thread.
//
// Thread-safety: all public methods may be called from any thread. Lock
// order: mu_ is never held while calling a listener, the store or a worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ckpt/v1/control.pb.h"
#include "io/io_workers.h"
#include "io/rate_limiter.h"
#include "io/staging_pool.h"
#include "save/save_options.h"
#include "save/save_plan.h"
#include "save/shard_writer.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/commit_protocol.h"
#include "storage/memory_tier.h"

namespace ckpt {

class SaveCoordinator {
 public:
  using Listener =
      std::function<void(const v1::SaveProgress& progress, uint64_t version)>;

  SaveCoordinator(const SaveOptions& options, const CheckpointStore* store,
                  StagingPool* pool, IoWorkers* workers, CheckpointLeases* leases,
                  MemoryTier* tier);
  ~SaveCoordinator();  // stops the commit watcher

  // Validates and queues this rank's part; returns its save id.
  absl::StatusOr<uint64_t> Submit(const std::shared_ptr<Session>& session,
                                  const v1::SaveRequest& request);

  // Calls `listener` once, with the part's progress as soon as its version
  // is greater than `after` (at once if it already is). `session` must own
  // the save.
  absl::Status WatchNext(const Session& session, uint64_t save_id,
                         uint64_t after, Listener listener);

  // Cancels the checkpoint that save `save_id` of `session` belongs to.
  absl::StatusOr<uint32_t> CancelSave(const Session& session, uint64_t save_id);
  // Operator cancel of an in-flight checkpoint by name.
  absl::StatusOr<uint32_t> CancelCheckpoint(absl::string_view job,
                                            absl::string_view checkpoint);

  // Progress of every part not yet in a final phase.
  std::vector<v1::SaveProgress> InFlight() const;

  // Tensor bytes written to data files since start (headers excluded).
  uint64_t tensor_bytes_written() const { return tensor_bytes_written_.load(); }

  // Removes uncommitted checkpoints of `job` (every job if empty) older
  // than the job's newest committed one and not being written here.
  absl::StatusOr<std::vector<std::string>> CollectGarbage(absl::string_view job);

  // Fails in-flight checkpoints of the session's job that still wait for
  // the session's rank.
  void OnSessionClosed(const std::shared_ptr<Session>& session);

 private:
  struct Checkpoint;
  struct Part {
    uint64_t id = 0;
    std::shared_ptr<Session> session;
    std::shared_ptr<Checkpoint> checkpoint;
    std::shared_ptr<const TensorLayout> tensors;  // shared across saves
    std::vector<v1::ByteItem> byte_items;
    std::atomic<bool> cancelled{false};
    // Guarded by SaveCoordinator::mu_.
    v1::SaveProgress progress;
    uint64_t version = 0;
    std::vector<Listener> listeners;
    std::chrono::steady_clock::time_point last_publish;
    std::vector<ShardWriteResult> results;  // per plan file
    bool done = false;  // the worker finished with it
  };
  struct Checkpoint {
    std::string job, name;
    uint32_t world_size = 0;
    uint32_t local_ranks = 0;  // parts this node waits for
    std::map<uint32_t, std::shared_ptr<Part>> parts;  // by rank
    uint32_t durable_parts = 0;
    // Node manifest written: from then on another node may commit using
    // this node's files, so a failure here leaves them for gc.
    bool manifest_written = false;
    // Waiting for the other nodes since durable_at.
    bool awaiting_nodes = false;
    std::chrono::steady_clock::time_point durable_at;
    v1::Phase final_phase = v1::PHASE_UNSPECIFIED;    // FAILED/CANCELLED/...
    std::string reason;
    std::once_flag prepare_once;
    absl::Status prepare_status;
    std::atomic<bool> prepared{false};  // this node touched the directory
  };
  // Listeners to call, with what to tell them, once mu_ is released.
  struct Notification {
    std::vector<Listener> listeners;
    v1::SaveProgress progress;
    uint64_t version = 0;
  };
  using Notifications = std::vector<Notification>;

  void RunPart(const std::shared_ptr<Part>& part, IoQueue& queue);
  void FinishPart(const std::shared_ptr<Part>& part, absl::Status status);
  // Writes the node manifest, then commits or hands over to the watcher.
  void FinishNode(const std::shared_ptr<Checkpoint>& checkpoint);
  // One commit attempt; ends the checkpoint on success, error or timeout.
  void TryCommit(const std::shared_ptr<Checkpoint>& checkpoint);
  void SetPhase(const std::shared_ptr<Checkpoint>& checkpoint, v1::Phase phase);
  void WatchCommits();
  // Marks the checkpoint failed/cancelled and cancels its parts.
  void EndCheckpointLocked(Checkpoint& checkpoint, v1::Phase phase,
                           std::string reason, Notifications* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a failed checkpoint once no worker uses it any more.
  void MaybeRetireLocked(const std::shared_ptr<Checkpoint>& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bumps the part's version; collects listeners to call after unlocking.
  void PublishLocked(Part& part, bool force, Notifications* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Notify(Notifications& notifications);
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SaveOptions options_;
  const CheckpointStore* const store_;
  StagingPool* const pool_;
  IoWorkers* const workers_;
  CheckpointLeases* const leases_;
  MemoryTier* const tier_;
  RateLimiter limiter_;
  CommitProtocol commit_;
  std::atomic<uint64_t> tensor_bytes_written_{0};

  mutable std::mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // In-flight checkpoints by "job/name".
  std::map<std::string, std::shared_ptr<Checkpoint>> checkpoints_
      ABSL_GUARDED_BY(mu_);
  // Every part by id, kept a while after it ends so late watchers see it.
  std::map<uint64_t, std::shared_ptr<Part>> parts_ ABSL_GUARDED_BY(mu_);
  std::condition_variable watcher_wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;  // retries commits of checkpoints awaiting nodes
};

}  // namespace ckpt

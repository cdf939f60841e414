// SaveCoordinator: turns rank save requests into committed checkpoints, by
// wiring together the save side's pieces:
//
//   InFlightCheckpoints  the attempts this node is saving and their states
//   SaveProgressBoard    each part's published progress, WatchNext
//   PartWriter           a part's data files, on an I/O worker
//   CommitWatcher        retries of commits that wait for other nodes
//
// Every rank of a job calls Save for the same checkpoint name; each call
// becomes a part. Submit validates the request and queues the part on the
// I/O workers, so the call returns at ACCEPTED. When the last of this
// node's local_world_size parts is durable, that worker writes the node
// manifest (DURABLE) and tries to commit (storage/local_commit.h: in the
// shared root, or, with a root per node, by meeting the other nodes in the
// remote tier). If other nodes are not done yet, the CommitWatcher retries
// until the checkpoint is committed or commit_timeout_ms passes; commits
// that make remote requests run on a watcher of their own, so that a slow
// server never delays the local-ranks deadlines. Any part
// failing, a cancel, a rank whose session closes before it submitted, or
// local ranks that have not all submitted within local_ranks_timeout_ms of
// the first (the failure names them) ends the whole attempt: every waiter
// hears FAILED or CANCELLED with the reason, its other parts are cancelled
// and, once no worker uses it, this node's files are removed (on an I/O
// worker) and its name is free again, so nothing partial is ever
// committed. Once this node's parts are all durable, its manifest may be
// used by any node's commit: a cancel is refused from then on.
//
// Ownership: borrows the store, pool, workers, leases, tier and file
// operations, which outlive it; the I/O workers must finish their queued
// tasks (which may post more) before it is destroyed, and since the commit
// watcher's checks post to the workers too, call StopWatching before the
// workers go. Owns the pieces above; the destructor stops the commit
// watcher first.
// Thread-safety: all public methods may be called from any thread; storage
// is touched only by the I/O workers, the commit watcher and (a stat for an
// existing COMMIT) Submit. Lock order: InFlightCheckpoints' lock, then the
// board's; CommitWatcher's lock is separate. No lock is held while calling
// the store, a worker, the tier, the leases or a listener.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/control.pb.h"
#include "io/io_queue.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "save/commit_watcher.h"
#include "save/in_flight_checkpoints.h"
#include "save/open_sessions.h"
#include "save/part_writer.h"
#include "save/save_options.h"
#include "save/save_part.h"
#include "save/save_progress_board.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "storage/garbage_collector.h"
#include "storage/local_commit.h"
#include "storage/memory_tier.h"
#include "storage/remote_tier.h"

namespace ckpt {

class SaveCoordinator {
 public:
  using Listener = SaveProgressBoard::Listener;

  // `file_ops` makes this node's files durable: each data file's ftruncate
  // and fsync, and every step of the node manifest's and COMMIT's writes.
  // Tests pass one that fails a step; the I/O workers' queues are the
  // other seam.
  SaveCoordinator(const SaveOptions& options, const CheckpointStore* store,
                  StagingPool* pool, IoWorkers* workers,
                  CheckpointLeases* leases, MemoryTier* tier,
                  FileOps& file_ops = DefaultFileOps(), RemoteTier* remote = nullptr,
                  std::shared_ptr<ObjectStore> shared_root = nullptr);

  // Validates and queues this rank's part; returns its save id. With
  // `accepted`, fills in what the trainer's stream may wait for
  // (SaveResponse.staged_records, stream_wait_suffices).
  absl::StatusOr<uint64_t> Submit(const std::shared_ptr<Session>& session,
                                  const v1::SaveRequest& request,
                                  v1::SaveResponse* accepted = nullptr);

  // Calls `listener` once, with the part's progress as soon as its version
  // is greater than `after` (at once if it already is). `session` must own
  // the save.
  absl::Status WatchNext(const Session& session, uint64_t save_id,
                         uint64_t after, Listener listener);

  // Cancels the checkpoint that save `save_id` of `session` belongs to;
  // returns the parts cancelled (0 if it had already ended).
  // FailedPrecondition once this node's parts are all durable.
  absl::StatusOr<uint32_t> CancelSave(const Session& session, uint64_t save_id);
  // Operator cancel of an in-flight checkpoint by name.
  // FailedPrecondition once it ended or this node's parts are all durable.
  absl::StatusOr<uint32_t> CancelCheckpoint(absl::string_view job,
                                            absl::string_view checkpoint);

  // Progress of every part not yet in a final phase.
  std::vector<v1::SaveProgress> InFlight() const { return board_.InFlight(); }

  // Tensor bytes written to data files since start (headers excluded).
  uint64_t tensor_bytes_written() const {
    return writer_.tensor_bytes_written();
  }

  // Removes uncommitted checkpoints of `job` (every job if empty) older
  // than the job's newest committed one and not being written here, then
  // applies retention (keep_last) to those jobs now.
  // Storage work: call it on an I/O worker.
  absl::StatusOr<GarbageCollection> CollectGarbage(
      absl::string_view job);

  // Opens a trainer's session (Session::Open with `request`) unless open
  // sessions of its job are another user's (OpenSessions::Open); once open,
  // a checkpoint of its job that times out waiting for ranks names its rank
  // as connected.
  // An attempt an earlier run of the job left waiting for ranks that never
  // come fails then (InFlightCheckpoints::SessionOpened).
  absl::Status OpenSession(const std::shared_ptr<Session>& session,
                           const v1::OpenSessionRequest& request, uint32_t node_id,
                           uint32_t nodes);
  // Fails in-flight checkpoints of the session's job that still wait for
  // the session's rank.
  void OnSessionClosed(const std::shared_ptr<Session>& session);

  // The daemon is stopping (a drain): from now on Submit only adds parts
  // to checkpoints already in flight here, so that they can still commit;
  // a new checkpoint fails UNAVAILABLE "ckptd is stopping".
  void StopAccepting() { accepting_ = false; }
  bool accepting() const { return accepting_.load(); }
  // Ends the checkpoints still in flight, CANCELLED with `reason`
  // (InFlightCheckpoints::CancelAll says which; with several nodes those
  // waiting for the others' manifests end too, their files kept), and
  // returns their names ("job/name"). Their parts stop at the next window;
  // the files go as after any cancel, on the I/O workers.
  std::vector<std::string> CancelAll(absl::string_view reason);

  // Settings that change live (SIGHUP, daemon/live_reload.h): retention
  // applies from the next commit on, the rate cap from the next write.
  void SetKeepLast(uint32_t keep_last) { keep_last_ = keep_last; }
  void SetWriteRateLimit(uint64_t bytes_per_second) {
    writer_.SetWriteRateLimit(bytes_per_second);
  }

  // Stops the commit watchers (commit retries, local-ranks deadlines),
  // which post to the I/O workers: call it before they are destroyed.
  // Attempts handed to them later are kept, never run (as after a daemon
  // stop).
  void StopWatching() {
    watcher_.Stop();
    remote_commits_.Stop();
  }

 private:
  using Retired = InFlightCheckpoints::Retired;

  // The worker's task: write the part, then record how it ended.
  void RunPart(const std::shared_ptr<SavePart>& part, IoQueue& queue);
  // Writes the node manifest, then commits or hands over to the watcher.
  void FinishNode(const std::shared_ptr<CheckpointAttempt>& checkpoint,
                  const std::vector<std::shared_ptr<SavePart>>& parts);
  // One commit attempt; true once no further attempt is needed (committed,
  // failed or timed out).
  bool TryCommit(const std::shared_ptr<CheckpointAttempt>& checkpoint);
  // The attempt's local-ranks deadline (InFlightCheckpoints::
  // ExpireMissingRanks); true once no further check is needed.
  bool CheckLocalRanks(const std::shared_ptr<CheckpointAttempt>& checkpoint);
  // After commit: retention, the memory tier's images made readable, and
  // the upload to the remote tier queued; `save_ids` are the parts, whose
  // remote phase the upload's end ends.
  void AfterCommit(const CheckpointAttempt& checkpoint, std::vector<uint64_t> save_ids);
  // The remote phase, the saves' last step, on the commit watcher like a
  // commit retry: asks the remote tier how the checkpoint's upload stands
  // and, once it has ended, ends the phase of parts `save_ids` as it did;
  // true then (no further look needed). The tier calls nobody back.
  bool FollowRemotePhase(const std::string& job, const std::string& checkpoint,
                         const std::vector<uint64_t>& save_ids);
  // The remote phase of parts `save_ids` ended as `upload` did: published
  // as REMOTE_COMMITTED or REMOTE_FAILED.
  void EndRemotePhase(const std::vector<uint64_t>& save_ids, const RemoteProgress& upload);
  // After a failed COMMIT write of a single-node job: removes a COMMIT the
  // write left in place; true once none is there (durably).
  bool WithdrawFailedCommit(const CheckpointAttempt& checkpoint);
  // What an attempt that left the set still needs, outside every lock.
  void FinishRetirement(std::optional<Retired> retired);

  // keep_last and write_rate_limit are read from keep_last_ and the
  // writer's limiter instead: they change live.
  const SaveOptions options_;
  std::atomic<uint32_t> keep_last_;
  std::atomic<bool> accepting_{true};
  const CheckpointStore* const store_;
  IoWorkers* const workers_;
  CheckpointLeases* const leases_;
  MemoryTier* const tier_;
  // The remote tier (null: none), handed each checkpoint once committed.
  RemoteTier* const remote_;
  FileOps& file_ops_;
  // With several nodes, TreeLocalCommit: meeting in the remote tier (a
  // root per node) or in `shared_root` (the root they share); else
  // CommitProtocol.
  const std::unique_ptr<LocalCommit> commit_;
  SaveProgressBoard board_;
  InFlightCheckpoints checkpoints_{&board_};
  OpenSessions open_sessions_;
  PartWriter writer_;
  // Last: destroyed first, so no retry runs against the members above.
  CommitWatcher watcher_;
  // The commits that meet other nodes in the remote tier.
  CommitWatcher remote_commits_;
};

}  // namespace ckpt

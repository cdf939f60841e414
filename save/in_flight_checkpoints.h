// InFlightCheckpoints: the checkpoints this node is saving, their parts, and
// every transition of their state.
//
// A checkpoint attempt starts with the first part submitted for its name
// and moves through these states (each part's published phase in
// brackets):
//
//   writing   parts join until local_ranks have [ACCEPTED, STAGED]; if
//             they have not all joined within the local-ranks timeout of
//             the first, it ends FAILED naming the missing ranks
//   durable   every local part is durable: the node manifest is being
//             written, then is written [DURABLE]; from here on another
//             node may commit with this node's files, so it can no longer
//             be cancelled, nor can its files be removed
//   ended     COMMITTED, or FAILED/CANCELLED with a reason; every part is
//             told, and the others are cancelled
//   retired   ended and no worker uses it any more: it leaves the set. A
//             failed attempt whose files must be removed stays, refusing
//             new saves of its name, until ForgetRemoved.
//
// With a remote tier, COMMITTED also begins the parts' remote phase
// [REMOTE_UPLOADING]; the attempt has left the set by then, so that step
// lives on the board, advanced by the coordinator's commit watcher from
// the remote tier's progress to [REMOTE_COMMITTED] or [REMOTE_FAILED]
// (SaveCoordinator::FollowRemotePhase).
//
// Transitions that end an attempt return a Retired when it leaves the set:
// what remains to be done with no lock held (drop the memory tier's images,
// remove this node's files). Parts' progress is published on the
// SaveProgressBoard from inside the transition, so watchers see the phases
// in the order the transitions happened; the listener calls come back in
// a ListenerCalls to be made after unlocking.
//
// Ownership: owns the attempts' state; shares the SaveParts with their
// workers; borrows the board, which must outlive it.
// Thread-safety: all methods may be called from any thread. Lock order:
// `mu_`, then the board's lock; nothing else is called under `mu_` (no
// store, worker, tier or listener).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckpt/v1/control.pb.h"
#include "save/save_part.h"
#include "save/save_progress_board.h"
#include "session/session.h"

namespace ckpt {

// A rank of the job that this node knows of: one that submitted its part,
// or one whose session is open here.
struct RankSeen {
  uint32_t rank = 0;
  std::optional<uint32_t> local_rank = std::nullopt;  // if its session said
  bool submitted = false;
};

// The local ranks of an attempt that have not submitted, for its failure
// reason: those connected (named by rank) and those that never connected.
// The daemon learns a rank's number only from its session, so a rank that
// never connected is named by local rank when every rank seen gave its
// own, else by global rank when the numbering leaves no doubt (all of the
// job's ranks run on this node) or follows torchrun's (node n runs ranks
// n*local .. n*local+local-1, and every rank seen is one of them), else
// only counted.
std::string MissingLocalRanks(uint32_t world_size, uint32_t local_ranks,
                              uint32_t node_id, std::vector<RankSeen> seen);

class InFlightCheckpoints {
 public:
  using ListenerCalls = SaveProgressBoard::ListenerCalls;

  // What is left to do, with no lock held, for an attempt that left the set.
  struct Retired {
    enum class Files {
      kKeep,        // committed, or this node never touched the directory
      kLeaveForGc,  // its node manifest is out: a node may be committing
      kRemove,      // remove `files` and the manifest, then ForgetRemoved
    };
    std::shared_ptr<CheckpointAttempt> checkpoint;
    v1::Phase phase = v1::PHASE_UNSPECIFIED;
    Files files_action = Files::kKeep;
    std::vector<std::string> files;  // this node's data files
    std::vector<uint64_t> save_ids;  // its parts', by rank
  };

  // A rank's part as Submit validated it.
  struct NewPart {
    std::shared_ptr<Session> session;
    std::string job, name;
    std::shared_ptr<const TensorLayout> tensors;
    std::vector<v1::ByteItem> byte_items;
    // The daemon is stopping: the part may join an attempt in flight, so
    // that it can still commit, but may not start a new one.
    bool join_only = false;
  };

  explicit InFlightCheckpoints(SaveProgressBoard* board) : board_(board) {}

  // How many attempts have left the set committed. Read before checking
  // storage for COMMIT, and pass both to Add.
  uint64_t commits_retired() const;

  // Adds a rank's part to the attempt in flight under its name, or starts
  // one. `committed`: the checkpoint's COMMIT existed when checked, after
  // `commits_retired` was read. Aborted if an attempt committed since then
  // (it may have been this name: check again). `part` is moved from only
  // on success.
  absl::StatusOr<std::shared_ptr<SavePart>> Add(NewPart&& part, bool committed,
                                                uint64_t commits_retired,
                                                ListenerCalls* out);

  // The part's worker is done with it: durable if `status` is OK, otherwise
  // the attempt ends (CANCELLED for a Cancelled status, else FAILED).
  struct PartFinished {
    bool node_durable =
        false;  // it was the last local part: write the manifest
    // With node_durable, the attempt's parts in rank order, all durable:
    // no worker touches them any more.
    std::vector<std::shared_ptr<SavePart>> parts;
    std::optional<Retired> retired;
  };
  PartFinished FinishPart(const SavePart& part, const absl::Status& status,
                          ListenerCalls* out);

  // The node manifest is durable: every part becomes DURABLE. False if the
  // attempt ended meanwhile (then no commit is tried).
  bool NodeDurable(const CheckpointAttempt& checkpoint, ListenerCalls* out);

  // How long the attempt has waited for the other nodes since it became
  // durable; nullopt once it ended (no further commit attempt is needed).
  std::optional<std::chrono::steady_clock::duration> WaitingForNodes(
      const CheckpointAttempt& checkpoint) const;

  // COMMIT is written: every part becomes COMMITTED and the attempt leaves
  // the set before any listener hears of it, so a client that saw
  // COMMITTED never finds the save still in flight. With `remote_follows`
  // (the daemon has a remote tier) the same message starts the remote
  // phase (PHASE_REMOTE_UPLOADING), so that a watcher following it knows
  // at COMMITTED that one more message comes. Nullopt if it had already
  // ended.
  std::optional<Retired> Commit(const CheckpointAttempt& checkpoint,
                                bool remote_follows, ListenerCalls* out);

  // Ends the attempt FAILED with `reason`, unless it already ended.
  // `manifest_unused`: no node can commit with this node's manifest any
  // more (a single-node job whose COMMIT write failed and was taken back),
  // so its files are removed as before the manifest, not left for gc.
  std::optional<Retired> Fail(const CheckpointAttempt& checkpoint,
                              std::string reason, ListenerCalls* out,
                              bool manifest_unused = false);

  // The local-ranks deadline: while the attempt still waits for some of its
  // local ranks to submit, and `timeout` has passed since its first part
  // joined, ends it FAILED with a reason naming the missing ranks (as far
  // as node `node_id` can tell them, MissingLocalRanks). `waiting` stays
  // true only while the deadline has not come and ranks are missing; once
  // false, no further check is needed.
  struct RanksCheck {
    bool waiting = false;
    std::optional<Retired> retired;
  };
  // `connected`: the ranks whose sessions of the attempt's job are open on
  // this node, for the reason (RankSeen::submitted is ignored).
  RanksCheck ExpireMissingRanks(const CheckpointAttempt& checkpoint,
                                std::chrono::steady_clock::duration timeout,
                                uint32_t node_id,
                                const std::vector<RankSeen>& connected,
                                ListenerCalls* out);

  struct Cancelled {
    uint32_t saves = 0;  // parts cancelled; 0 if the attempt had ended
    std::optional<Retired> retired;
  };
  // A trainer's cancel through one of its saves. NotFound if the session
  // has no such save; FailedPrecondition once this node is durable.
  absl::StatusOr<Cancelled> CancelSave(const Session& session, uint64_t save_id,
                                       ListenerCalls* out);
  // The operator's cancel by name. NotFound if not in flight here;
  // FailedPrecondition once ended or once this node is durable.
  absl::StatusOr<Cancelled> CancelCheckpoint(absl::string_view job,
                                             absl::string_view name,
                                             ListenerCalls* out);

  // The daemon stops: ends every attempt still in flight CANCELLED with
  // `reason`, except those whose parts are all durable: another node may
  // commit with their files. With `durable_too`, those whose node manifest
  // is written end too (their files stay, left for gc or another node's
  // commit, and the reason says so); an attempt between its last durable
  // part and its manifest is always left to its worker, which commits or
  // hands it to the commit watcher. Returns the names of the attempts ended.
  struct StoppedAll {
    std::vector<std::string> ended;  // "job/name"
    std::vector<Retired> retired;
  };
  StoppedAll CancelAll(absl::string_view reason, bool durable_too,
                       ListenerCalls* out);

  // Fails the attempts of the session's job that still wait for its rank,
  // and remembers in the others that this rank's part has lost its session.
  std::vector<Retired> SessionClosed(const Session& session,
                                     ListenerCalls* out);
  // A session of a rank opened: an attempt of its job that still waits for
  // local ranks and holds a part of this rank from a session that has
  // closed was begun by an earlier run of the job (a restart: torchrun, a
  // scheduler). That run's missing ranks never come, and the new run's
  // parts must not join it, so it fails now, naming why.
  std::vector<Retired> SessionOpened(const Session& session, ListenerCalls* out);

  // True while an attempt of that name is in the set (files included).
  bool Contains(absl::string_view job, absl::string_view name) const;

  // The files of a kRemove attempt are gone: the name is free again.
  void ForgetRemoved(const CheckpointAttempt& checkpoint);

 private:
  struct Entry {
    std::shared_ptr<CheckpointAttempt> checkpoint;
    std::map<uint32_t, std::shared_ptr<SavePart>> parts;  // by rank
    uint32_t finished_parts = 0;  // their workers are done with them
    uint32_t durable_parts = 0;
    bool manifest_written = false;
    bool manifest_unused = false;  // Fail's: no node can commit with it
    std::chrono::steady_clock::time_point started_at;  // its first part
    std::chrono::steady_clock::time_point durable_at;
    v1::Phase final_phase = v1::PHASE_UNSPECIFIED;
    std::string reason;
    bool removing_files = false;  // retired; waiting for ForgetRemoved
    std::set<uint32_t> ranks_gone;  // whose part's session has closed
  };
  using Entries = std::map<std::string, Entry>;

  // The entry of this very attempt (not a later one of the same name).
  Entries::iterator FindLocked(const CheckpointAttempt& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every part gets `phase`, stamped now where the phase has a time field,
  // and `remote_phase` unless it is PHASE_UNSPECIFIED.
  void PublishPhaseLocked(Entry& entry, v1::Phase phase, ListenerCalls* out,
                          v1::Phase remote_phase = v1::PHASE_UNSPECIFIED)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the attempt ended and cancels its parts.
  void EndLocked(Entry& entry, v1::Phase phase, std::string reason,
                 ListenerCalls* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes an ended attempt out of the set once no worker uses it.
  std::optional<Retired> MaybeRetireLocked(Entries::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks `why` about each attempt of `job` that has not ended; fails those
  // it gives a reason for, and returns the ones that retired. `why` may
  // change the entry (it runs under mu_).
  std::vector<Retired> FailOpenAttemptsLocked(
      const std::string& job, ListenerCalls* out,
      const std::function<std::optional<std::string>(Entry&)>& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refuses a cancel once another node may commit with this node's files.
  static absl::Status CheckCancellable(const Entry& entry);

  SaveProgressBoard* const board_;

  mutable absl::Mutex mu_;
  uint64_t next_save_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t commits_retired_ ABSL_GUARDED_BY(mu_) = 0;
  Entries entries_ ABSL_GUARDED_BY(mu_);  // by "job/name"
  // The parts of the attempts in the set, by save id.
  std::map<uint64_t, std::shared_ptr<SavePart>> parts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

// TreeLocalCommit: the local commit of a job of several nodes through the
// tree commit (storage/tree_commit.h), whose requests grow linearly with
// the nodes and whose rates stay under S3's per-prefix limits at 10,000
// nodes, instead of every node listing the checkpoint every 50 ms. The
// nodes meet under a prefix of the checkpoint's own:
//
//   <meeting>/<job>/<checkpoint>/local-commit/g-GGGGGGG/node-NNNNNNN.manifest
//   <meeting>/<job>/<checkpoint>/local-commit/groups/g-GGGGGGG.manifests
//   <meeting>/<job>/<checkpoint>/local-commit/COMMIT
//   <meeting>/<job>/<checkpoint>/local-commit/g-GGGGGGG/COMMITTED
//
// where <meeting> is, for
//   - a root per node (--node_local_root: the node's NVMe, as on most GPU
//     clusters, where no node sees the others' manifests): the remote
//     tier. A node's files are on its disk only, until the remote commit
//     that follows (storage/remote_tier.h) has every node's files in the
//     remote tier; a load that needs another node's file reads it from
//     there (restore/loader.h).
//   - one root every node mounts (a shared file system): that root itself
//     (the directory driver, storage/posix_object_store.h), so the meeting
//     lies inside the checkpoint's directory and goes with it.
//
// Each node, once durable, publishes its manifest there; the tree gathers
// them and writes local-commit/COMMIT (the merge of every node's manifest:
// the same bytes the remote commit writes later); each node, on learning
// of it (within a second), reads it, checks that it holds this node's part
// as the node wrote it, and writes it as COMMIT (and moves LATEST) in its
// root: its own, or, on a shared root, the one all share, where the first
// node to get there writes COMMIT and the others find it (and move LATEST
// only where it does not name the checkpoint yet). From then the
// checkpoint is committed in the local tier.
//
// Crashes: a node killed after the meeting wrote local-commit/COMMIT but
// before its own COMMIT was written finishes it at its next start
// (RollForward; on a shared root any other node finishes it too); a node
// killed before it published means the checkpoint never commits (the
// others give up after the commit timeout, naming what they waited for).
// Retention deletes the meeting's keys with the checkpoint's
// (docs/FORMAT.md).
//
// Thread-safety: all methods may be called from any thread; TryCommit for
// one checkpoint from one thread at a time (the save side's commit
// watcher).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "storage/local_commit.h"
#include "storage/object_store.h"
#include "storage/tree_commit.h"

namespace ckpt {

// The meeting's key prefix below a checkpoint's: "local-commit/".
inline constexpr absl::string_view kLocalCommitPrefix = "local-commit/";
static_assert(kLocalCommitPrefix.substr(0, kLocalCommitPrefix.size() - 1) == kMeetingDirName);

// How often the meeting's nodes poll: the tree commit's 0.4 s at 1,000
// nodes and more (its rates at 10,000 nodes are docs/ARCHITECTURE.md's),
// shorter in proportion for fewer nodes, down to 10 ms at 25 nodes and
// fewer: the nodes' requests together stay at most what 1,000 nodes make
// at 0.4 s (2,500 a second), and the busiest prefix's grow with about the
// square root of the nodes over the interval, so a small job can afford
// to learn of its commit within a few tens of milliseconds instead of the
// four polls' 1.6 s.
absl::Duration MeetingPollInterval(uint32_t nodes);

class TreeLocalCommit : public LocalCommit {
 public:
  // Where the nodes meet, and whether `store`'s root is the one they share.
  enum class Root { kPerNode, kShared };

  // `store` (this node's root) must outlive it. `meeting`: the remote
  // tier's store for Root::kPerNode, one over `store`'s root for
  // Root::kShared. COMMIT and LATEST are written through `ops` (the save's
  // FileOps). `options`: the tree's polls, fallbacks and timeout (the
  // commit timeout).
  TreeLocalCommit(const CheckpointStore* store, std::shared_ptr<ObjectStore> meeting, Root root,
                  uint32_t node_id, TreeCommitOptions options, FileOps& ops = DefaultFileOps());

  absl::StatusOr<bool> TryCommit(const std::string& job, const std::string& checkpoint,
                                 uint32_t nodes) override;
  std::string Waiting(const std::string& job, const std::string& checkpoint,
                      uint32_t nodes) override;
  void Forget(const std::string& job, const std::string& checkpoint) override;
  bool remote() const override { return true; }

  // At start, before uploads resume and before any save: every checkpoint
  // of this root that holds this node's manifest and no COMMIT, and whose
  // meeting wrote local-commit/COMMIT, gets its COMMIT here (a crash cut
  // the commit short). Returns them ("job/checkpoint"); one that cannot be
  // finished is logged and left (gc treats it as any uncommitted one).
  std::vector<std::string> RollForward();

  // "<job>/<checkpoint>/local-commit/".
  static std::string MeetingPrefix(absl::string_view job, absl::string_view checkpoint);

 private:
  struct Meeting {
    TreeCommitNode node;
    absl::Time next;
    // Root::kShared: when to look whether COMMIT is there all the same
    // (TryCommit).
    absl::Time next_commit_check;
  };

  // Reads the meeting's COMMIT, checks that it is this checkpoint's and
  // holds this node, and writes it (then LATEST) into the root, unless
  // another node sharing the root has written it.
  absl::Status WriteLocally(const std::string& job, const std::string& checkpoint);
  // On a shared root: points LATEST at a checkpoint another node
  // committed, unless it names it already (failures logged).
  void MoveLatestTo(const std::string& job, const std::string& checkpoint);

  const CheckpointStore* const store_;
  const std::shared_ptr<ObjectStore> meeting_;
  const Root root_;
  const uint32_t node_id_;
  const TreeCommitOptions options_;
  FileOps& ops_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<Meeting>> meetings_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

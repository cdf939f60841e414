// NodeLocalCommit: the local commit of a job whose nodes each have a root
// of their own (--node_local_root: the node's NVMe, as on most GPU
// clusters), where no node can see the others' manifests. The nodes meet
// in the remote tier instead, with the tree commit (storage/tree_commit.h)
// under a prefix of the checkpoint's own:
//
//   <remote>/<job>/<checkpoint>/local-commit/g-GGGGGGG/node-NNNNNNN.manifest
//   <remote>/<job>/<checkpoint>/local-commit/groups/g-GGGGGGG.manifests
//   <remote>/<job>/<checkpoint>/local-commit/COMMIT
//   <remote>/<job>/<checkpoint>/local-commit/g-GGGGGGG/COMMITTED
//
// Each node, once durable, publishes its manifest there; the tree gathers
// them and writes local-commit/COMMIT (the merge of every node's manifest:
// the same bytes the remote commit writes later); each node, on learning
// of it (within a second), reads it, checks it, and writes it as COMMIT
// (and moves LATEST) in its own root. From then the checkpoint is
// committed in the local tier: every node's part is durable on its own
// disk. A node's files are on its disk only, until the remote commit that
// follows (storage/remote_tier.h) has every node's files in the remote
// tier; a load that needs another node's file reads it from there
// (restore/loader.h). The meeting costs what the remote commit costs: a
// number of requests linear in the nodes, under S3's per-prefix rates at
// 10,000 nodes (docs/ARCHITECTURE.md, "At 10,000 nodes").
//
// Crashes: a node killed after the meeting wrote local-commit/COMMIT but
// before its own COMMIT was written finishes it at its next start
// (RollForward), before its uploads resume; a node killed before it
// published means the checkpoint never commits (the others give up after
// the commit timeout, naming what they waited for). Remote retention
// deletes the meeting's keys with the checkpoint's (docs/FORMAT.md).
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

// How often the meeting's nodes poll: the tree commit's 0.4 s at 1,000
// nodes and more (its rates at 10,000 nodes are docs/ARCHITECTURE.md's),
// shorter in proportion for fewer nodes, down to 50 ms: the requests on
// the busiest prefix grow with about the square root of the nodes over the
// interval, so a small job can afford to learn of its commit in a fraction
// of a second instead of the four polls' 1.6 s.
absl::Duration MeetingPollInterval(uint32_t nodes);

class NodeLocalCommit : public LocalCommit {
 public:
  // `store` (this node's root) and `remote` must outlive it. COMMIT and
  // LATEST are written through `ops` (the save's FileOps). `options`:
  // the tree's polls, fallbacks and timeout (the commit timeout).
  NodeLocalCommit(const CheckpointStore* store, ObjectStore* remote, uint32_t node_id,
                  TreeCommitOptions options, FileOps& ops = DefaultFileOps());

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
  };

  // Reads the meeting's COMMIT, checks that it is this checkpoint's and
  // holds this node, and writes it (then LATEST) into the root.
  absl::Status WriteLocally(const std::string& job, const std::string& checkpoint);

  const CheckpointStore* const store_;
  ObjectStore* const remote_;
  const uint32_t node_id_;
  const TreeCommitOptions options_;
  FileOps& ops_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<Meeting>> meetings_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

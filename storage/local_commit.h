// LocalCommit: how a node whose part of a checkpoint is durable in its
// root (its node manifest written) learns that the checkpoint is committed
// in the local tier, and writes COMMIT there. Two ways stand side by side:
//
//   storage/commit_protocol.h    one root every node mounts (or one node):
//                                the nodes meet in the checkpoint's
//                                directory; whoever sees every node's
//                                manifest writes COMMIT for all of them.
//   storage/tree_local_commit.h  a root per node (--node_local_root: the
//                                node's own NVMe): no node sees the
//                                others' manifests, so the nodes meet in
//                                the remote tier, and each writes the
//                                same COMMIT into its own root.
//
// The save side (save/save_coordinator.h) calls TryCommit once the node is
// durable and then again from its commit watcher until it returns true or
// an error, or the commit timeout passes.
//
// Thread-safety: every implementation's methods may be called from any
// thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt {

class LocalCommit {
 public:
  virtual ~LocalCommit() = default;

  // True once the checkpoint is committed in this node's root (by this
  // call or an earlier one, or, on a shared root, by another node); false
  // while other nodes are not durable yet; an error if it can never commit
  // this way (a damaged or inconsistent manifest, a meeting that timed
  // out).
  virtual absl::StatusOr<bool> TryCommit(const std::string& job, const std::string& checkpoint,
                                         uint32_t nodes) = 0;

  // What the commit still waits for, for the message of a save that gave
  // up waiting ("node manifests present: [0,2] of 4").
  virtual std::string Waiting(const std::string& job, const std::string& checkpoint,
                              uint32_t nodes) = 0;

  // The save ended (committed, failed, cancelled): drop what TryCommit
  // keeps for it. OK to call for a checkpoint it never saw.
  virtual void Forget(const std::string& job, const std::string& checkpoint) = 0;

  // True if TryCommit makes requests to a remote server, which may take
  // as long as that server's deadlines: the save side then never runs it
  // on an I/O worker.
  virtual bool remote() const = 0;
};

}  // namespace ckpt

// NodeLock: "this daemon is node N of this storage root", held for the
// daemon's life as an InstanceLock (common/instance_lock.h) on
// <root>/.ckptd-node-NNNN.lock.
//
// Several daemons share a root, one per node, each with its own --node_id;
// two daemons with the same node id would write the same node manifests and
// remove each other's files, and the second one's startup recovery would
// take the first one's saves in flight for a crash's leftovers. So the
// second refuses to start, naming the holder (pid and host from its record).
//
// The record also carries the tag of the temporaries this daemon writes
// (TemporaryTag, storage/durable_file.h). The next daemon of the node reads
// the tags its predecessors left and startup recovery
// (storage/startup_recovery.h) removes exactly those temporaries, even
// where other nodes write temporaries of the same names (COMMIT, LATEST)
// into the same directories. Tags stay in the record until a recovery has
// run through without an error, so a daemon that crashes during its own
// recovery loses no leftover to the next one.
//
// The lock file is created beneath the root without following symlinks
// (StorageDir), so a link planted under its name is refused. It is not a
// directory, so listing, gc and retention never see it. A shared file
// system without flock (Lustre mounted without -o flock) cannot hold the
// lock: the daemon then starts with a warning, unguarded against a second
// daemon of its node on another host (the socket's lock still guards the
// host), and the record still hands the tags on.
//
// Ownership: owns the lock (move-only). Thread-safety: none; the daemon's
// start-up owns it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/instance_lock.h"

namespace ckpt {

class NodeLock {
 public:
  // At most this many earlier daemons' tags are kept (a daemon that keeps
  // crashing in its recovery must not grow the record without end); the
  // oldest go first.
  static constexpr size_t kMaxEarlierTags = 64;

  // ".ckptd-node-NNNN.lock".
  static std::string FileName(uint32_t node_id);

  // Takes the lock of node `node_id` in the storage root at `root` (opened
  // like StorageDir::OpenRoot) and records this daemon in it (a record it
  // cannot write, on a full disk say, is logged: the lock still holds).
  // FailedPrecondition naming the holder if another daemon has it.
  static absl::StatusOr<NodeLock> Acquire(const std::string& root,
                                          uint32_t node_id);

  NodeLock(NodeLock&&) = default;
  NodeLock& operator=(NodeLock&&) = default;

  // The temporaries' tags of earlier daemons of this node not yet
  // recovered, oldest first; never this daemon's own.
  const std::vector<std::string>& earlier_temp_tags() const {
    return earlier_temp_tags_;
  }
  // Startup recovery removed every earlier daemon's temporaries: the record
  // keeps this daemon's tag only.
  absl::Status RecoveryDone();

 private:
  NodeLock(InstanceLock lock, uint32_t node_id,
           std::vector<std::string> earlier_temp_tags)
      : lock_(std::move(lock)),
        node_id_(node_id),
        earlier_temp_tags_(std::move(earlier_temp_tags)) {}
  // The record: who holds the lock, its tag, and `earlier_temp_tags_`.
  std::string Record() const;

  InstanceLock lock_;
  uint32_t node_id_;
  std::vector<std::string> earlier_temp_tags_;
};

}  // namespace ckpt

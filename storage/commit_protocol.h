// CommitProtocol: turns durable node manifests into a committed checkpoint,
// with storage as the only meeting point of the nodes (no messages).
//
// Each node, once its data files are durable, writes node-NNNN.manifest and
// calls TryCommit. TryCommit lists the checkpoint directory; when every one
// of the `nodes` manifests is there it reads them, merges them into one
// index (MergeNodeManifests), and writes COMMIT, then moves LATEST forward.
// Whichever node sees the last manifest first commits; two nodes finishing at
// once may both commit, which is safe: the merge is a pure function of the
// manifests (ordered by node id, committed_unix_micros = the newest
// manifest's creation time), so both write the same bytes, each through its
// own temporary and an atomic rename. A node that never writes its manifest
// means the checkpoint never commits.
//
// Thread-safety: stateless apart from the store and the FileOps it borrows
// (both thread-safe); safe from any thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/v1/manifest.pb.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"

namespace ckpt {

// Merges node manifests (any order) into a commit record. Fails
// (FailedPrecondition) if they disagree on job, checkpoint, world size or
// node count, if a chunk or data file is stored twice, or if replicas
// disagree: two nodes report different chunks for one replica set, or the
// chunks stored for a set are not the ones its members hold (one was never
// stored, or stored with another dtype or shape).
absl::StatusOr<v1::CommitRecord> MergeNodeManifests(
    std::vector<v1::Manifest> manifests);

class CommitProtocol {
 public:
  // COMMIT and LATEST are written through `ops` (the save's FileOps: the
  // test seam that fails each step of the write, a full disk included).
  explicit CommitProtocol(const CheckpointStore* store,
                          FileOps& ops = DefaultFileOps())
      : store_(store), ops_(ops) {}

  // True once the checkpoint is committed (by this call or by another
  // node); false while node manifests are missing.
  absl::StatusOr<bool> TryCommit(const std::string& job,
                                 const std::string& checkpoint,
                                 uint32_t nodes) const;

 private:
  const CheckpointStore* const store_;
  FileOps& ops_;
};

}  // namespace ckpt

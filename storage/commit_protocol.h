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

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/manifest_check.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "storage/local_commit.h"

namespace ckpt {

// Merges node manifests (any order) into a commit record. Fails
// (FailedPrecondition) if they disagree on job, checkpoint, world size or
// node count, if a chunk or data file is stored twice, or if replicas
// disagree: two nodes report different chunks for one replica set, or the
// chunks stored for a set are not the ones its members hold (one was never
// stored, or stored with another dtype or shape). Fails too
// (FailedPrecondition, naming both sizes) if the framed record would be
// larger than `max_record_bytes`, the most a reader of COMMIT takes
// (format/manifest_check.h): every node manifest may be within that bound
// while their union is not, and such a COMMIT would count as committed and
// move LATEST while no reader could open it. And fails (FailedPrecondition)
// if a manifest was created after `latest_creation_micros`: the commit time
// is the newest manifest's, and LATEST, retention, startup recovery and the
// remote tier all order checkpoints by it, so one crafted manifest dated
// in the year 3000 would keep its checkpoint "newest" for ever (LATEST
// would never move again). TryCommit passes its own clock plus
// kMaxNodeClockSkew; other callers (fuzzers, tools) may leave it open.
absl::StatusOr<v1::CommitRecord> MergeNodeManifests(
    std::vector<v1::Manifest> manifests,
    uint64_t max_record_bytes = kMaxFramedFileBytes,
    int64_t latest_creation_micros = std::numeric_limits<int64_t>::max());

// How far ahead of the committing node's clock another node's may be: a
// node manifest dated later fails the commit (clocks of one cluster are
// synchronized to within milliseconds; an hour leaves room for a node whose
// synchronization broke without failing its saves, and bounds how long a
// crafted date can pin LATEST).
inline constexpr absl::Duration kMaxNodeClockSkew = absl::Hours(1);

class CommitProtocol : public LocalCommit {
 public:
  // COMMIT and LATEST are written through `ops` (the save's FileOps: the
  // test seam that fails each step of the write, a full disk included).
  // `max_record_bytes`: MergeNodeManifests's bound (a test lowers it).
  explicit CommitProtocol(const CheckpointStore* store,
                          FileOps& ops = DefaultFileOps(),
                          uint64_t max_record_bytes = kMaxFramedFileBytes)
      : store_(store), ops_(ops), max_record_bytes_(max_record_bytes) {}

  // True once the checkpoint is committed (by this call or by another
  // node); false while node manifests are missing.
  absl::StatusOr<bool> TryCommit(const std::string& job, const std::string& checkpoint,
                                 uint32_t nodes) override;
  // "node manifests present: [0,2] of 4".
  std::string Waiting(const std::string& job, const std::string& checkpoint,
                      uint32_t nodes) override;
  // Keeps nothing between calls.
  void Forget(const std::string&, const std::string&) override {}
  bool remote() const override { return false; }

 private:
  const CheckpointStore* const store_;
  FileOps& ops_;
  const uint64_t max_record_bytes_;
};

}  // namespace ckpt

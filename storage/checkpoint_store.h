// CheckpointStore: the directory layout under the storage root and the
// commit protocol's file steps.
//
//   <root>/<job>/<checkpoint>/shard-*.safetensors   data files
//   <root>/<job>/<checkpoint>/node-NNNN.manifest     node manifest
//   <root>/<job>/<checkpoint>/COMMIT                 written last
//   <root>/<job>/LATEST                              newest committed name
//
// A checkpoint is visible to readers only once its COMMIT exists and parses
// (invariant 1): List, ReadCommit and ResolveLatest all go through it, so a
// directory a crashed save left behind is never loaded. Job and checkpoint
// names are validated here before any path is built (invariant 7).
//
// Thread-safety: all methods may be called concurrently; callers serialize
// saves of the same checkpoint (SaveCoordinator does).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"

namespace ckpt {

inline constexpr absl::string_view kCommitFileName = "COMMIT";
inline constexpr absl::string_view kLatestFileName = "LATEST";
inline constexpr absl::string_view kLatestAlias = "latest";

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string JobDir(absl::string_view job) const;
  std::string CheckpointDir(absl::string_view job,
                            absl::string_view checkpoint) const;

  // Creates the checkpoint directory for this node's part of a new save.
  // AlreadyExists if the checkpoint is committed. Other nodes may be writing
  // into the same directory, so only this node's leftovers of an earlier,
  // crashed attempt are removed: its node manifest here, its data files as
  // they are rewritten.
  absl::Status PrepareForSave(absl::string_view job, absl::string_view checkpoint,
                              uint32_t node_id) const;

  static std::string NodeManifestName(uint32_t node_id);
  absl::Status WriteNodeManifest(const v1::Manifest& manifest) const;
  // Node ids whose manifest exists in the checkpoint directory.
  absl::StatusOr<std::vector<uint32_t>> ListNodeManifests(
      absl::string_view job, absl::string_view checkpoint) const;
  absl::StatusOr<v1::Manifest> ReadNodeManifest(absl::string_view job,
                                                absl::string_view checkpoint,
                                                uint32_t node_id) const;
  // Deletes a committed checkpoint: COMMIT first (durably), so readers stop
  // seeing it atomically, then its files.
  absl::Status DeleteCommitted(absl::string_view job, absl::string_view checkpoint) const;

  // Removes what one node wrote for an uncommitted checkpoint (`files` and
  // its manifest), then the directory if that left it empty.
  absl::Status RemoveNodePart(absl::string_view job, absl::string_view checkpoint,
                              uint32_t node_id,
                              const std::vector<std::string>& files) const;

  // True if the checkpoint's COMMIT file exists (a stat, for fast checks).
  bool IsCommitted(absl::string_view job, absl::string_view checkpoint) const;

  // Writes COMMIT durably: from here on the checkpoint is committed.
  absl::Status WriteCommit(const v1::CommitRecord& record) const;
  // Points LATEST at `checkpoint` (committed at `committed_unix_micros`)
  // unless it already names a checkpoint committed later; call only after
  // WriteCommit succeeded.
  absl::Status UpdateLatest(absl::string_view job, absl::string_view checkpoint,
                            int64_t committed_unix_micros) const;

  // The commit record of a committed checkpoint; NotFound if it is not
  // committed. `checkpoint` may be "latest".
  absl::StatusOr<v1::CommitRecord> ReadCommit(absl::string_view job,
                                              absl::string_view checkpoint) const;

  // The name LATEST points at; NotFound if the job has no committed
  // checkpoint.
  absl::StatusOr<std::string> ResolveLatest(absl::string_view job) const;

  // Every checkpoint directory of `job` (or of every job when empty),
  // committed or not, sorted by job and name.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> List(
      absl::string_view job) const;

 private:
  absl::StatusOr<std::vector<std::string>> ListDirs(const std::string& dir) const;
  const std::string root_;
  // Serializes LATEST updates, so concurrent commits cannot interleave.
  mutable absl::Mutex latest_mu_;
};

}  // namespace ckpt

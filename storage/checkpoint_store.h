// CheckpointStore: the directory layout under the storage root and the
// commit protocol's file steps.
//
//   <root>/<job>/<checkpoint>/shard-*.safetensors   data files
//   <root>/<job>/<checkpoint>/node-NNNN.manifest     node manifest
//   <root>/<job>/<checkpoint>/COMMIT                 written last
//   <root>/<job>/LATEST                              newest committed name
//
// The root is the directory driver of the storage seam
// (posix_object_store.h), opened once, when the store is made. The commit
// protocol's objects (node manifests, COMMIT, LATEST) are written, read,
// listed and deleted through its ObjectStore interface, under the same
// keys ("job/step-100/COMMIT") the remote tier gives them in its own
// store. What an object interface cannot say is done on the driver's root
// directory, held open: whether a directory holds files ckptd did not
// make, the O_DIRECT data files (save/part_writer.cc, restore/), and the
// removal of a checkpoint's tree with its marker last. Every name under
// the root is resolved from that descriptor without following symlinks
// (StorageDir), so a link planted in the root is refused, never followed.
//
// A checkpoint is visible to readers only once its COMMIT exists, parses and
// passes ValidateCommitRecord (invariant 1): List, ReadCommit and
// ResolveLatest all go through it, so a directory a crashed save left
// behind, or a COMMIT with hostile fields, is never loaded. Job and
// checkpoint names are validated here before any path is built
// (invariant 7).
//
// Every checkpoint directory ckptd creates holds a marker file
// (kMarkerFileName), written durably before any data file. Deletion (gc,
// retention) removes only marked directories and removes the marker last:
// a directory someone else put under the root (a DCP checkpoint copied
// there) is never deleted.
//
// Thread-safety: all methods may be called concurrently; callers serialize
// saves of the same checkpoint (SaveCoordinator does).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"
#include "storage/durable_file.h"
#include "storage/posix_object_store.h"
#include "storage/storage_dir.h"

namespace ckpt {

inline constexpr absl::string_view kCommitFileName = "COMMIT";
inline constexpr absl::string_view kLatestFileName = "LATEST";
inline constexpr absl::string_view kLatestAlias = "latest";
// "ckptd made this checkpoint directory" (docs/FORMAT.md).
inline constexpr absl::string_view kMarkerFileName = ".ckptd-checkpoint";
// Where several nodes meet to commit it, on a shared root
// (storage/tree_local_commit.h): ckptd's too, and goes with it.
inline constexpr absl::string_view kMeetingDirName = "local-commit";
inline constexpr absl::string_view kMarkerContent = "ckptd checkpoint directory, format 1\n";

class CheckpointStore {
 public:
  // Opens `root` (which must exist and not be a symlink) once; status()
  // says whether that worked, and every method fails with it if not.
  explicit CheckpointStore(std::string root);

  absl::Status status() const { return objects_.status(); }
  const std::string& root() const { return root_; }
  // The root, held open (startup recovery walks it); status() if not open.
  absl::StatusOr<const StorageDir*> Root() const;
  // The root's directory driver, for what meets in the root itself (the
  // nodes of a shared root: storage/tree_local_commit.h); status() if not
  // open.
  absl::StatusOr<std::shared_ptr<PosixObjectStore>> Objects() const;
  // Paths, for messages only: files are opened through OpenCheckpoint.
  std::string JobDir(absl::string_view job) const;
  std::string CheckpointDir(absl::string_view job,
                            absl::string_view checkpoint) const;

  // The job's or checkpoint's directory, held open, reached from the root
  // without symlinks; names validated. NotFound if it does not exist.
  absl::StatusOr<StorageDir> OpenJob(absl::string_view job) const;
  absl::StatusOr<StorageDir> OpenCheckpoint(absl::string_view job,
                                            absl::string_view checkpoint) const;
  // True if the checkpoint directory holds ckptd's marker.
  absl::StatusOr<bool> IsMarked(absl::string_view job,
                                absl::string_view checkpoint) const;

  // Creates the checkpoint directory for this node's part of a new save.
  // AlreadyExists if the checkpoint is committed. Other nodes may be writing
  // into the same directory, so only this node's leftovers of an earlier,
  // crashed attempt are removed: its node manifest here, its data files as
  // they are rewritten. A directory that exists without ckptd's marker and
  // holds anything is not ckptd's: FailedPrecondition, nothing written.
  // The marker is written through `ops` (the save's FileOps).
  absl::Status PrepareForSave(absl::string_view job, absl::string_view checkpoint,
                              uint32_t node_id,
                              FileOps& ops = DefaultFileOps()) const;

  static std::string NodeManifestName(uint32_t node_id);
  // Writes this node's manifest durably through `ops` (the save's FileOps,
  // so that a test can fail any step of it).
  absl::Status WriteNodeManifest(const v1::Manifest& manifest,
                                 FileOps& ops = DefaultFileOps()) const;
  // Node ids whose manifest exists in the checkpoint directory.
  absl::StatusOr<std::vector<uint32_t>> ListNodeManifests(
      absl::string_view job, absl::string_view checkpoint) const;
  absl::StatusOr<v1::Manifest> ReadNodeManifest(absl::string_view job,
                                                absl::string_view checkpoint,
                                                uint32_t node_id) const;
  // Deletes a committed checkpoint: COMMIT first (durably), so readers stop
  // seeing it atomically, then its files, the marker last.
  // FailedPrecondition, nothing deleted, if the directory has no marker.
  absl::Status DeleteCommitted(absl::string_view job, absl::string_view checkpoint) const;
  // Deletes an uncommitted checkpoint directory (gc), the marker last.
  // FailedPrecondition, nothing deleted, if it has no marker or is
  // committed.
  absl::Status DeleteUncommitted(absl::string_view job,
                                 absl::string_view checkpoint) const;

  // Removes what one node wrote for an uncommitted checkpoint (`files` and
  // its manifest), then the directory if that left it empty.
  absl::Status RemoveNodePart(absl::string_view job, absl::string_view checkpoint,
                              uint32_t node_id,
                              const std::vector<std::string>& files) const;

  // True if the checkpoint's COMMIT file exists as a regular file (no
  // parse, for fast checks); false also when it cannot be told.
  bool IsCommitted(absl::string_view job, absl::string_view checkpoint) const;

  // Writes COMMIT durably through `ops` (the save's FileOps, so that a test
  // can fail any step of it): from here on the checkpoint is committed.
  absl::Status WriteCommit(const v1::CommitRecord& record,
                           FileOps& ops = DefaultFileOps()) const;
  // Takes back a COMMIT whose write failed (unlink, fsync the directory),
  // for a node that alone commits its checkpoints: a failure after the
  // rename (the directory's fsync) leaves COMMIT in place, and the save is
  // about to be reported failed. OK if there is no COMMIT; an error if it
  // cannot be said to be gone.
  absl::Status WithdrawCommit(absl::string_view job,
                              absl::string_view checkpoint) const;
  // Points LATEST at `checkpoint` (committed at `committed_unix_micros`)
  // unless it already names a checkpoint committed later; call only after
  // WriteCommit succeeded. LATEST is written through `ops`.
  absl::Status UpdateLatest(absl::string_view job, absl::string_view checkpoint,
                            int64_t committed_unix_micros,
                            FileOps& ops = DefaultFileOps()) const;

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
  // Whether COMMIT exists as a regular file; an error if it cannot be told
  // (a symlink under its name, a checkpoint directory that is a symlink).
  absl::StatusOr<bool> CommitExists(absl::string_view job,
                                    absl::string_view checkpoint) const;
  // Names of the real subdirectories of `dir` with valid storage names.
  static absl::StatusOr<std::vector<std::string>> ListDirs(const StorageDir& dir);
  // The driver, or status().
  absl::StatusOr<PosixObjectStore*> Driver() const;
  // A whole small object (GetSmallObject); its directory missing is NotFound
  // too. Names validated by the caller.
  absl::StatusOr<std::string> ReadObject(absl::string_view key, uint64_t max_bytes) const;

  const std::string root_;
  const absl::StatusOr<std::shared_ptr<PosixObjectStore>> objects_;
  // Serializes LATEST updates, so concurrent commits cannot interleave.
  mutable absl::Mutex latest_mu_;
};

}  // namespace ckpt

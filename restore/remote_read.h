// Reading a round's data files from the remote tier (storage/remote_tier.h),
// for the loader (restore/loader.h): ReadFromRemote reads a file of a
// checkpoint committed only there, window by window; RemoteFallback reads a
// local file that cannot be read from the remote tier's copy of the same
// checkpoint instead. Either way every block is verified against the
// COMMIT's checksums before any byte of it reaches a rank's memory, as from
// storage (restore/shard_reader.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/v1/manifest.pb.h"
#include "restore/shard_reader.h"
#include "storage/remote_tier.h"

namespace ckpt {

// Reads `request` from the remote tier's copy of its file, window by
// window: each window's bytes (ShardReader::Extent) are fetched with ranged
// GETs into memory and verified block by block like a memory-tier image, so
// a file of any size restores within the tier's fetch_bytes. A window is
// one round of the tier's requests in flight (RemoteTier::
// fetch_window_bytes, cut at checksum blocks), and the next window is
// fetched while this one is verified and copied, where the fetch memory is
// free for it: the network is not left idle while the CPU checks a window,
// nor the CPU while a window arrives. Returns the bytes fetched.
absl::StatusOr<uint64_t> ReadFromRemote(const RemoteTier& tier, const std::string& job,
                                        const std::string& checkpoint,
                                        const ShardReadRequest& request, ShardReader& reader);

// Whether a local file's read failed in a way its remote copy can mend:
// the file missing, unreadable, short or failing its checksums, an I/O
// error. Not a cancelled load, a pool or memory shortage, or memory a GPU
// copy may still read: those would fail the same way again.
bool RemoteCopyMayMend(const absl::Status& status);

// The remote tier one round's local files that cannot be read are read
// from instead, and what the round learnt of it: whether it holds the
// round's very checkpoint (asked once per round, by the first file that
// needs it), and how many files it mended.
//
// Thread-safety: Mend and files_mended may be called from any thread (the
// round's I/O workers).
class RemoteFallback {
 public:
  // Mends the files of `job`/`checkpoint`, whose local COMMIT is `local`,
  // from `tier`. All four must outlive this.
  RemoteFallback(const RemoteTier& tier, const std::string& job, const std::string& checkpoint,
                 const v1::CommitRecord& local)
      : tier_(tier), job_(job), checkpoint_(checkpoint), local_(local) {}
  RemoteFallback(const RemoteFallback&) = delete;
  RemoteFallback& operator=(const RemoteFallback&) = delete;

  const RemoteTier& tier() const { return tier_; }

  // A local file that could not be read (`local_error`) read from the remote
  // tier's copy of the same checkpoint instead, verified against the same
  // per-block checksums (a remote copy damaged too fails as the local one
  // did). Returns the bytes fetched, or the local error with why the remote
  // copy did not mend it.
  absl::StatusOr<uint64_t> Mend(const ShardReadRequest& request, ShardReader& reader,
                                const absl::Status& local_error);

  // The files Mend read from the remote tier so far.
  size_t files_mended() const { return files_mended_.load(); }

 private:
  // OK if the remote tier holds this very checkpoint: its COMMIT equal to
  // the local one, so its files are the ones the local checksums describe.
  // Asked once per round, by the first file that needs it.
  absl::Status HoldsSame();

  // The remote COMMIT was not there (`not_there`). With a root per node
  // (storage/tree_local_commit.h) a checkpoint is committed on every
  // node's disk while its upload still runs, and another node's files
  // reach the remote tier only with it: if this daemon's upload of the
  // checkpoint is queued or running, waits for it to end (the upload
  // timeout bounds it), then reads the remote COMMIT again.
  absl::StatusOr<v1::CommitRecord> AwaitRemoteCommit(absl::Status not_there) const;

  const RemoteTier& tier_;
  const std::string& job_;
  const std::string& checkpoint_;
  const v1::CommitRecord& local_;
  absl::once_flag checked_;
  absl::Status holds_same_;  // set once, by HoldsSame
  std::atomic<size_t> files_mended_{0};
};

}  // namespace ckpt

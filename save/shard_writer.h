// ShardWriter: streams one data file from a peer's memory to storage.
//
// The file is cut into windows of one staging buffer each. Each window goes
// through four steps, all on the calling thread:
//   1. *staged*: borrow a buffer from the pool, put the safetensors header
//      in it, and enqueue the copy of the chunks' bytes from the peer on a
//      CopyOutBatch (for host memory, preads of the peer's bound memory
//      file, complete at once; D2H copies on the peer's GPU streams,
//      complete later);
//   2. *hashed*, in file order: wait for its copies, hash the chunk bytes
//      into their per-block XXH3, zero-pad it to 4096 for O_DIRECT;
//   3. *written*: once its turn under the write rate cap has come
//      (RateLimiter), handed to the IoPipeline as an O_DIRECT write at the
//      window's offset;
//   4. with a memory-tier image to fill (ShardWriteRequest::capture),
//      *captured*: copied from the buffer into the image after its write.
// Staging runs ahead while pool buffers are free: it hashes windows whose
// copies are already done and starts the writes whose turn has come, but it
// never waits for a turn or copies into the tier image, so the last copy is
// enqueued (the GPU-side STAGED) and complete (STAGED) as early as the pool
// allows, whatever the cap and the tier. Under a cap, hashed windows wait
// for their turn in their buffers; captures wait until staging is done or
// out of buffers. When no buffer is free, the writer first does what frees
// one of its own: a capture, hashing its oldest staged window, reaping its
// writes, or waiting for its next write's turn; with nothing of its own
// under way it blocks on the pool. That is the back-pressure that bounds
// memory for checkpoints larger than the pool (every window in any step
// holds its buffer, and there is no other queue), and what makes the
// staging of a state larger than the pool follow storage, cap included.
// The file is created when its first write is due, not before: a window's
// copies are enqueued before it is hashed and written, so when copies
// complete later (a GPU's) and the pool holds the file, every copy is
// enqueued (the GPU-side STAGED) before the file system is touched; its
// directory may even be prepared then (ShardWriteRequest::open_dir). Host
// copies complete at once, so there the first window's write creates it.
// Once every write has completed the file is truncated to its exact size
// and fsynced (an fsync is not ordered after writes still in flight, so it
// must come after them), both through FileOps, the seam that lets tests
// fail either step. Any error removes the file: a failed Write leaves no
// data file behind. Write returns OK only once every window is written and
// captured.
//
// Staging buffers are StagingLeases: a staged window holds its lease until
// its copies are done, a hashed one until its write starts, then the
// IoPipeline holds it until its write's completion is reaped, and a window
// to capture until its capture. On every return, each buffer is back in the
// pool and none went back while a copy or a write on it was in flight; one
// whose copy or write can never be seen to end is kept out of the pool for
// good (logged) rather than lent to another save.
//
// Ownership: borrows the pool, the queue, the file operations and everything
// passed to Write. Thread-safety: one call at a time per object; objects are
// independent.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "format/safetensors_layout.h"
#include "io/io_queue.h"
#include "io/rate_limiter.h"
#include "io/staging_pool.h"
#include "session/memory_source.h"
#include "storage/durable_file.h"
#include "storage/storage_dir.h"

namespace ckpt {

struct ShardWriteProgress {
  uint64_t bytes_staged = 0;   // file bytes filled into staging buffers
  uint64_t bytes_written = 0;  // file bytes whose write completed
};

struct ShardWriteRequest {
  // The file to create, O_EXCL: `name` in the open checkpoint directory
  // `dir` (resolved beneath it without symlinks, the way every name under
  // the storage root must be: storage/storage_dir.h), with `path` its full
  // name for messages. Without `dir` or `open_dir`, `path` is opened as
  // given, with O_NOFOLLOW and its directory opened O_NOFOLLOW: a symlink
  // planted as the file or the checkpoint directory is refused, not
  // followed.
  std::string path;
  const StorageDir* dir = nullptr;
  std::string name;
  // Optional, instead of `dir`: gives the directory to create `name` in,
  // called once, when the file is about to be created (its first write is
  // due). An error fails the write; no file was created then.
  std::function<absl::StatusOr<const StorageDir*>()> open_dir;
  const SafetensorsLayout* layout = nullptr;
  std::vector<uint64_t> remote;   // peer address of each entry's bytes
  std::vector<uint64_t> lengths;  // bytes of each entry
  uint64_t checksum_block_bytes = 0;
  MemorySource* source = nullptr;
  // Optional: the batch to enqueue copies on (one per save part, shared by
  // its files); without one the writer makes its own from `source`.
  CopyOutBatch* batch = nullptr;
  // This file's last window completes the batch: call batch->AllEnqueued()
  // after enqueuing it, then on_enqueued.
  bool last_file_of_batch = true;
  std::function<void()> on_enqueued;
  // Once true, the writer stops at its next step (no new window is staged,
  // no write waits for its turn any more) and Write returns Cancelled,
  // unless every write of the file had completed already.
  const std::atomic<bool>* cancelled = nullptr;
  RateLimiter* limiter = nullptr;  // optional write rate cap
  // Optional: each window is also copied here (a MemoryTier image of at
  // least file_size bytes) after its write, off the staging path; when
  // Write returns OK the image holds the whole file.
  char* capture = nullptr;
  // Called after each window is staged and after each write completes.
  std::function<void(const ShardWriteProgress&)> on_progress;
  // Called once, when every source byte is in a staging buffer (its copy
  // complete).
  std::function<void()> on_staged;
};

struct ShardWriteResult {
  uint64_t file_size = 0;
  std::vector<std::vector<uint64_t>> block_xxh3;  // per entry
  // When each phase of the file ended, for the part's log line (how much of
  // the writing overlapped the staging): every copy enqueued, every copy
  // complete, the first write started, the last write complete, the fsync
  // done.
  using Clock = std::chrono::steady_clock;
  Clock::time_point enqueued_at, staged_at, first_write_at, written_at, synced_at;
};

class ShardWriter {
 public:
  ShardWriter(StagingPool* pool, IoQueue* queue,
              FileOps& file_ops = DefaultFileOps())
      : pool_(pool), queue_(queue), file_ops_(file_ops) {}
  absl::StatusOr<ShardWriteResult> Write(const ShardWriteRequest& request);

 private:
  // Stages, hashes and writes every window into the file `file_fd` gives
  // (creating it on its first call); returns once no copy and no write of
  // the file is in flight, on every path.
  absl::StatusOr<ShardWriteResult> WriteWindows(
      const ShardWriteRequest& request, absl::FunctionRef<absl::StatusOr<int>()> file_fd);

  StagingPool* const pool_;
  IoQueue* const queue_;
  FileOps& file_ops_;
};

}  // namespace ckpt

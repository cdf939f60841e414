// ShardWriter: streams a part's data files from a peer's memory to storage.
//
// The files, one after another, are cut into windows of one staging buffer
// each, one stream of windows for all of them: staging runs ahead across
// file boundaries, so a part of several files (one per replica set) stages
// its last file's copies without waiting for its first file's writes. Each
// window goes through four steps, all on the calling thread:
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
//   4. with a memory-tier image to fill (ShardFile::capture),
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
// A file is created when its first write is due, not before: a window's
// copies are enqueued before it is hashed and written, so when copies
// complete later (a GPU's) and the pool holds the files, every copy is
// enqueued (the GPU-side STAGED) before the file system is touched; the
// directory may even be prepared then (ShardFile::open_dir). Host copies
// complete at once, so there a file's first window's write creates it.
// Windows are written in order, file after file. Once every write has
// completed each file is truncated to its exact size, fsynced (an fsync is
// not ordered after writes still in flight, so it must come after them)
// and closed, both steps through FileOps, the seam that lets tests fail
// either; not earlier, because an fsync takes milliseconds and staging must
// not wait for one. A write holds at most kMaxOpenDataFiles data files
// open: one of more files finishes its oldest early, once no write is in
// flight, before it creates the next. Any error removes every file the call
// created: a failed Write leaves no data file behind. Write returns OK only
// once every window is written and captured and every file synced.
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

#include "absl/status/statusor.h"
#include "format/safetensors_layout.h"
#include "io/io_queue.h"
#include "io/rate_limiter.h"
#include "io/staging_pool.h"
#include "session/memory_source.h"
#include "storage/durable_file.h"
#include "storage/storage_dir.h"

namespace ckpt {

// Data files one Write holds open at most (daemon/open_files_limit.h counts
// them per I/O worker). A rank owns one file per replica set it is in:
// rarely more than three (a Megatron rank's TP-replicated norms, its TP
// shard, its distributed-optimizer shard).
inline constexpr size_t kMaxOpenDataFiles = 4;

struct ShardWriteProgress {
  uint64_t bytes_staged = 0;   // file bytes filled into staging buffers
  uint64_t bytes_written = 0;  // file bytes whose write completed
};

// One data file of a write.
struct ShardFile {
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
  // Optional: each window is also copied here (a MemoryTier image of at
  // least file_size bytes) after its write, off the staging path; when
  // Write returns OK the image holds the whole file.
  char* capture = nullptr;
};

struct ShardWriteRequest {
  // Written in this order, as one stream of windows (at least one file).
  std::vector<ShardFile> files;
  uint64_t checksum_block_bytes = 0;
  MemorySource* source = nullptr;
  // Optional: the batch to enqueue copies on (one per save part); without
  // one the writer makes its own from `source`. After the last window of
  // the last file is enqueued the writer calls batch->AllEnqueued(), then
  // on_enqueued.
  CopyOutBatch* batch = nullptr;
  std::function<void()> on_enqueued;
  // Once true, the writer stops at its next step (no new window is staged,
  // no write waits for its turn any more) and Write returns Cancelled,
  // unless every write had completed already.
  const std::atomic<bool>* cancelled = nullptr;
  RateLimiter* limiter = nullptr;  // optional write rate cap
  // Called after each window is staged and after each write completes,
  // with the bytes of all the files so far.
  std::function<void(const ShardWriteProgress&)> on_progress;
  // Called once, when every source byte of every file is in a staging
  // buffer (its copy complete).
  std::function<void()> on_staged;
};

struct ShardWriteResult {
  uint64_t file_size = 0;
  std::vector<std::vector<uint64_t>> block_xxh3;  // per entry
  // When each phase ended, for the part's log line (how much of the writing
  // overlapped the staging): every copy of the write enqueued and complete
  // (the same for all its files), this file's first write started, the
  // write's last write complete, this file's fsync done.
  using Clock = std::chrono::steady_clock;
  Clock::time_point enqueued_at, staged_at, first_write_at, written_at, synced_at;
};

class ShardWriter {
 public:
  ShardWriter(StagingPool* pool, IoQueue* queue,
              FileOps& file_ops = DefaultFileOps())
      : pool_(pool), queue_(queue), file_ops_(file_ops) {}
  // One result per file of the request, in its order.
  absl::StatusOr<std::vector<ShardWriteResult>> Write(const ShardWriteRequest& request);

 private:

  StagingPool* const pool_;
  IoQueue* const queue_;
  FileOps& file_ops_;
};

}  // namespace ckpt

// PartWriter: writes one rank's part of a checkpoint on an I/O worker.
//
// A part is the data files the rank owns under the node plan. Write writes
// them in one ShardWriter call, one stream of windows, all their copies in
// one CopyOutBatch so that the trainer's staged events are recorded once,
// after the last copy, and no file's copies wait for another file's writes.
// The checkpoint directory is prepared (once per attempt, by whichever of
// its parts gets there first) when the part's first file is created, which
// ShardWriter puts off until that file's first write: after the copies it
// could enqueue, so that the GPU-side STAGED does not wait for the file
// system. Each window may also be copied into a MemoryTier image, after its
// write. Progress goes to the SaveProgressBoard as it happens: byte
// counters (throttled), the GPU-side STAGED (copies_enqueued) and STAGED.
//
// Ownership: borrows the store, pool, tier, board and file operations,
// which outlive it; owns the write rate limiter all writes share (its rate
// changes live, SetWriteRateLimit). The limiter paces only the writes: a
// part the pool holds is staged at full speed whatever the cap.
// Thread-safety: Write may run on several workers at once (one part each).
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "io/io_queue.h"
#include "io/rate_limiter.h"
#include "io/staging_pool.h"
#include "save/save_part.h"
#include "save/save_progress_board.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "storage/memory_tier.h"

namespace ckpt {

class PartWriter {
 public:
  struct Options {
    uint32_t node_id = 0;
    uint64_t checksum_block_bytes = 0;
    uint64_t write_rate_limit = 0;  // bytes per second; 0: unlimited
  };

  // `file_ops` trims and fsyncs each data file (ShardWriter): the seam
  // through which tests fail those steps.
  PartWriter(const Options& options, const CheckpointStore* store,
             StagingPool* pool, MemoryTier* tier, SaveProgressBoard* board,
             FileOps& file_ops = DefaultFileOps())
      : options_(options),
        store_(store),
        pool_(pool),
        tier_(tier),
        board_(board),
        file_ops_(file_ops),
        limiter_(options.write_rate_limit) {}

  // Writes and fsyncs every file of `part` with `queue` (the worker's);
  // OK once all of them are durable. Cancelled if the part was cancelled.
  // Fills part.results.
  absl::Status Write(SavePart& part, IoQueue& queue);

  // The write rate cap from the next write on (SIGHUP); 0: unlimited.
  void SetWriteRateLimit(uint64_t bytes_per_second) {
    limiter_.SetRate(bytes_per_second);
  }

  // Tensor bytes written to data files since start (headers excluded).
  uint64_t tensor_bytes_written() const { return tensor_bytes_written_.load(); }

 private:
  // Claims the job and prepares the checkpoint directory for the part's
  // attempt, the first time any of its parts asks; the outcome afterwards.
  absl::Status Prepare(const SavePart& part);
  // Publishes the phase change `staged` (STAGED, or with false only the
  // GPU-side copies_enqueued) unless the part already ended.
  void MarkStaged(const SavePart& part, bool staged);

  const Options options_;
  const CheckpointStore* const store_;
  StagingPool* const pool_;
  MemoryTier* const tier_;
  SaveProgressBoard* const board_;
  FileOps& file_ops_;
  RateLimiter limiter_;
  std::atomic<uint64_t> tensor_bytes_written_{0};
};

}  // namespace ckpt

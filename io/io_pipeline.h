// IoPipeline: whole transfers on top of an IoQueue, each on a borrowed
// staging buffer.
//
// Follows liburing's io_uring-cp loop: keep up to depth() transfers in
// flight; on a short transfer advance buffer and offset and requeue the
// rest; on -EAGAIN or -EINTR requeue as is; any other negative result fails
// that transfer with ErrnoToStatus(-res, "<read|write> <path-less context>").
// A read that returns 0 (end of file) finishes the transfer early and
// reports the bytes transferred so far; a write that returns 0 is an error
// (no progress).
//
// Buffers: a transfer starts with the StagingLease of the buffer it reads
// into or writes from, and the pipeline keeps that lease until the
// transfer's last completion has been reaped; only then does it come back
// out, in Finished::buffer. So a buffer cannot go back to the pool, nor be
// refilled by its caller, while the kernel may still touch it: not on an
// error path, not on an early return. Destroying the pipeline (or Abort)
// waits for every transfer in flight before their leases go; if the queue
// fails so that a completion can never be reaped, that buffer is withheld
// from the pool for the process's life (logged) instead of being lent to
// another save while a transfer may still be running on it.
//
// Ownership: borrows the IoQueue, which must outlive the pipeline; owns the
// leases of its unfinished transfers. Thread-safety: none; used by the
// thread that owns the queue.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"

namespace ckpt {

class IoPipeline {
 public:
  struct Finished {
    uint64_t tag = 0;
    absl::Status status;
    uint64_t bytes = 0;   // transferred in total
    StagingLease buffer;  // the transfer's buffer, the caller's again
  };

  explicit IoPipeline(IoQueue* queue);
  // Abort()s whatever is unfinished: returns only when no transfer of this
  // pipeline is in flight any more.
  ~IoPipeline();
  IoPipeline(const IoPipeline&) = delete;
  IoPipeline& operator=(const IoPipeline&) = delete;

  // Starts a whole transfer. [request.buffer, request.buffer +
  // request.length) must lie inside `buffer`, whose registered index the
  // request gets. If the queue is full, the transfer is held back and
  // submitted as earlier transfers complete. `request.tag` must be unique
  // among unfinished transfers. On error the transfer was not started and
  // `buffer` goes back to the pool (nothing was in flight on it).
  absl::Status Start(IoRequest request, StagingLease buffer);

  // Waits until at least one transfer has finished (returns at once if none
  // is unfinished) and appends every finished transfer to `done`. The
  // returned Status is an error only if the queue itself failed; errors of
  // single transfers are in their Finished::status.
  absl::Status WaitSome(std::vector<Finished>* done);

  // Like WaitSome but never blocks.
  absl::Status Poll(std::vector<Finished>* done);

  // Ends every unfinished transfer, for a caller that gives up after an
  // error: those held back are dropped unstarted, those in flight are waited
  // for and their results discarded, and every lease goes back to the pool.
  // A Reap that fails is retried a few times; if the queue still fails, the
  // buffers of transfers still in flight are withheld (see above). Returns
  // the first error the queue reported while waiting, even if a retry then
  // reaped everything.
  absl::Status Abort();

  // Transfers started and not yet returned by WaitSome/Poll.
  size_t unfinished() const { return transfers_.size(); }

 private:
  struct Transfer {
    IoRequest original;
    IoRequest remaining;  // what still has to be transferred
    StagingLease buffer;  // held until the last completion is reaped
  };

  absl::Status SubmitHeld();
  absl::Status Drain(uint32_t min_completions, std::vector<Finished>* done);

  IoQueue* const queue_;
  std::unordered_map<uint64_t, Transfer> transfers_;  // by tag
  std::deque<uint64_t> held_;  // tags waiting for a free queue slot
  uint32_t in_flight_ = 0;     // requests submitted to the queue
  std::vector<IoCompletion> completions_;  // reused scratch
  std::vector<IoRequest> batch_;           // reused scratch for SubmitHeld
};

}  // namespace ckpt

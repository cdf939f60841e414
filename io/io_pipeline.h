// IoPipeline: whole transfers on top of an IoQueue.
//
// Follows liburing's io_uring-cp loop: keep up to depth() transfers in
// flight; on a short transfer advance buffer and offset and requeue the
// rest; on -EAGAIN or -EINTR requeue as is; any other negative result fails
// that transfer with ErrnoToStatus(-res, "<read|write> <path-less context>").
// A read that returns 0 (end of file) finishes the transfer early and
// reports the bytes transferred so far; a write that returns 0 is an error
// (no progress).
//
// Ownership: borrows the IoQueue, which must outlive the pipeline. Buffers
// belong to the caller and must stay valid until their transfer finishes.
// Thread-safety: none; used by the thread that owns the queue.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "io/io_queue.h"

namespace ckpt {

class IoPipeline {
 public:
  struct Finished {
    uint64_t tag = 0;
    absl::Status status;
    uint64_t bytes = 0;  // transferred in total
  };

  explicit IoPipeline(IoQueue* queue);

  // Starts a whole transfer. If the queue is full, it is held back and
  // submitted as earlier transfers complete. `request.tag` must be unique
  // among unfinished transfers.
  absl::Status Start(const IoRequest& request);

  // Waits until at least one transfer has finished (returns at once if none
  // is unfinished) and appends every finished transfer to `done`. The
  // returned Status is an error only if the queue itself failed; errors of
  // single transfers are in their Finished::status.
  absl::Status WaitSome(std::vector<Finished>* done);

  // Like WaitSome but never blocks.
  absl::Status Poll(std::vector<Finished>* done);

  // Transfers started and not yet returned by WaitSome/Poll.
  size_t unfinished() const { return transfers_.size(); }

 private:
  struct Transfer {
    IoRequest original;
    IoRequest remaining;  // what still has to be transferred
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

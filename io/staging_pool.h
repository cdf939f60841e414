// StagingPool: the daemon's bounded set of pinned staging buffers.
//
// One anonymous mapping of `pool_bytes`, populated and mlock()ed at start-up
// (where the process may lock memory),
// cut into equal buffers of `buffer_bytes` (a multiple of 4096, so each is
// O_DIRECT-aligned). Every I/O worker registers all buffers with its
// io_uring once; saves and loads only borrow them, so after start-up nothing
// is allocated per save and the daemon's memory stays bounded by the pool
// (invariant 5). When all buffers are out, Acquire blocks: that is the
// back-pressure that lets a checkpoint larger than the pool stream through.
//
// Thread-safety: Acquire/TryAcquire/Release may be called from any thread.
#pragma once

#include <sys/uio.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"

namespace ckpt {

struct StagingBuffer {
  char* data = nullptr;
  uint32_t size = 0;
  int index = -1;  // registered-buffer index (same in every worker's ring)
};

class StagingPool {
 public:
  // Fails if the mapping fails. If mlock fails (RLIMIT_MEMLOCK too low; the
  // systemd unit raises it) the pool is used unpinned, with a warning.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(
      uint64_t pool_bytes, uint32_t buffer_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Blocks until a buffer is free.
  StagingBuffer Acquire();
  // A free buffer, or one with data == nullptr if none is free now.
  StagingBuffer TryAcquire();
  void Release(const StagingBuffer& buffer);

  // One iovec per buffer, in index order, for io_uring registration.
  const std::vector<iovec>& iovecs() const { return iovecs_; }
  uint32_t buffer_bytes() const { return buffer_bytes_; }
  // The first buffer; every buffer lies in [base(), base() + pool_bytes()).
  char* base() const { return base_; }
  uint64_t pool_bytes() const { return uint64_t{buffer_bytes_} * iovecs_.size(); }
  uint64_t free_bytes() const;

 private:
  StagingPool(char* base, uint64_t mapped_bytes, uint32_t buffer_bytes);

  // Constant after construction.
  char* const base_;
  const uint64_t mapped_bytes_;
  const uint32_t buffer_bytes_;
  std::vector<iovec> iovecs_;

  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);  // indexes of free buffers
};

}  // namespace ckpt

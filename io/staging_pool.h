// StagingPool: the daemon's bounded set of pinned staging buffers, lent out
// as move-only StagingLeases.
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
// A borrowed buffer is a StagingLease, never a raw pointer handed back by
// hand: the buffer goes back when the lease is destroyed, so no early return
// can leak it, and a lease moved elsewhere (into IoPipeline with the transfer
// that uses it) goes back only from there, when that transfer is over.
//
// Ownership: the pool owns the mapping; it must outlive every lease.
// Thread-safety: Acquire/TryAcquire, returning a lease and the observers may
// be used from any thread.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon_metrics.h"

namespace ckpt {

class StagingPool;

// The right to use one staging buffer until the lease is destroyed or
// Reset, when the buffer goes back to its pool. Move-only: a moved-from
// lease holds nothing and returns nothing; assigning over a lease returns
// the buffer it held first.
//
// Ownership: holds the loan, not the memory (the pool's). Thread-safety: one
// thread uses a lease at a time; it may be moved between threads.
class StagingLease {
 public:
  StagingLease() = default;  // holds no buffer
  StagingLease(StagingLease&& other) noexcept;
  StagingLease& operator=(StagingLease&& other) noexcept;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease() { Reset(); }

  // Whether the lease holds a buffer.
  explicit operator bool() const { return pool_ != nullptr; }
  char* data() const { return data_; }
  uint32_t size() const { return size_; }
  // Registered-buffer index (the same in every worker's ring), -1 if empty.
  int index() const { return index_; }

  // Returns the buffer to the pool now; the lease is then empty.
  void Reset();
  // Keeps the buffer out of the pool for the rest of the process: for a
  // buffer that a device may still write (a GPU copy or an I/O whose end can
  // no longer be observed), which must never be lent to another save. The
  // caller logs why. The lease is then empty.
  void Withhold();

 private:
  friend class StagingPool;
  StagingLease(StagingPool* pool, char* data, uint32_t size, int index)
      : pool_(pool), data_(data), size_(size), index_(index) {}

  StagingPool* pool_ = nullptr;  // null: holds nothing
  char* data_ = nullptr;
  uint32_t size_ = 0;
  int index_ = -1;
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
  StagingLease Acquire();
  // A free buffer, or an empty lease if none is free now.
  StagingLease TryAcquire();

  // One iovec per buffer, in index order, for io_uring registration.
  const std::vector<iovec>& iovecs() const { return iovecs_; }
  uint32_t buffer_bytes() const { return buffer_bytes_; }
  // The first buffer; every buffer lies in [base(), base() + pool_bytes()).
  char* base() const { return base_; }
  uint64_t pool_bytes() const { return uint64_t{buffer_bytes_} * iovecs_.size(); }
  uint64_t free_bytes() const;
  // Buffers kept out of the pool for good (StagingLease::Withhold).
  uint32_t withheld_buffers() const;
  // Whether mlock() pinned the pool at creation (false: RLIMIT_MEMLOCK or
  // CAP_IPC_LOCK refused it, and the pool is used unpinned; Create logged
  // why, once). Reported by DaemonStatus and ckptctl status.
  bool pinned() const { return pinned_; }

  // Test seam: `observer(index)` runs each time a buffer goes back, before
  // anyone can borrow it again, so a test (tests/support/
  // fault_injecting_queue.h) can check that no transfer on it is still
  // outstanding. It runs under the pool's lock and must not call the pool.
  // Null removes it.
  void SetReturnObserver(std::function<void(int index)> observer);

 private:
  friend class StagingLease;
  StagingPool(char* base, uint64_t mapped_bytes, uint32_t buffer_bytes, bool pinned);

  void Return(int index);
  void Withhold(int index);
  bool HasFreeBuffer() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !free_.empty();
  }
  StagingLease TakeFreeBuffer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  char* const base_;
  const uint64_t mapped_bytes_;
  const uint32_t buffer_bytes_;
  const bool pinned_;
  std::vector<iovec> iovecs_;

  mutable absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);  // indexes of free buffers
  uint32_t withheld_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(int)> return_observer_ ABSL_GUARDED_BY(mu_);

  // Read at each metrics render; last, so unbound before what they read goes.
  GaugeBinding used_gauge_ = DaemonMetrics::Get().staging_pool_used_bytes.Bind(
      [this] { return static_cast<double>(pool_bytes() - free_bytes()); });
  GaugeBinding size_gauge_ = DaemonMetrics::Get().staging_pool_size_bytes.Bind(
      [this] { return static_cast<double>(pool_bytes()); });
  GaugeBinding withheld_gauge_ = DaemonMetrics::Get().staging_pool_withheld_bytes.Bind(
      [this] { return static_cast<double>(uint64_t{buffer_bytes_} * withheld_buffers()); });
};

}  // namespace ckpt

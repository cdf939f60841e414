// IoWorkers: the daemon's I/O threads.
//
// Each worker owns one IoQueue (io_uring, or the pwrite fallback) with every
// staging buffer registered once at start-up, and runs tasks one at a time:
// a task is a whole data file to write or read. Tasks queue in FIFO order.
// The queues come from a factory, CreateBestIoQueue unless one is given: the
// seam through which tests run the workers on a fault-injecting queue.
//
// Ownership: owns the worker threads and their queues; borrows the pool only
// while constructing (for its iovecs). Thread-safety: Post may be called
// from any thread; tasks run on the workers.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"

namespace ckpt {

class IoWorkers {
 public:
  using Task = std::function<void(IoQueue& queue)>;
  // Makes one worker's queue of `depth` entries with `registered` (the
  // pool's buffers) registered; must not return null. Called once per
  // worker, on the constructing thread.
  using QueueFactory = std::function<std::unique_ptr<IoQueue>(
      uint32_t depth, absl::Span<const iovec> registered)>;

  IoWorkers(uint32_t workers, uint32_t queue_depth, const StagingPool& pool,
            QueueFactory make_queue = CreateBestIoQueue);
  // Finishes the queued tasks, then joins.
  ~IoWorkers();
  IoWorkers(const IoWorkers&) = delete;
  IoWorkers& operator=(const IoWorkers&) = delete;

  void Post(Task task);
  // How many tasks can run at once.
  size_t size() const { return threads_.size(); }
  // The workers' queue: "io_uring", "io_uring (unregistered buffers)" or
  // "pwrite" when every worker has the same; else each name with how many
  // workers have it, e.g. "io_uring on 1 of 4 workers, io_uring
  // (unregistered buffers) on 3" (RLIMIT_MEMLOCK let only the first ring
  // register the pool: each ring's registration counts against it).
  std::string backend() const { return backend_; }

 private:
  void Run(IoQueue* queue);
  bool HasTaskOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !tasks_.empty();
  }

  // Constant after construction.
  std::vector<std::unique_ptr<IoQueue>> queues_;
  std::vector<std::thread> threads_;
  std::string backend_;

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt

// IoWorkers: the daemon's I/O threads.
//
// Each worker owns one IoQueue (io_uring, or the pwrite fallback) with every
// staging buffer registered once at start-up, and runs tasks one at a time:
// a task is a whole data file to write or read. Tasks queue in FIFO order.
//
// Thread-safety: Post may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"

namespace ckpt {

class IoWorkers {
 public:
  using Task = std::function<void(IoQueue& queue)>;

  IoWorkers(uint32_t workers, uint32_t queue_depth, const StagingPool& pool);
  // Finishes the queued tasks, then joins.
  ~IoWorkers();

  void Post(Task task);
  // "io_uring" or "pwrite" (of the first worker).
  std::string backend() const { return backend_; }

 private:
  void Run(IoQueue* queue);

  std::vector<std::unique_ptr<IoQueue>> queues_;
  std::vector<std::thread> threads_;
  std::string backend_;

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt

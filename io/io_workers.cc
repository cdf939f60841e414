// IoWorkers: N threads, each with its own queue, taking whole-file tasks
// from one FIFO (the DeepSpeed aio design: a ring per worker, no sharing of
// queues between threads).
#include "io/io_workers.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace ckpt {
namespace {
constexpr int kWorkerNice = 5;
}  // namespace

IoWorkers::IoWorkers(uint32_t workers, uint32_t queue_depth,
                     const StagingPool& pool, QueueFactory make_queue) {
  for (uint32_t i = 0; i < workers; ++i) {
    std::unique_ptr<IoQueue> queue = make_queue(queue_depth, pool.iovecs());
    if (queue == nullptr) {
      // A broken factory is a bug of its caller; a worker without a queue
      // would crash on its first task, so it gets the queue that cannot
      // fail instead, and the log says so.
      LogError("I/O queue factory returned no queue for worker ", i,
               "; using the pwrite queue");
      queue = CreatePwriteQueue(queue_depth);
    }
    queues_.push_back(std::move(queue));
  }
  backend_ = queues_.empty() ? "none" : std::string(queues_.front()->name());
  for (auto& queue : queues_) {
    threads_.emplace_back([this, q = queue.get()] { Run(q); });
  }
}

IoWorkers::~IoWorkers() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void IoWorkers::Post(Task task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void IoWorkers::Run(IoQueue* queue) {
  // Staging is bulk work; the save call (a gRPC thread) is on the trainer's
  // critical path. Where cores are scarce, let the control plane win.
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kWorkerNice) != 0) {
    LogWarning("cannot lower I/O worker priority: ", std::strerror(errno));
  }
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &IoWorkers::HasTaskOrStopping));
      // Queued tasks are finished before stopping.
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task(*queue);
  }
}

}  // namespace ckpt

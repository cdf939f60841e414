#include "io/io_workers.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace ckpt {
namespace {
constexpr int kWorkerNice = 5;
}  // namespace

IoWorkers::IoWorkers(uint32_t workers, uint32_t queue_depth,
                     const StagingPool& pool) {
  for (uint32_t i = 0; i < workers; ++i) {
    queues_.push_back(CreateBestIoQueue(queue_depth, pool.iovecs()));
  }
  backend_ = std::string(queues_.front()->name());
  for (auto& queue : queues_) {
    threads_.emplace_back([this, q = queue.get()] { Run(q); });
  }
}

IoWorkers::~IoWorkers() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) t.join();
}

void IoWorkers::Post(Task task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
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
      std::unique_lock lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task(*queue);
  }
}

}  // namespace ckpt

// IoWorkers: N threads, each with its own queue, taking whole-file tasks
// from one FIFO (the DeepSpeed aio design: a ring per worker, no sharing of
// queues between threads).
#include "io/io_workers.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log.h"

namespace ckpt {
namespace {
constexpr int kWorkerNice = 5;

// IoWorkers::backend(): one name when every queue has it, else each name
// (in the order the workers have them first) with its count.
std::string DescribeBackends(const std::vector<std::unique_ptr<IoQueue>>& queues) {
  if (queues.empty()) return "none";
  std::vector<std::pair<std::string, size_t>> counts;
  for (const auto& queue : queues) {
    const absl::string_view name = queue->name();
    auto it = std::find_if(counts.begin(), counts.end(),
                           [&](const auto& c) { return c.first == name; });
    if (it == counts.end()) {
      counts.emplace_back(std::string(name), 1);
    } else {
      ++it->second;
    }
  }
  if (counts.size() == 1) return counts.front().first;
  std::string out = absl::StrCat(counts.front().first, " on ", counts.front().second,
                                 " of ", queues.size(), " workers");
  for (size_t i = 1; i < counts.size(); ++i) {
    absl::StrAppend(&out, ", ", counts[i].first, " on ", counts[i].second);
  }
  return out;
}

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
  backend_ = DescribeBackends(queues_);
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

#include "session/staged_completer.h"

#include <utility>

#include "common/log.h"

namespace ckpt {

StagedCompleter::~StagedCompleter() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
  absl::MutexLock lock(&mu_);
  if (!pending_.empty()) {
    LogWarning("the daemon stops with ", pending_.size(),
               " staged records of failed saves not reached (their trainers "
               "complete them when they see the daemon exit)");
  }
}

void StagedCompleter::Complete(std::shared_ptr<GpuEvent> event, uint64_t record) {
  Add({std::move(event), record, /*enqueued=*/false});
}

void StagedCompleter::CompleteIfDeviceFails(std::shared_ptr<GpuEvent> event,
                                            uint64_t record) {
  Add({std::move(event), record, /*enqueued=*/true});
}

void StagedCompleter::Add(Pending pending) {
  if (pending.Done()) return;
  absl::MutexLock lock(&mu_);
  pending_.push_back(std::move(pending));
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Run(); });
}

size_t StagedCompleter::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

void StagedCompleter::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Records of one event complete in order: one pass may complete
    // several, each once its predecessor (maybe completed just before in
    // the same pass) was reached.
    bool progress = true;
    while (progress) {
      progress = false;
      for (size_t i = 0; i < pending_.size();) {
        if (pending_[i].Done()) {
          pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
          progress = true;
        } else {
          ++i;
        }
      }
    }
    auto stop_or_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !pending_.empty();
    };
    if (pending_.empty()) {
      mu_.Await(absl::Condition(&stop_or_work));
    } else {
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), kPoll);
    }
  }
}

}  // namespace ckpt

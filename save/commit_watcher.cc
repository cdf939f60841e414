#include "save/commit_watcher.h"

#include <iterator>
#include <utility>

namespace ckpt {

CommitWatcher::CommitWatcher(absl::Duration interval) : interval_(interval) {
  absl::MutexLock lock(&join_mu_);
  thread_ = std::thread([this] { Run(); });
}

CommitWatcher::~CommitWatcher() { Stop(); }

void CommitWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

void CommitWatcher::Watch(Attempt attempt) {
  absl::MutexLock lock(&mu_);
  attempts_.push_back(std::move(attempt));
}

void CommitWatcher::Run() {
  while (true) {
    std::vector<Attempt> due;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &CommitWatcher::HasWorkOrStopping));
      if (stopping_) return;
      due = std::exchange(attempts_, {});
    }
    // An attempt lists the directory and may read every node manifest:
    // storage work, done without the lock so Watch never waits for it.
    std::vector<Attempt> again;
    for (Attempt& attempt : due) {
      if (!attempt()) again.push_back(std::move(attempt));
    }
    absl::MutexLock lock(&mu_);
    attempts_.insert(attempts_.begin(), std::make_move_iterator(again.begin()),
                     std::make_move_iterator(again.end()));
    // The other nodes finish in their own time: poll, but wake at once to
    // stop.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_);
  }
}

}  // namespace ckpt

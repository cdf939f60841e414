// CommitWatcher: the thread that retries commits of checkpoints waiting for
// other nodes.
//
// On several nodes, the node that finishes last writes COMMIT; the others,
// once their node manifest is durable, must notice that (or give up after
// the commit timeout). Their first attempt runs on the I/O worker that
// wrote the manifest; if the checkpoint is not committed yet, the attempt
// is handed here and retried every `interval` until it reports that no
// further attempt is needed (committed, failed or timed out). Attempts run
// one at a time on this thread, never under this class's lock.
//
// Ownership: owns the thread and the pending attempts; the destructor stops
// the thread and drops attempts still pending (their checkpoints then stay
// uncommitted on this node, as after a daemon stop). An attempt must stay
// callable until the watcher is destroyed.
// Thread-safety: Watch may be called from any thread. `mu_` is a leaf.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt {

class CommitWatcher {
 public:
  // One commit attempt; true once the checkpoint needs no further attempt.
  using Attempt = std::function<bool()>;

  explicit CommitWatcher(absl::Duration interval);
  ~CommitWatcher();
  CommitWatcher(const CommitWatcher&) = delete;
  CommitWatcher& operator=(const CommitWatcher&) = delete;

  // Retries `attempt` every interval until it returns true.
  void Watch(Attempt attempt);

 private:
  void Run();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !attempts_.empty();
  }

  const absl::Duration interval_;
  absl::Mutex mu_;
  std::vector<Attempt> attempts_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the fields above exist
};

}  // namespace ckpt

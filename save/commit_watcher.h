// CommitWatcher: the save side's timer thread: it retries commits of
// checkpoints waiting for other nodes, checks the deadline of attempts
// waiting for their local ranks, and follows committed checkpoints'
// uploads to the remote tier to end their saves' remote phase.
//
// On several nodes, the node that finishes last writes COMMIT; the others,
// once their node manifest is durable, must notice that (or give up after
// the commit timeout). Their first attempt runs on the I/O worker that
// wrote the manifest; if the checkpoint is not committed yet, the attempt
// is handed here and retried every `interval` until it reports that no
// further attempt is needed (committed, failed or timed out). An attempt
// at a checkpoint that waits for this node's other ranks is handed here at
// its first part in the same way, and reports done once they are all in,
// or once it failed them after the local-ranks timeout. Attempts run one
// at a time on this thread, never under this class's lock.
//
// Ownership: owns the thread and the pending attempts; Stop (or the
// destructor) stops the thread and drops attempts still pending (their
// checkpoints then stay uncommitted on this node, as after a daemon stop).
// An attempt must stay callable until the thread is stopped.
// Thread-safety: Watch and Stop may be called from any thread. `mu_` is a
// leaf.
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

  // Retries `attempt` every interval until it returns true. After Stop,
  // the attempt is kept and never run.
  void Watch(Attempt attempt);

  // Stops the thread, after the attempt running now (if any) returns. Once
  // it returns, no attempt runs again. Idempotent.
  void Stop();

 private:
  void Run();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !attempts_.empty();
  }

  const absl::Duration interval_;
  absl::Mutex mu_;
  std::vector<Attempt> attempts_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex join_mu_;  // serializes Stop's join
  // Started in the constructor's body, once every field above exists.
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace ckpt

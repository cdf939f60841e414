// CheckpointLeases: which committed checkpoints this daemon is reading, so
// retention never deletes one under a load (invariant 8).
//
// A load holds a lease on the checkpoint it resolved for as long as it
// reads; retention claims a checkpoint for deletion only if it has no lease,
// and once claimed no new lease is granted (the load fails NotFound, as it
// would a moment later). So a checkpoint is never deleted while a load of
// this daemon reads it. Loads on other nodes are not seen here: retention
// keeps the newest checkpoints, which is what restarting jobs load.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <map>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ckpt {

class CheckpointLeases {
 public:
  // Takes a lease; NotFound if the checkpoint is being deleted.
  absl::Status Acquire(const std::string& job, const std::string& checkpoint);
  void Release(const std::string& job, const std::string& checkpoint);
  // Claims an unleased checkpoint for deletion; false if it is being read.
  bool ClaimForDeletion(const std::string& job, const std::string& checkpoint);
  void Deleted(const std::string& job, const std::string& checkpoint);

 private:
  static std::string Key(const std::string& job, const std::string& checkpoint) {
    return job + "/" + checkpoint;
  }
  absl::Mutex mu_;
  std::map<std::string, int> readers_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> deleting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

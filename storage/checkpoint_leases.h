// CheckpointLeases: which committed checkpoints this daemon is reading, so
// retention never deletes one under a load (invariant 8).
//
// A load, and a verify (`ckptctl verify`, which would otherwise report a
// checkpoint deleted under it as damaged), holds a lease on the checkpoint
// it resolved for as long as it reads; retention claims a checkpoint for
// deletion only if it has no lease, and once claimed no new lease is
// granted (the load fails NotFound, as it would a moment later). So a
// checkpoint is never deleted while a load or verify of this daemon reads
// it. Loads on other nodes are not seen here: retention
// keeps the newest checkpoints, which is what restarting jobs load.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ckpt {

class CheckpointLeases;

// One lease, released when dropped (move-only), so that no early return
// keeps a checkpoint from retention for good.
class CheckpointLease {
 public:
  CheckpointLease(CheckpointLease&& other) noexcept
      : leases_(std::exchange(other.leases_, nullptr)),
        job_(std::move(other.job_)),
        checkpoint_(std::move(other.checkpoint_)) {}
  CheckpointLease& operator=(CheckpointLease&&) = delete;
  CheckpointLease(const CheckpointLease&) = delete;
  CheckpointLease& operator=(const CheckpointLease&) = delete;
  ~CheckpointLease();

 private:
  friend class CheckpointLeases;
  CheckpointLease(CheckpointLeases* leases, std::string job,
                  std::string checkpoint)
      : leases_(leases), job_(std::move(job)), checkpoint_(std::move(checkpoint)) {}

  CheckpointLeases* leases_;  // null once moved from
  std::string job_, checkpoint_;
};

class CheckpointLeases {
 public:
  // Takes a lease; NotFound if the checkpoint is being deleted.
  absl::Status Acquire(const std::string& job, const std::string& checkpoint);
  void Release(const std::string& job, const std::string& checkpoint);
  // Acquire, as a handle that releases the lease when dropped. The leases
  // must outlive it.
  absl::StatusOr<CheckpointLease> Hold(const std::string& job,
                                       const std::string& checkpoint);
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

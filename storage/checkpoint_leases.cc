#include "storage/checkpoint_leases.h"

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status CheckpointLeases::Acquire(const std::string& job,
                                       const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  const std::string key = Key(job, checkpoint);
  if (deleting_.contains(key)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", key, " is being deleted by retention"));
  }
  ++readers_[key];
  return absl::OkStatus();
}

absl::StatusOr<CheckpointLease> CheckpointLeases::Hold(
    const std::string& job, const std::string& checkpoint) {
  if (absl::Status s = Acquire(job, checkpoint); !s.ok()) return s;
  return CheckpointLease(this, job, checkpoint);
}

CheckpointLease::~CheckpointLease() {
  if (leases_ != nullptr) leases_->Release(job_, checkpoint_);
}

void CheckpointLeases::Release(const std::string& job, const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  auto it = readers_.find(Key(job, checkpoint));
  if (it != readers_.end() && --it->second == 0) readers_.erase(it);
}

bool CheckpointLeases::ClaimForDeletion(const std::string& job,
                                        const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  const std::string key = Key(job, checkpoint);
  if (readers_.contains(key)) return false;
  deleting_.insert(key);
  return true;
}

void CheckpointLeases::Deleted(const std::string& job, const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  deleting_.erase(Key(job, checkpoint));
}

}  // namespace ckpt

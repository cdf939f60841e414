#include "client/staged_relay.h"

#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ckpt_client.h"
#include "common/status.h"

namespace ckpt {

StagedRelay::~StagedRelay() {
  if (passed_on_.load()) return;
  absl::Status s = PassOn(nullptr);
  if (!s.ok()) {
    std::fprintf(stderr, "libckpt: a relay never passed on: %s\n", s.ToString().c_str());
  }
}

absl::Status StagedRelay::WaitOnStream(GpuStreamHandle stream) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    RETURN_IF_ERROR(gpu_->WaitRelay(devices_[i], stream, records_[i]));
  }
  return absl::OkStatus();
}

absl::Status StagedRelay::PassOn(SaveHandle* save) {
  if (passed_on_.exchange(true)) {
    return absl::FailedPreconditionError("this relay was passed on already");
  }
  absl::Status result = absl::OkStatus();
  for (size_t i = 0; i < devices_.size(); ++i) {
    // No save: the daemon's records so far, those of earlier saves.
    TrainerGpu::StagedWait after{TrainerGpu::StagedWait::Kind::kLatest, 0};
    if (save != nullptr) after = save->RelayAfter(devices_[i]);
    absl::Status relayed = gpu_->Relay(devices_[i], records_[i], after);
    if (relayed.ok()) continue;
    result.Update(relayed);
    result.Update(CompleteFromCpu(i, save));
  }
  return result;
}

absl::Status StagedRelay::CompleteFromCpu(size_t i, SaveHandle* save) {
  // Once the save is STAGED (or failed: the daemon's progress stream also
  // ends when it exits), nothing of it reads the trainer's memory. Its
  // outcome shows in WaitCommitted.
  if (save != nullptr) (void)save->WaitStaged();
  // The previous relay record was enqueued behind a save that is STAGED
  // too (a save call waits for the previous save's STAGED): it comes soon.
  const absl::Time deadline = absl::Now() + kCpuCompleteTimeout;
  while (!gpu_->CompleteRelay(devices_[i], records_[i])) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "relay record ", records_[i], " on device ", absl::BytesToHexString(devices_[i]),
          " cannot be completed: the one before it was not reached in ",
          absl::FormatDuration(kCpuCompleteTimeout),
          "; a stream waiting for it waits for good"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

}  // namespace ckpt

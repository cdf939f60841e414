// SaveHandle (client/ckpt_client.h): one save as its trainer follows it,
// from the progress stream the daemon sends (WatchSave), and the waits on
// its phases, on the CPU or on a GPU stream.
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ckpt_client.h"
#include "client/unary_call.h"
#include "common/save_phase.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"

namespace ckpt {

SaveHandle::SaveHandle(v1::Ckptd::Stub* stub, std::string token, uint64_t id,
                       TrainerGpu* gpu, std::vector<std::string> gpu_devices,
                       std::vector<uint64_t> stream_wait_records)
    : stub_(stub),
      token_(std::move(token)),
      id_(id),
      gpu_(gpu),
      gpu_devices_(std::move(gpu_devices)),
      stream_wait_records_(std::move(stream_wait_records)) {
  progress_.set_save_id(id);
  progress_.set_phase(v1::PHASE_ACCEPTED);
}

SaveHandle::~SaveHandle() {
  context_.TryCancel();
  if (follower_.joinable()) follower_.join();
}

void SaveHandle::StartFollowing() {
  absl::call_once(follow_once_, [this] { follower_ = std::thread([this] { Follow(); }); });
}

void SaveHandle::Follow() {
  v1::WatchSaveRequest request;
  request.set_session_token(token_);
  request.set_save_id(id_);
  request.set_follow_remote(true);  // an older daemon ignores it
  auto reader = stub_->WatchSave(&context_, request);
  v1::SaveProgress progress;
  // Waiters Await conditions on these fields: absl::Mutex re-evaluates them
  // when the lock is released, so no explicit signal is needed.
  while (reader->Read(&progress)) {
    absl::MutexLock lock(&mu_);
    progress_ = progress;
  }
  grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  ended_ = true;
  if (!IsFinalPhase(progress_.phase())) {
    stream_error_ = status.ok()
                        ? absl::UnavailableError("progress stream ended early")
                        : FromGrpc(status, "WatchSave");
  } else if (RemotePhasePending(progress_)) {
    remote_stream_error_ =
        status.ok() ? absl::UnavailableError(
                          "progress stream ended before the remote phase did")
                    : FromGrpc(status, "WatchSave");
  }
}

bool SaveHandle::Reached(v1::Phase phase, bool enqueued) const {
  return progress_.phase() >= phase || (enqueued && progress_.copies_enqueued());
}

absl::Status SaveHandle::WaitFor(v1::Phase phase, bool enqueued,
                                 absl::Duration timeout) {
  StartFollowing();
  const auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ended_ || IsFinalPhase(progress_.phase()) || Reached(phase, enqueued);
  };
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "save ", id_, " has not reached ", v1::Phase_Name(phase), " yet"));
  }
  if (progress_.phase() == v1::PHASE_FAILED ||
      progress_.phase() == v1::PHASE_CANCELLED) {
    const auto code = progress_.phase() == v1::PHASE_CANCELLED
                          ? absl::StatusCode::kCancelled
                          : absl::StatusCode::kAborted;
    return absl::Status(code, absl::StrCat("save ", id_, " of ",
                                           progress_.checkpoint(), " ",
                                           v1::Phase_Name(progress_.phase()),
                                           ": ", progress_.reason()));
  }
  if (Reached(phase, enqueued)) return absl::OkStatus();
  return stream_error_;
}

absl::Status SaveHandle::WaitStaged() { return WaitFor(v1::PHASE_STAGED); }
absl::Status SaveHandle::WaitStaged(absl::Duration timeout) {
  return WaitFor(v1::PHASE_STAGED, /*enqueued=*/false, timeout);
}
absl::Status SaveHandle::WaitCommitted(absl::Duration timeout) {
  return WaitFor(v1::PHASE_COMMITTED, /*enqueued=*/false, timeout);
}

absl::Status SaveHandle::WaitStagedOnStream(GpuStreamHandle stream) {
  if (!stream_wait_records_.empty()) {
    // Reserved when the save was accepted: no CPU wait for the daemon.
    for (size_t i = 0; i < gpu_devices_.size(); ++i) {
      RETURN_IF_ERROR(gpu_->WaitStagedRecord(gpu_devices_[i], stream, stream_wait_records_[i]));
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(WaitFor(v1::PHASE_STAGED, /*enqueued=*/true));
  // Recorded after the last copy: the stream's later work waits for them.
  for (const std::string& uuid : gpu_devices_) {
    RETURN_IF_ERROR(gpu_->WaitStaged(uuid, stream));
  }
  return absl::OkStatus();
}
absl::Status SaveHandle::WaitCommitted() { return WaitFor(v1::PHASE_COMMITTED); }

absl::StatusOr<v1::RemoteUpload> SaveHandle::WaitRemoteCommitted(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(WaitFor(v1::PHASE_COMMITTED, /*enqueued=*/false, timeout));
  // COMMITTED came with its remote phase, if it has one.
  const auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ended_ || !RemotePhasePending(progress_);
  };
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("save ", id_, " of ", progress_.checkpoint(),
                     " is not committed in the remote tier yet"));
  }
  switch (progress_.remote_phase()) {
    case v1::PHASE_REMOTE_COMMITTED:
      return progress_.remote_upload();
    case v1::PHASE_REMOTE_FAILED:
      return absl::AbortedError(absl::StrCat("the upload of ", progress_.job(), "/",
                                             progress_.checkpoint(),
                                             " to the remote tier failed: ",
                                             progress_.remote_reason()));
    case v1::PHASE_REMOTE_UPLOADING:
      return remote_stream_error_;
    default:
      return absl::NotFoundError(absl::StrCat("save ", id_, " of ", progress_.checkpoint(),
                                              " committed with no remote phase"));
  }
}

TrainerGpu::StagedWait SaveHandle::RelayAfter(const std::string& uuid) {
  using Kind = TrainerGpu::StagedWait::Kind;
  for (size_t i = 0; i < gpu_devices_.size(); ++i) {
    if (gpu_devices_[i] != uuid) continue;
    if (!stream_wait_records_.empty()) return {Kind::kRecord, stream_wait_records_[i]};
    // Either way the most recent record then covers this save's copies
    // (a failed save's are over). Its error shows in WaitCommitted.
    (void)WaitFor(v1::PHASE_STAGED, /*enqueued=*/true);
    return {Kind::kLatest, 0};
  }
  return {Kind::kNone, 0};
}

v1::SaveProgress SaveHandle::progress() {
  StartFollowing();
  absl::MutexLock lock(&mu_);
  return progress_;
}

absl::Status SaveHandle::Cancel(CallCanceller* canceller) {
  v1::CancelRequest request;
  request.set_session_token(token_);
  request.set_save_id(id_);
  v1::CancelResponse response;
  return Unary(stub_, canceller, "Cancel", &v1::Ckptd::StubInterface::Cancel,
               &v1::Ckptd::StubInterface::async_interface::Cancel, request, &response);
}

}  // namespace ckpt

#include "client/call_canceller.h"

namespace ckpt {

void CallCanceller::Cancel() {
  // Only marks it: the calling thread, which Run wakes through mu_, cancels
  // its own call, so no context is touched from here while it may end.
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool CallCanceller::cancelled() {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool CallCanceller::Poll() {
  if (cancelled()) return true;
  if (!interrupted_ || !interrupted_()) return false;
  Cancel();
  return true;
}

grpc::Status CallCanceller::Run(
    grpc::ClientContext* context, const std::function<void(Completion)>& start,
    const std::function<void(const std::function<bool()>&)>& before_cancel) {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before it started");
    call_done_ = false;
  }
  // The completion runs on a gRPC thread, before Run returns (Run waits
  // for it on every path), so capturing `this` is safe.
  start([this](grpc::Status status) {
    absl::MutexLock lock(&mu_);
    call_status_ = std::move(status);
    call_done_ = true;
  });
  const auto ended_or_cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return call_done_ || cancelled_;
  };
  bool done = false;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (interrupted_) {
        mu_.AwaitWithTimeout(absl::Condition(&ended_or_cancelled), poll_every_);
      } else {
        mu_.Await(absl::Condition(&ended_or_cancelled));
      }
      done = call_done_;
      if (done || cancelled_) break;
    }
    // Outside mu_: `interrupted` may take its time (Python takes the GIL).
    if (interrupted_()) Cancel();
  }
  if (!done) {
    if (before_cancel) {
      before_cancel([this] {
        absl::MutexLock lock(&mu_);
        return call_done_;
      });
    }
    context->TryCancel();  // thread-safe; the completion follows promptly
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&call_done_));
  return call_status_;
}

}  // namespace ckpt

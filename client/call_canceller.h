// CallCanceller: ends a blocking libckpt call (client/ckpt_client.h) early.
//
// Why: every Client call may block on a daemon that is slow, stopped or
// gone, and the caller must be able to get its thread back: another thread
// fires Cancel, or the calling thread polls `interrupted` while it waits
// (the Python binding runs its signal handlers there, so Ctrl-C ends the
// call). A cancelled call's gRPC context is cancelled only by the thread
// that made the call, never from the cancelling thread, so no context is
// touched while it may be ending.
//
// Ownership: the application owns the canceller and passes it by pointer;
// it must outlive the call it is given to.
//
// Thread-safety: Cancel and cancelled may be called from any thread; one
// call at a time may use a canceller, on the thread that made the call.
#pragma once

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace ckpt {

// Cancels a blocking Client call: from another thread (Cancel), or from the
// calling thread itself, which asks `interrupted` every `poll_every` while
// the call waits and cancels it when that returns true (the Python binding
// runs its signal handlers there, holding the GIL; nothing else of the
// client's runs during `interrupted`).
//
// Once cancelled it stays so: the call in progress ends as soon as it can
// (CANCELLED, or whatever it returned if it finished first) and later calls
// given this canceller fail CANCELLED before they send anything.
class CallCanceller {
 public:
  CallCanceller() = default;
  CallCanceller(std::function<bool()> interrupted, absl::Duration poll_every)
      : interrupted_(std::move(interrupted)), poll_every_(poll_every) {}
  CallCanceller(const CallCanceller&) = delete;
  CallCanceller& operator=(const CallCanceller&) = delete;

  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() ABSL_LOCKS_EXCLUDED(mu_);

  // Run and Poll are how libckpt's calls use a canceller; applications
  // only construct it and Cancel.
  //
  // How a call that can be cancelled is made: `start` issues it through the
  // stub's callback API, passing it the completion function it is given;
  // Run waits for that, polling `interrupted` (if any) every poll_every.
  // On a cancel, it first runs `before_cancel` (if any; given a function
  // that says whether the call has ended), then cancels the call's
  // `context` and waits for its end, which gRPC makes prompt. Returns the
  // call's status.
  using Completion = std::function<void(grpc::Status)>;
  grpc::Status Run(grpc::ClientContext* context,
                   const std::function<void(Completion)>& start,
                   const std::function<void(const std::function<bool()>&)>&
                       before_cancel = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // For a call that is not an RPC (the handshake): polls `interrupted`
  // once; true if the canceller is (now) cancelled.
  bool Poll() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration poll_every() const { return poll_every_; }

 private:
  // Constant after construction.
  const std::function<bool()> interrupted_;
  const absl::Duration poll_every_ = absl::InfiniteDuration();

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // The call in progress under Run.
  bool call_done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status call_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

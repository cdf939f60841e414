// LoadGate: lets a load be cancelled with a guarantee the trainer can rely
// on: once Close() returns, no byte of that load is being written into the
// trainer's memory and none will be.
//
// Why it matters: a trainer that interrupts a load (Ctrl-C in Python) may
// free or reuse the destination tensors as soon as its call returns. A
// cancelled gRPC call gives it no such promise (the client's call ends at
// once, the daemon's workers go on), so the client asks with a Cancel RPC
// naming the load, and the daemon answers only after Close() here.
//
// Every delivery of a load goes through GatedMemory, which writes under the
// gate's reader lock after checking it is open; Close() takes the writer
// lock, so it waits for a write in progress (one slice of a window: at most
// a few MiB) and every later write sees the gate closed. A write to a closed
// gate is skipped, not failed: the same file read serves the other ranks of
// the round (restore/loader.h), which must not fail with it. The gRPC call
// being cancelled (client gone, deadline) closes the gate too, checked
// before each write.
//
// Thread-safety: all methods are safe from any thread.
#pragma once

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "session/memory_source.h"

namespace ckpt {

class LoadGate {
 public:
  // `call_cancelled` (may be empty) says whether the load's call was
  // cancelled; it must stay callable until the load's `done` has run.
  explicit LoadGate(std::function<bool()> call_cancelled = {})
      : call_cancelled_(std::move(call_cancelled)) {}

  // Returns once no write is in progress; none starts afterwards.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::WriterMutexLock lock(&mu_);
    closed_ = true;
  }
  bool closed() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::ReaderMutexLock lock(&mu_);
    return !OpenLocked();
  }

  // Writes through `memory` if the gate is open; OK without writing if not.
  absl::Status Write(MemorySource& memory, absl::Span<const CopySpan> spans)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::ReaderMutexLock lock(&mu_);
    if (!OpenLocked()) return absl::OkStatus();
    return memory.Write(spans);
  }

 private:
  bool OpenLocked() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !closed_ && !(call_cancelled_ && call_cancelled_());
  }

  const std::function<bool()> call_cancelled_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// A load's view of one destination: every write passes its gate. Owned by
// the load's round, beside the deliveries that point to it.
class GatedMemory final : public MemorySource {
 public:
  GatedMemory(MemorySource* inner, LoadGate* gate) : inner_(inner), gate_(gate) {}
  absl::Status Read(absl::Span<const CopySpan> spans) override {
    return inner_->Read(spans);
  }
  absl::Status Write(absl::Span<const CopySpan> spans) override {
    return gate_->Write(*inner_, spans);
  }
  bool PrefersLargeWrites() const override { return inner_->PrefersLargeWrites(); }

 private:
  MemorySource* const inner_;  // the session's; outlives the round
  LoadGate* const gate_;       // the load's; outlives the round
};

}  // namespace ckpt

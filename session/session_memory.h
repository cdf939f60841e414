// SessionMemory: everything a session's trainer registered, as one
// MemorySource: host regions through the trainer's bound /proc/<pid>/mem
// (HostProcessMemory), CUDA regions through the session's GpuRegions. A
// span is GPU memory when it lies in a GPU region of the session and host
// memory otherwise (every span was checked against the session's
// registrations before it got here).
//
// Every batch of accesses starts with PeerProcess::CheckAccess: a trainer
// that failed admission, changed credentials, exec'd or exited since the
// handshake gets no byte read or written (PermissionDenied naming its pid,
// or Unavailable once it exited). A read or write call is one batch; so is
// each Enqueue of a save's copy batch, which is also checked when it begins.
//
// Thread-safety: safe for concurrent use (each batch by one thread).
#pragma once

#include <memory>

#include "session/gpu_regions.h"
#include "session/memory_source.h"
#include "session/peer_process.h"

namespace ckpt {

class SessionMemory final : public MemorySource {
 public:
  // Borrows `peer` and `gpu`; both outlive this object.
  SessionMemory(const PeerProcess* peer, GpuRegions* gpu)
      : peer_(peer), checked_host_(peer), gpu_(gpu) {}

  absl::Status Read(absl::Span<const CopySpan> spans) override;
  absl::Status Write(absl::Span<const CopySpan> spans) override;
  std::unique_ptr<CopiesInFlight> StartWrite(absl::Span<const CopySpan> spans) override;
  absl::StatusOr<std::unique_ptr<CopyOutBatch>> BeginCopyOut(StagedRecords* staged) override;
  bool PrefersLargeWrites() const override { return gpu_->live_regions() > 0; }

 private:
  // Host memory, each call checked first (a save batch's host reads).
  class CheckedHost final : public MemorySource {
   public:
    explicit CheckedHost(const PeerProcess* peer) : peer_(peer) {}
    absl::Status Read(absl::Span<const CopySpan> spans) override;
    absl::Status Write(absl::Span<const CopySpan> spans) override;

   private:
    const PeerProcess* const peer_;
  };

  // Checks the peer, starts the GPU spans' copies and copies the host
  // spans; the GPU's may still run when this returns.
  std::unique_ptr<CopiesInFlight> StartTransfer(absl::Span<const CopySpan> spans, bool read);
  // Host spans through the peer's bound /proc/<pid>/mem; call only after
  // its CheckAccess succeeded (the file exists from then on).
  static absl::Status HostTransfer(const PeerProcess& peer,
                                   absl::Span<const CopySpan> spans, bool read);

  const PeerProcess* const peer_;
  CheckedHost checked_host_;
  GpuRegions* const gpu_;
};

}  // namespace ckpt

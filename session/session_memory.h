// SessionMemory: everything a session's trainer registered, as one
// MemorySource: host regions through process_vm_readv/writev, CUDA regions
// through the session's GpuRegions. A span is GPU memory when it lies in a
// GPU region of the session and host memory otherwise (every span was
// checked against the session's registrations before it got here).
//
// Host accesses are guarded against pid reuse with the session's pidfd: a
// read is only trusted if the process is still alive afterwards, and a
// write only starts if it is alive.
//
// Thread-safety: safe for concurrent use (each batch by one thread).
#pragma once

#include <sys/types.h>

#include <memory>

#include "session/gpu_regions.h"
#include "session/memory_source.h"

namespace ckpt {

class SessionMemory final : public MemorySource {
 public:
  // Borrows `pidfd` and `gpu`; both outlive this object.
  SessionMemory(pid_t pid, int pidfd, GpuRegions* gpu)
      : host_(pid), guarded_host_(&host_, pidfd), gpu_(gpu) {}

  absl::Status Read(absl::Span<const CopySpan> spans) override;
  absl::Status Write(absl::Span<const CopySpan> spans) override;
  absl::StatusOr<std::unique_ptr<CopyOutBatch>> BeginCopyOut() override;
  bool PrefersLargeWrites() const override { return gpu_->live_regions() > 0; }

 private:
  class PidfdGuarded final : public MemorySource {
   public:
    PidfdGuarded(MemorySource* host, int pidfd) : host_(host), pidfd_(pidfd) {}
    absl::Status Read(absl::Span<const CopySpan> spans) override;
    absl::Status Write(absl::Span<const CopySpan> spans) override;
    // Unavailable once the process exited.
    absl::Status CheckAlive() const;

   private:
    MemorySource* const host_;
    const int pidfd_;
  };

  absl::Status Transfer(absl::Span<const CopySpan> spans, bool read);

  HostProcessMemory host_;
  PidfdGuarded guarded_host_;
  GpuRegions* const gpu_;
};

}  // namespace ckpt

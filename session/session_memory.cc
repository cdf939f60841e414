#include "session/session_memory.h"

#include <poll.h>

#include <cerrno>
#include <vector>

#include "common/status.h"
#include "session/peer_copy_out.h"

namespace ckpt {

absl::Status SessionMemory::PidfdGuarded::CheckAlive() const {
  pollfd p{pidfd_, POLLIN, 0};
  const int n = ::poll(&p, 1, 0);
  if (n < 0) return ErrnoToStatus(errno, "poll pidfd");
  if (n > 0) {
    return absl::UnavailableError("the trainer process has exited");
  }
  return absl::OkStatus();
}

absl::Status SessionMemory::PidfdGuarded::Read(absl::Span<const CopySpan> spans) {
  RETURN_IF_ERROR(host_->Read(spans));
  // Alive after the read means the pid was not recycled during it.
  return CheckAlive();
}

absl::Status SessionMemory::PidfdGuarded::Write(absl::Span<const CopySpan> spans) {
  RETURN_IF_ERROR(CheckAlive());
  return host_->Write(spans);
}

absl::Status SessionMemory::Transfer(absl::Span<const CopySpan> spans, bool read) {
  std::vector<CopySpan> host, gpu;
  for (const CopySpan& s : spans) {
    ASSIGN_OR_RETURN(std::shared_ptr<const GpuRegion> region,
                     gpu_->Find(s.remote, s.length));
    (region == nullptr ? host : gpu).push_back(s);
  }
  if (!gpu.empty()) RETURN_IF_ERROR(gpu_->Copy(gpu, /*to_host=*/read));
  if (host.empty()) return absl::OkStatus();
  return read ? guarded_host_.Read(host) : guarded_host_.Write(host);
}

absl::Status SessionMemory::Read(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/true);
}

absl::Status SessionMemory::Write(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/false);
}

absl::StatusOr<std::unique_ptr<CopyOutBatch>> SessionMemory::BeginCopyOut() {
  return std::make_unique<PeerCopyOut>(
      &guarded_host_, gpu_, [this] { return guarded_host_.CheckAlive(); });
}

}  // namespace ckpt

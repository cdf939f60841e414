#include "session/session_memory.h"

#include <vector>

#include "common/status.h"
#include "session/peer_copy_out.h"

namespace ckpt {

absl::Status SessionMemory::HostTransfer(const PeerProcess& peer,
                                         absl::Span<const CopySpan> spans,
                                         bool read) {
  HostProcessMemory host(peer.memory_fd(), peer.pid());
  return read ? host.Read(spans) : host.Write(spans);
}

absl::Status SessionMemory::CheckedHost::Read(
    absl::Span<const CopySpan> spans) {
  RETURN_IF_ERROR(peer_->CheckAccess());
  return HostTransfer(*peer_, spans, /*read=*/true);
}

absl::Status SessionMemory::CheckedHost::Write(
    absl::Span<const CopySpan> spans) {
  RETURN_IF_ERROR(peer_->CheckAccess());
  return HostTransfer(*peer_, spans, /*read=*/false);
}

absl::Status SessionMemory::Transfer(absl::Span<const CopySpan> spans,
                                     bool read) {
  std::vector<CopySpan> host, gpu;
  for (const CopySpan& s : spans) {
    ASSIGN_OR_RETURN(std::shared_ptr<const GpuRegion> region,
                     gpu_->Find(s.remote, s.length));
    (region == nullptr ? host : gpu).push_back(s);
  }
  if (host.empty() && gpu.empty()) return absl::OkStatus();
  // One check for the whole call, host and GPU spans alike.
  RETURN_IF_ERROR(peer_->CheckAccess());
  if (!gpu.empty()) RETURN_IF_ERROR(gpu_->Copy(gpu, /*to_host=*/read));
  if (host.empty()) return absl::OkStatus();
  return HostTransfer(*peer_, host, read);
}

absl::Status SessionMemory::Read(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/true);
}

absl::Status SessionMemory::Write(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/false);
}

absl::StatusOr<std::unique_ptr<CopyOutBatch>> SessionMemory::BeginCopyOut() {
  // A save's GPU copies are checked here, once; its host reads at each
  // Enqueue (CheckedHost).
  RETURN_IF_ERROR(peer_->CheckAccess());
  return std::make_unique<PeerCopyOut>(&checked_host_, gpu_, peer_->pidfd(),
                                       peer_->pid());
}

}  // namespace ckpt

#include "session/session_memory.h"

#include <memory>
#include <utility>
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

std::unique_ptr<CopiesInFlight> SessionMemory::StartTransfer(
    absl::Span<const CopySpan> spans, bool read) {
  std::vector<CopySpan> host, gpu;
  for (const CopySpan& s : spans) {
    absl::StatusOr<std::shared_ptr<const GpuRegion>> region = gpu_->Find(s.remote, s.length);
    if (!region.ok()) return std::make_unique<EndedCopies>(region.status());
    (*region == nullptr ? host : gpu).push_back(s);
  }
  if (host.empty() && gpu.empty()) return std::make_unique<EndedCopies>(absl::OkStatus());
  // One check for the whole call, host and GPU spans alike.
  if (absl::Status access = peer_->CheckAccess(); !access.ok()) {
    return std::make_unique<EndedCopies>(std::move(access));
  }
  // The GPU's copies run while the host spans are copied here.
  std::unique_ptr<CopiesInFlight> copies;
  if (!gpu.empty()) copies = gpu_->StartCopy(gpu, /*to_host=*/read);
  if (host.empty()) return copies;
  absl::Status status = HostTransfer(*peer_, host, read);
  if (copies == nullptr) return std::make_unique<EndedCopies>(std::move(status));
  if (status.ok()) return copies;
  // The host copy failed: the GPU's end now, and the call reports both.
  absl::Status gpu_status = copies->Wait();
  UpdateKeepingHostMemoryInUse(&gpu_status, status);
  return std::make_unique<EndedCopies>(std::move(gpu_status));
}

absl::Status SessionMemory::Read(absl::Span<const CopySpan> spans) {
  return StartTransfer(spans, /*read=*/true)->Wait();
}

absl::Status SessionMemory::Write(absl::Span<const CopySpan> spans) {
  return StartTransfer(spans, /*read=*/false)->Wait();
}

std::unique_ptr<CopiesInFlight> SessionMemory::StartWrite(absl::Span<const CopySpan> spans) {
  return StartTransfer(spans, /*read=*/false);
}

absl::StatusOr<std::unique_ptr<CopyOutBatch>> SessionMemory::BeginCopyOut(
    StagedRecords* staged) {
  // A save's GPU copies are checked here, once; its host reads at each
  // Enqueue (CheckedHost).
  RETURN_IF_ERROR(peer_->CheckAccess());
  return std::make_unique<PeerCopyOut>(&checked_host_, gpu_, peer_->pidfd(),
                                       peer_->pid(), staged);
}

}  // namespace ckpt

#include "session/memory_source.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt {
namespace {
// process_vm_readv takes at most IOV_MAX (1024) iovecs per side.
constexpr size_t kMaxIovecs = 1024;

// Copies synchronously at Enqueue, so every ticket is ready at once.
class SynchronousCopyOut final : public CopyOutBatch {
 public:
  explicit SynchronousCopyOut(MemorySource* source) : source_(source) {}
  absl::StatusOr<uint64_t> Enqueue(absl::Span<const CopySpan> spans) override {
    RETURN_IF_ERROR(source_->Read(spans));
    return ++tickets_;
  }
  absl::StatusOr<bool> Ready(uint64_t) override { return true; }
  absl::Status Wait(uint64_t) override { return absl::OkStatus(); }
  absl::Status AllEnqueued() override { return absl::OkStatus(); }
  absl::Status Drain() override { return absl::OkStatus(); }

 private:
  MemorySource* const source_;
  uint64_t tickets_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CopyOutBatch>> MemorySource::BeginCopyOut() {
  return std::make_unique<SynchronousCopyOut>(this);
}

absl::Status HostProcessMemory::Read(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/true);
}

absl::Status HostProcessMemory::Write(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/false);
}

// Batches spans into one syscall of up to kMaxIovecs pairs. The kernel may
// stop early (a partial transfer ends at an iovec boundary or at a fault);
// we resume right after the last byte it copied, so a fault is reported by
// the next call as an error rather than looping.
absl::Status HostProcessMemory::Transfer(absl::Span<const CopySpan> spans,
                                         bool read) {
  std::vector<iovec> local;
  std::vector<iovec> remote;
  size_t next = 0;
  uint64_t skip = 0;  // bytes of spans[next] already copied
  while (next < spans.size()) {
    local.clear();
    remote.clear();
    uint64_t batch_bytes = 0;
    for (size_t i = next; i < spans.size() && local.size() < kMaxIovecs; ++i) {
      const uint64_t done = i == next ? skip : 0;
      const uint64_t len = spans[i].length - done;
      if (len == 0) continue;
      local.push_back({spans[i].local + done, len});
      remote.push_back(
          {reinterpret_cast<void*>(spans[i].remote + done), len});
      batch_bytes += len;
    }
    if (batch_bytes == 0) break;
    const ssize_t n =
        read ? process_vm_readv(pid_, local.data(), local.size(), remote.data(),
                                remote.size(), 0)
             : process_vm_writev(pid_, local.data(), local.size(),
                                 remote.data(), remote.size(), 0);
    if (n < 0) {
      return ErrnoToStatus(
          errno, absl::StrCat(read ? "process_vm_readv" : "process_vm_writev",
                              " of pid ", pid_, " at 0x",
                              absl::Hex(remote[0].iov_base == nullptr
                                            ? 0
                                            : reinterpret_cast<uint64_t>(
                                                  remote[0].iov_base))));
    }
    if (n == 0) {
      return absl::InternalError(absl::StrCat(
          read ? "process_vm_readv" : "process_vm_writev", " of pid ", pid_,
          " made no progress"));
    }
    // Advance (next, skip) by n bytes.
    uint64_t left = static_cast<uint64_t>(n);
    while (left > 0 && next < spans.size()) {
      const uint64_t span_left = spans[next].length - skip;
      const uint64_t take = std::min(left, span_left);
      skip += take;
      left -= take;
      if (skip == spans[next].length) {
        ++next;
        skip = 0;
      }
    }
    while (next < spans.size() && spans[next].length == 0) ++next;
  }
  return absl::OkStatus();
}

}  // namespace ckpt

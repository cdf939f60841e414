#include "session/memory_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt {
namespace {

absl::StatusOr<UniqueFd> OpenProcessMemory(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/mem");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  return fd;
}

// Copies synchronously at Enqueue, so every ticket is ready at once.
class SynchronousCopyOut final : public CopyOutBatch {
 public:
  SynchronousCopyOut(MemorySource* source, StagedRecords* staged)
      : source_(source), staged_(staged) {}
  absl::StatusOr<uint64_t> Enqueue(absl::Span<const CopySpan> spans) override {
    RETURN_IF_ERROR(source_->Read(spans));
    return ++tickets_;
  }
  absl::StatusOr<bool> Ready(uint64_t) override { return true; }
  absl::Status Wait(uint64_t) override { return absl::OkStatus(); }
  // Nothing was copied on a stream: the records complete in order.
  absl::Status AllEnqueued() override {
    if (staged_ != nullptr) staged_->CompleteRest();
    return absl::OkStatus();
  }
  absl::Status Drain() override { return absl::OkStatus(); }

 private:
  MemorySource* const source_;
  StagedRecords* const staged_;
  uint64_t tickets_ = 0;
};

}  // namespace

void CopyOutBatch::KeepUntilCopiesEnd(std::vector<StagingLease> buffers) {
  for (StagingLease& buffer : buffers) buffer.Withhold();
}

absl::StatusOr<PoolShare::Claim> CopyOutBatch::ClaimBuffer(bool /*may_wait*/) {
  return PoolShare::Claim();
}

std::unique_ptr<CopiesInFlight> MemorySource::StartWrite(
    absl::Span<const CopySpan> spans) {
  return std::make_unique<EndedCopies>(Write(spans));
}

absl::StatusOr<std::unique_ptr<CopyOutBatch>> MemorySource::BeginCopyOut(
    StagedRecords* staged) {
  return std::make_unique<SynchronousCopyOut>(this, staged);
}

HostProcessMemory::HostProcessMemory(pid_t pid) : HostProcessMemory(-1, pid) {
  absl::StatusOr<UniqueFd> fd = OpenProcessMemory(pid);
  if (fd.ok()) {
    owned_ = *std::move(fd);
    fd_ = owned_.get();
  } else {
    open_error_ = fd.status();
  }
}

absl::Status HostProcessMemory::Read(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/true);
}

absl::Status HostProcessMemory::Write(absl::Span<const CopySpan> spans) {
  return Transfer(spans, /*read=*/false);
}

// One pread/pwrite per run of spans that are contiguous on both sides (the
// chunks of consecutive tensors usually are), so a window of many small
// tensors costs few syscalls.
absl::Status HostProcessMemory::Transfer(absl::Span<const CopySpan> spans,
                                         bool read) {
  RETURN_IF_ERROR(open_error_);
  size_t i = 0;
  while (i < spans.size()) {
    const uint64_t remote = spans[i].remote;
    char* const local = spans[i].local;
    uint64_t length = spans[i].length;
    for (++i; i < spans.size() && spans[i].remote == remote + length &&
              spans[i].local == local + length;
         ++i) {
      length += spans[i].length;
    }
    if (length > 0) RETURN_IF_ERROR(Copy(remote, local, length, read));
  }
  return absl::OkStatus();
}

// The kernel copies page by page and stops early at an unmapped page
// (returning what it copied, or EIO if nothing); we resume after the last
// byte copied, so the fault is reported by the next call.
absl::Status HostProcessMemory::Copy(uint64_t remote, char* local,
                                     uint64_t length, bool read) {
  uint64_t done = 0;
  while (done < length) {
    const uint64_t at = remote + done;
    const size_t want = static_cast<size_t>(length - done);
    const ssize_t n =
        read ? ::pread(fd_, local + done, want, static_cast<off_t>(at))
             : ::pwrite(fd_, local + done, want, static_cast<off_t>(at));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(
          errno,
          absl::StrCat(read ? "read" : "write", " of ", length, " bytes at 0x",
                       absl::Hex(remote), " in pid ", pid_, " (through /proc/",
                       pid_, "/mem) failed at 0x", absl::Hex(at)));
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("the memory of pid ", pid_,
                       " is gone: the process exited or ran "
                       "another program (exec) since its memory was bound"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace ckpt

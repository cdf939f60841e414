#include "io/staging_pool.h"

#include <sys/mman.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(
    uint64_t pool_bytes, uint32_t buffer_bytes) {
  if (buffer_bytes == 0 || buffer_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging buffer size ", buffer_bytes, " is not a multiple of 4096"));
  }
  const uint64_t count = pool_bytes / buffer_bytes;
  if (count < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging pool of ", pool_bytes, " bytes holds fewer than two ",
        buffer_bytes, "-byte buffers"));
  }
  const uint64_t mapped = count * buffer_bytes;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (base == MAP_FAILED) {
    return ErrnoToStatus(errno, absl::StrCat("mmap staging pool of ", mapped,
                                             " bytes"));
  }
  // Pinning keeps the pool resident and lets io_uring register it. Without
  // the privilege (RLIMIT_MEMLOCK, CAP_IPC_LOCK) the pool still works and
  // stays bounded, only unpinned: say so rather than refuse to start.
  if (mlock(base, mapped) != 0) {
    LogWarning(ErrnoToStatus(errno, absl::StrCat("mlock staging pool of ",
                                                 mapped, " bytes"))
                   .ToString(),
               "; continuing with an unpinned pool (raise LimitMEMLOCK / "
               "ulimit -l to pin it)");
  }
  return std::unique_ptr<StagingPool>(
      new StagingPool(static_cast<char*>(base), mapped, buffer_bytes));
}

StagingPool::StagingPool(char* base, uint64_t mapped_bytes,
                         uint32_t buffer_bytes)
    : base_(base), mapped_bytes_(mapped_bytes), buffer_bytes_(buffer_bytes) {
  const int count = static_cast<int>(mapped_bytes / buffer_bytes);
  iovecs_.reserve(count);
  free_.reserve(count);
  for (int i = 0; i < count; ++i) {
    iovecs_.push_back({base_ + uint64_t{buffer_bytes} * i, buffer_bytes});
    // Hand out low indexes first so a lightly used pool touches few buffers.
    free_.push_back(count - 1 - i);
  }
}

StagingPool::~StagingPool() { munmap(base_, mapped_bytes_); }

StagingBuffer StagingPool::Acquire() {
  std::unique_lock lock(mu_);
  freed_.wait(lock, [&] { return !free_.empty(); });
  const int index = free_.back();
  free_.pop_back();
  return {static_cast<char*>(iovecs_[index].iov_base), buffer_bytes_, index};
}

StagingBuffer StagingPool::TryAcquire() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return {};
  const int index = free_.back();
  free_.pop_back();
  return {static_cast<char*>(iovecs_[index].iov_base), buffer_bytes_, index};
}

void StagingPool::Release(const StagingBuffer& buffer) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(buffer.index);
  }
  freed_.notify_one();
}

uint64_t StagingPool::free_bytes() const {
  std::lock_guard lock(mu_);
  return uint64_t{buffer_bytes_} * free_.size();
}

}  // namespace ckpt

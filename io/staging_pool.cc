// StagingPool: one mapping cut into buffers, a free list under a mutex, and
// the leases that are the only way to hold a buffer.
#include "io/staging_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

// "RLIMIT_MEMLOCK 8388608 bytes", for the warning of a pool left unpinned.
std::string MemlockLimitText() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    return ErrnoToStatus(errno, "getrlimit(RLIMIT_MEMLOCK)").ToString();
  }
  if (limit.rlim_cur == RLIM_INFINITY) return "RLIMIT_MEMLOCK unlimited";
  return absl::StrCat("RLIMIT_MEMLOCK ", limit.rlim_cur, " bytes");
}

}  // namespace

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
  const bool pinned = mlock(base, mapped) == 0;
  if (!pinned) {
    const int mlock_errno = errno;
    LogWarning(ErrnoToStatus(mlock_errno, absl::StrCat("mlock staging pool of ",
                                                       mapped, " bytes"))
                   .ToString(),
               " (", MemlockLimitText(), "); continuing with an unpinned pool "
               "(raise LimitMEMLOCK / ulimit -l to pin it; docs/OPERATIONS.md, "
               "\"Running as an ordinary user\", says what it costs)");
  }
  return std::unique_ptr<StagingPool>(
      new StagingPool(static_cast<char*>(base), mapped, buffer_bytes, pinned));
}

StagingPool::StagingPool(char* base, uint64_t mapped_bytes,
                         uint32_t buffer_bytes, bool pinned)
    : base_(base),
      mapped_bytes_(mapped_bytes),
      buffer_bytes_(buffer_bytes),
      pinned_(pinned) {
  const int count = static_cast<int>(mapped_bytes / buffer_bytes);
  iovecs_.reserve(count);
  free_.reserve(count);
  for (int i = 0; i < count; ++i) {
    iovecs_.push_back({base_ + uint64_t{buffer_bytes} * i, buffer_bytes});
    // Hand out low indexes first so a lightly used pool touches few buffers.
    free_.push_back(count - 1 - i);
  }
}

StagingPool::~StagingPool() {
  {
    absl::MutexLock lock(&mu_);
    const size_t lent = iovecs_.size() - free_.size() - withheld_;
    // A lease that outlives its pool would point into unmapped memory: say
    // so, since the crash that follows would not.
    if (lent > 0) LogError("staging pool destroyed with ", lent, " buffers still lent");
  }
  if (munmap(base_, mapped_bytes_) != 0) {
    LogError(ErrnoToStatus(errno, "munmap staging pool").ToString());
  }
}

StagingLease StagingPool::TakeFreeBuffer() {
  const int index = free_.back();
  free_.pop_back();
  return StagingLease(this, static_cast<char*>(iovecs_[index].iov_base),
                      buffer_bytes_, index);
}

StagingLease StagingPool::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &StagingPool::HasFreeBuffer));
  return TakeFreeBuffer();
}

StagingLease StagingPool::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) return {};
  return TakeFreeBuffer();
}

void StagingPool::Return(int index) {
  absl::MutexLock lock(&mu_);
  if (return_observer_) return_observer_(index);
  // Acquire's Await re-evaluates its condition on unlock: no notify needed.
  free_.push_back(index);
}

void StagingPool::Withhold(int index) {
  uint32_t withheld;
  {
    absl::MutexLock lock(&mu_);
    withheld = ++withheld_;
  }
  LogError("staging buffer ", index, " withheld from the pool for good (",
           withheld, " so far)");
}

uint64_t StagingPool::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return uint64_t{buffer_bytes_} * free_.size();
}

uint32_t StagingPool::withheld_buffers() const {
  absl::MutexLock lock(&mu_);
  return withheld_;
}

void StagingPool::SetReturnObserver(std::function<void(int index)> observer) {
  absl::MutexLock lock(&mu_);
  return_observer_ = std::move(observer);
}

StagingLease::StagingLease(StagingLease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      index_(std::exchange(other.index_, -1)) {}

StagingLease& StagingLease::operator=(StagingLease&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    index_ = std::exchange(other.index_, -1);
  }
  return *this;
}

void StagingLease::Reset() {
  if (pool_ == nullptr) return;
  std::exchange(pool_, nullptr)->Return(index_);
  data_ = nullptr;
  size_ = 0;
  index_ = -1;
}

void StagingLease::Withhold() {
  if (pool_ == nullptr) return;
  std::exchange(pool_, nullptr)->Withhold(index_);
  data_ = nullptr;
  size_ = 0;
  index_ = -1;
}

}  // namespace ckpt

#include "session/pool_share.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt {

PoolShare::Claim::Claim(Claim&& other) noexcept
    : share_(std::move(other.share_)), buffers_(std::exchange(other.buffers_, 0)) {}

PoolShare::Claim& PoolShare::Claim::operator=(Claim&& other) noexcept {
  if (this != &other) {
    Reset();
    share_ = std::move(other.share_);
    buffers_ = std::exchange(other.buffers_, 0);
  }
  return *this;
}

void PoolShare::Claim::Reset() {
  if (share_ != nullptr && buffers_ > 0) share_->Give(buffers_);
  share_.reset();
  buffers_ = 0;
}

std::shared_ptr<PoolShare> PoolShare::OfPool(uint64_t pool_buffers, uint32_t percent) {
  percent = std::clamp<uint32_t>(percent, 1, 100);
  const uint64_t limit = std::max<uint64_t>(1, pool_buffers * percent / 100);
  return std::make_shared<PoolShare>(limit, pool_buffers, percent);
}

absl::StatusOr<PoolShare::Claim> PoolShare::Take(const std::shared_ptr<PoolShare>& share,
                                                 absl::Duration wait) {
  PoolShare& s = *share;
  absl::MutexLock lock(&s.mu_);
  // `wait` runs from the last buffer given back, not from the call: while
  // the session's other saves make progress (their copies end), a save
  // that waits for room is not failed, even if they keep taking it first.
  for (;;) {
    const uint64_t gives = s.gives_;
    auto room_or_give = [&s, gives]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_) {
      return s.held_ < s.limit_ || s.gives_ != gives;
    };
    const bool woke = s.mu_.AwaitWithTimeout(absl::Condition(&room_or_give), wait);
    if (s.held_ < s.limit_) break;
    if (!woke) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this session's GPU copies that have not ended hold ", s.held_, " of the pool's ",
          s.pool_buffers_, " staging buffers, the most one session may (",
          "--gpu_pool_share_percent=", s.percent_, "), and none came back within ",
          absl::FormatDuration(wait), " (its trainer's stream has not reached the ready "
          "event of an earlier save?)"));
    }
  }
  ++s.held_;
  return Claim(share, 1);
}

PoolShare::Claim PoolShare::Force(const std::shared_ptr<PoolShare>& share, uint64_t buffers) {
  absl::MutexLock lock(&share->mu_);
  share->held_ += buffers;
  return Claim(share, buffers);
}

uint64_t PoolShare::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

std::string PoolShare::Describe() const {
  return absl::StrCat(held(), " of the pool's ", pool_buffers_,
                      " staging buffers (at most ", limit_, ", --gpu_pool_share_percent=",
                      percent_, ")");
}

void PoolShare::Give(uint64_t buffers) {
  absl::MutexLock lock(&mu_);
  held_ -= std::min(held_, buffers);
  ++gives_;
}

}  // namespace ckpt

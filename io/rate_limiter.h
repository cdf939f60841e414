// RateLimiter: a token bucket shared by the I/O workers that caps the
// daemon's storage write rate (DaemonOptions::write_rate_limit).
//
// Thread-safety: Acquire may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt {

class RateLimiter {
 public:
  // 0 bytes per second disables the limit.
  explicit RateLimiter(uint64_t bytes_per_second)
      : rate_(bytes_per_second), next_(Clock::now()) {}

  // Blocks until `bytes` may be written.
  void Acquire(uint64_t bytes) {
    if (rate_ == 0) return;
    Clock::time_point start;
    {
      absl::MutexLock lock(&mu_);
      const auto now = Clock::now();
      if (next_ < now) next_ = now;
      start = next_;
      next_ += std::chrono::nanoseconds(bytes * 1'000'000'000ull / rate_);
    }
    std::this_thread::sleep_until(start);
  }

 private:
  using Clock = std::chrono::steady_clock;
  const uint64_t rate_;
  absl::Mutex mu_;
  Clock::time_point next_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

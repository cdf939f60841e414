// ByteRateLimiter: paces a stream of bytes to a configured rate, so that a
// background transfer (the remote tier's upload) leaves the node's network
// and disks to the trainer. Acquire(n) blocks until n more bytes may go,
// so that over any span the bytes sent are at most the rate's worth plus
// one second's (the burst an idle spell allows: an idle hour does not buy
// an hour's burst).
//
// Thread-safety: Acquire may be called from several threads; they share
// the rate. `stop` (optional) ends a wait early: Acquire returns false.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckpt {

class ByteRateLimiter {
 public:
  // 0: no limit.
  explicit ByteRateLimiter(uint64_t bytes_per_second) : rate_(bytes_per_second) {}

  // True once `bytes` may be sent; false if `stop` became true while waiting.
  bool Acquire(uint64_t bytes, const std::atomic<bool>* stop = nullptr) {
    if (rate_ == 0 || bytes == 0) return true;
    absl::Time send_at;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      // The bytes take their share of the schedule from where it is free
      // (an idle spell earns nothing past now), and may go once that share
      // ends within a second from now: a second's worth may go at once,
      // and a part larger than that waits for the rest of its time.
      const absl::Time start = std::max(next_, now);
      next_ = start + absl::Seconds(static_cast<double>(bytes) / static_cast<double>(rate_));
      send_at = next_ - absl::Seconds(1);
    }
    while (absl::Now() < send_at) {
      if (stop != nullptr && stop->load()) return false;
      absl::SleepFor(std::min(send_at - absl::Now(), absl::Milliseconds(100)));
    }
    return true;
  }

  uint64_t bytes_per_second() const { return rate_; }

 private:
  const uint64_t rate_;
  absl::Mutex mu_;
  absl::Time next_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ckpt

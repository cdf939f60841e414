// RateLimiter: a token bucket shared by the I/O workers that caps the
// daemon's storage write rate (DaemonOptions::write_rate_limit).
//
// Each write waits until the bucket's next free moment, then takes its
// bytes' share of time: at `rate` bytes/s, N bytes move the next free
// moment N/rate seconds past now. A writer either blocks for its turn
// (Acquire) or asks whether it has come (TryAcquire) and does other work
// meanwhile: the shard writer stages and hashes the windows behind a write
// that waits for its turn, so only the writes are paced, never the copy out
// of the trainer's memory. The rate changes live (SIGHUP): SetRate wakes
// the writers waiting for the old rate's moment, and they wait again at the
// new rate (or not at all, at 0), so lifting a cap lets a throttled save go
// on at once instead of after its old turn. A waiting writer also gives up
// its turn once its save is cancelled, so a cancel (a drain's deadline
// above all) does not wait out a slow queue.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt {

class RateLimiter {
 public:
  // 0 bytes per second disables the limit.
  explicit RateLimiter(uint64_t bytes_per_second)
      : rate_(bytes_per_second), next_(Clock::now()) {}

  // Blocks until `bytes` may be written and takes that turn (true), or
  // until `*cancelled` (if given) is true, which is noticed within
  // kCancelPoll (false: no turn was taken).
  bool Acquire(uint64_t bytes, const std::atomic<bool>* cancelled = nullptr) {
    absl::MutexLock lock(&mu_);
    while (rate_ != 0) {
      if (cancelled != nullptr && cancelled->load()) return false;
      const Clock::time_point now = Clock::now();
      if (TakeTurnLocked(bytes, now)) return true;
      // Woken early by SetRate (the condition), else by the timeout: the
      // turn has come, or it is time to look at `cancelled` again.
      const uint64_t generation = generation_;
      const auto wait = std::min<Clock::duration>(next_ - now, kCancelPoll);
      auto rate_changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return generation_ != generation;
      };
      mu_.AwaitWithTimeout(absl::Condition(&rate_changed), absl::FromChrono(wait));
    }
    return true;
  }

  // Takes the turn for `bytes` if it has come (true); never blocks.
  bool TryAcquire(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    return rate_ == 0 || TakeTurnLocked(bytes, Clock::now());
  }

  // The cap from now on; writers waiting for their turn are rescheduled.
  void SetRate(uint64_t bytes_per_second) {
    absl::MutexLock lock(&mu_);
    rate_ = bytes_per_second;
    next_ = Clock::now();
    ++generation_;
  }

  uint64_t rate() const {
    absl::MutexLock lock(&mu_);
    return rate_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kCancelPoll = std::chrono::milliseconds(50);

  // At a non-zero rate: if the next free moment has come, moves it past
  // `now` by `bytes`' share of time (true).
  bool TakeTurnLocked(uint64_t bytes, Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (next_ > now) return false;
    next_ = now + std::chrono::nanoseconds(bytes * 1'000'000'000ull / rate_);
    return true;
  }

  mutable absl::Mutex mu_;
  uint64_t rate_ ABSL_GUARDED_BY(mu_);
  Clock::time_point next_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // SetRate calls
};

}  // namespace ckpt

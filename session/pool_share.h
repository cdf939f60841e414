// PoolShare: how many staging buffers one session's GPU copies that have
// not ended may hold, and how many they hold now.
//
// A save stages into pool buffers as fast as the pool lends them, and a GPU
// save's copies wait on the daemon's streams for the trainer's ready event
// before they run. A trainer whose stream does not get there (a hung step,
// a client that lies) would thus hold every buffer of the pool, and every
// other user's save would wait with nothing staged. So each session has a
// share of the pool (--gpu_pool_share_percent of its buffers, at least
// one): the save writer takes a Claim on one buffer before it stages a
// window (ShardWriter, through CopyOutBatch::ClaimBuffer), and drops it once
// that window's copies are known to have ended. A window beyond the share
// waits for the save's own oldest window; a save with none waits for the
// session's other saves, and fails naming the bound once none of the
// session's copies ended for the copy timeout.
// Buffers handed to AbandonedCopies stay claimed until their copies end, so
// a trainer that fails save after save cannot take more than its share
// either.
//
// Ownership: shared (std::shared_ptr) by the session and every claim, which
// may outlive the session (an abandoned save's). Thread-safety: safe for
// concurrent use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt {

class PoolShare {
 public:
  // The right to hold `buffers()` buffers of the share; given back when
  // destroyed or Reset. Move-only; one thread at a time.
  class Claim {
   public:
    Claim() = default;  // holds nothing
    Claim(Claim&& other) noexcept;
    Claim& operator=(Claim&& other) noexcept;
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;
    ~Claim() { Reset(); }

    uint64_t buffers() const { return buffers_; }
    void Reset();

   private:
    friend class PoolShare;
    Claim(std::shared_ptr<PoolShare> share, uint64_t buffers)
        : share_(std::move(share)), buffers_(buffers) {}

    std::shared_ptr<PoolShare> share_;  // null: holds nothing
    uint64_t buffers_ = 0;
  };

  // `limit` buffers of a pool of `pool_buffers` (`percent` of it), for the
  // messages. `limit` is at least 1.
  PoolShare(uint64_t limit, uint64_t pool_buffers, uint32_t percent)
      : limit_(limit), pool_buffers_(pool_buffers), percent_(percent) {}
  // The share of a pool of `pool_buffers` buffers at `percent` (1..100).
  static std::shared_ptr<PoolShare> OfPool(uint64_t pool_buffers, uint32_t percent);

  // One buffer, once the share has room; ResourceExhausted naming the
  // bound once `wait` passed with no buffer of the share given back (the
  // session's copies make no progress: its trainer's stream is stuck).
  static absl::StatusOr<Claim> Take(const std::shared_ptr<PoolShare>& share,
                                    absl::Duration wait);
  // `buffers` buffers now, over the limit if need be: for buffers already
  // out of the pool whose claims end elsewhere (KeepUntilCopiesEnd).
  static Claim Force(const std::shared_ptr<PoolShare>& share, uint64_t buffers);

  uint64_t held() const;
  uint64_t limit() const { return limit_; }
  // "N of the pool's M staging buffers (--gpu_pool_share_percent=P)".
  std::string Describe() const;

 private:
  void Give(uint64_t buffers);

  // Constant after construction.
  const uint64_t limit_;
  const uint64_t pool_buffers_;
  const uint32_t percent_;

  mutable absl::Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t gives_ ABSL_GUARDED_BY(mu_) = 0;  // Give calls so far

};

}  // namespace ckpt

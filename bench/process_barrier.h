// ProcessBarrier: a barrier for forked processes, placed in shared memory,
// that a failing process can abort so the others do not wait forever
// (pthread_barrier_t cannot be cancelled). A process killed while the
// others wait cannot abort it itself: the one that forked them watches
// them and aborts it for them (bench/loadgen.cc), waiting itself in slices
// (Arrive, then Await with a timeout) so that it can look in between.
#pragma once

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include <cstdint>

namespace ckpt::bench {

class ProcessBarrier {
 public:
  enum class Outcome { kPassed, kAborted, kTimedOut };

  // Call once, in memory shared by every participant, before forking;
  // again (with no participant waiting) for another round of `count`.
  bool Init(uint32_t count) {
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    if (pthread_mutexattr_init(&ma) != 0 || pthread_condattr_init(&ca) != 0 ||
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) != 0 ||
        pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED) != 0 ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_mutex_init(&mu_, &ma) != 0 || pthread_cond_init(&cv_, &ca) != 0) {
      return false;
    }
    count_ = count;
    return true;
  }

  // Waits for all `count` participants; false if the barrier was aborted.
  bool Wait() { return Await(Arrive(), -1) == Outcome::kPassed; }

  // Counts this participant in; returns the round to Await.
  uint64_t Arrive() {
    pthread_mutex_lock(&mu_);
    const uint64_t generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      pthread_cond_broadcast(&cv_);
    }
    pthread_mutex_unlock(&mu_);
    return generation;
  }

  // Waits, at most `timeout_ms` (< 0: without end), for round `generation`
  // to pass. kTimedOut leaves the participant counted in: Await again.
  Outcome Await(uint64_t generation, int64_t timeout_ms) {
    timespec deadline{};
    if (timeout_ms >= 0) {
      clock_gettime(CLOCK_MONOTONIC, &deadline);
      const int64_t ns = deadline.tv_nsec + (timeout_ms % 1000) * 1000000;
      deadline.tv_sec += timeout_ms / 1000 + ns / 1000000000;
      deadline.tv_nsec = ns % 1000000000;
    }
    pthread_mutex_lock(&mu_);
    Outcome outcome = Outcome::kPassed;
    while (generation == generation_ && !aborted_) {
      if (timeout_ms < 0) {
        pthread_cond_wait(&cv_, &mu_);
      } else if (pthread_cond_timedwait(&cv_, &mu_, &deadline) == ETIMEDOUT) {
        outcome = Outcome::kTimedOut;
        break;
      }
    }
    if (aborted_) outcome = Outcome::kAborted;
    else if (generation != generation_) outcome = Outcome::kPassed;
    pthread_mutex_unlock(&mu_);
    return outcome;
  }

  void Abort() {
    pthread_mutex_lock(&mu_);
    aborted_ = true;
    pthread_cond_broadcast(&cv_);
    pthread_mutex_unlock(&mu_);
  }

 private:
  pthread_mutex_t mu_;
  pthread_cond_t cv_;
  uint32_t count_ = 0;
  uint32_t waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

}  // namespace ckpt::bench

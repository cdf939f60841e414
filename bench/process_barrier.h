// ProcessBarrier: a barrier for forked processes, placed in shared memory,
// that a failing process can abort so the others do not wait forever
// (pthread_barrier_t cannot be cancelled).
#pragma once

#include <pthread.h>

#include <cstdint>

namespace ckpt::bench {

class ProcessBarrier {
 public:
  // Call once, in memory shared by every participant, before forking.
  bool Init(uint32_t count) {
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    if (pthread_mutexattr_init(&ma) != 0 || pthread_condattr_init(&ca) != 0 ||
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) != 0 ||
        pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED) != 0 ||
        pthread_mutex_init(&mu_, &ma) != 0 || pthread_cond_init(&cv_, &ca) != 0) {
      return false;
    }
    count_ = count;
    return true;
  }

  // Waits for all `count` participants; false if the barrier was aborted.
  bool Wait() {
    pthread_mutex_lock(&mu_);
    const uint64_t generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      pthread_cond_broadcast(&cv_);
    }
    while (generation == generation_ && !aborted_) pthread_cond_wait(&cv_, &mu_);
    const bool ok = !aborted_;
    pthread_mutex_unlock(&mu_);
    return ok;
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

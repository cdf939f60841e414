// SaveProgressBoard: every save part's progress, as trainers and ckptctl see
// it.
//
// Each part (one rank's save) has a SaveProgress and a version that grows
// with each publication. WatchNext lets a gRPC stream ask for the next
// version without a thread waiting: the listener is kept and called once a
// newer version is published. Phase changes are published at once; byte
// counters at most every 200 ms, so a fast save does not flood its watchers.
// An ended part stays on the board for 10 minutes (at most 4096 ended parts)
// so a watcher that arrives late still learns how the save ended; a
// committed part whose remote phase still runs (RemotePhasePending,
// common/save_phase.h) stays at least until that phase ends.
//
// Listeners are never called under a lock: the mutating methods collect the
// calls in a ListenerCalls, which the caller makes with Run() once it holds
// no lock (it may call them while holding its own lock: board calls nest
// inside InFlightCheckpoints' lock).
//
// Ownership: owns the progress records and the pending listeners.
// Every phase change is published here, so the board also counts each
// part's outcome and phase latencies into DaemonMetrics (atomics only).
//
// Thread-safety: all methods may be called from any thread. `mu_` is a leaf:
// nothing outside the board is called while it is held.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ckpt/v1/control.pb.h"

namespace ckpt {

class SaveProgressBoard {
 public:
  using Listener =
      std::function<void(const v1::SaveProgress& progress, uint64_t version)>;

  // Listener calls collected under locks, made by Run() once they are all
  // released. Move-only; Run() at most once.
  class ListenerCalls {
   public:
    ListenerCalls() = default;
    ListenerCalls(ListenerCalls&&) = default;
    ListenerCalls& operator=(ListenerCalls&&) = default;
    ListenerCalls(const ListenerCalls&) = delete;
    ListenerCalls& operator=(const ListenerCalls&) = delete;

    void Run();

   private:
    friend class SaveProgressBoard;
    struct Call {
      std::vector<Listener> listeners;
      v1::SaveProgress progress;
      uint64_t version = 0;
    };
    std::vector<Call> calls_;
  };

  // Puts a new part (progress.save_id()) on the board, owned by
  // `session_id` of trainer `pid`, and publishes it as version 1. Every
  // phase the part enters is logged once, naming the trainer.
  void Add(uint64_t session_id, pid_t pid, const v1::SaveProgress& progress,
           ListenerCalls* out);

  // Applies `change` to the part's progress, then publishes it: at once
  // with `force`, otherwise only if the last publication is 200 ms old (the
  // change is kept either way). A part no longer on the board is ignored.
  void Update(uint64_t save_id, bool force,
              absl::FunctionRef<void(v1::SaveProgress&)> change,
              ListenerCalls* out);

  // Calls `listener` once, with the part's progress as soon as its version
  // is greater than `after` (here, at once, if it already is). NotFound for
  // an unknown save, PermissionDenied if another session owns it.
  absl::Status WatchNext(uint64_t session_id, uint64_t save_id, uint64_t after,
                         Listener listener);

  // True if the save is (still) on the board and `session_id` owns it.
  bool Owns(uint64_t session_id, uint64_t save_id) const;

  // Progress of every part not yet in a final phase.
  std::vector<v1::SaveProgress> InFlight() const;

 private:
  struct Entry {
    uint64_t session_id = 0;
    pid_t pid = 0;  // the trainer's, for its log lines
    v1::SaveProgress progress;
    uint64_t version = 0;
    std::chrono::steady_clock::time_point last_publish;
    std::vector<Listener> listeners;
    // When Add put it here (ACCEPTED): the phases' latencies start here.
    std::chrono::steady_clock::time_point accepted_at;
  };

  // Bumps the version and hands the waiting listeners to `out`, unless
  // rate-limited (not `force`, published less than 200 ms ago).
  static void PublishLocked(Entry& entry, bool force, ListenerCalls* out);
  // Forgets ended parts that are old, or beyond the most kept.
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by save id
};

}  // namespace ckpt

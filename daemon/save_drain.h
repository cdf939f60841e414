// DrainSaves: the first step of the daemon's stop (SIGTERM, SIGINT), so
// that a stop never strands a save that could have finished.
//
//   1. New work is refused: a Save that would start a new checkpoint, and
//      OpenSession, fail UNAVAILABLE "ckptd is stopping" (a part of a
//      checkpoint already in flight is still taken, so that it can
//      commit).
//   2. The saves in flight go on, with the whole daemon still serving
//      them (trainer sessions, progress streams, the commit watcher),
//      until none is left or `deadline` has passed. A second stop signal
//      cuts the wait short.
//   3. What is left is cancelled, its waiters told "ckptd stopped before
//      this checkpoint committed; drain deadline N ms" (CANCELLED), and its
//      files removed as after any cancel (SaveCoordinator::CancelAll).
//
// The log names the checkpoints that ended during the drain and those
// cancelled at its end. Committed checkpoints are never touched.
//
// Ownership: borrows `saves`. Thread-safety: runs on the signal loop's
// thread, where `signals` are blocked (sigtimedwait takes them).
#pragma once

#include <csignal>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "save/save_coordinator.h"

namespace ckpt {

struct DrainOutcome {
  std::vector<std::string> ended;      // "job/name": ended during the drain
  std::vector<std::string> cancelled;  // ended by the deadline's cancel
  bool cut_short = false;              // a second stop signal came
};

// `tick` runs about every 100 ms while saves drain (the service status).
// SIGHUP during the drain is consumed and ignored (logged).
DrainOutcome DrainSaves(SaveCoordinator& saves, absl::Duration deadline,
                        const sigset_t& signals, const std::function<void()>& tick);

// The reason a drain's cancel gives the checkpoint's waiters.
std::string DrainCancelReason(absl::Duration deadline);

}  // namespace ckpt

// LiveReload: applies a re-read config to the running daemon (SIGHUP).
//
// Four settings change live: keep_last (retention, from the next commit),
// write_rate_limit (from the next write, waiting writes included),
// keep_in_memory_bytes (the memory tier's budget; shrinking evicts at once
// what no load or save holds) and log_level. Apply compares the options
// re-read (the config file as it is now, with the command line's flags
// still over it) with those in effect, key by key through v1::Config, and
// logs each live change as "key: old -> new"; a changed key that only a
// restart applies is logged as such and stays at its running value, so the
// next reload reports it again.
//
// Ownership: borrows the SaveCoordinator and MemoryTier, which outlive it.
// Thread-safety: not thread-safe; the daemon's signal loop is its one
// caller. The setters it calls are thread-safe.
#pragma once

#include <string>
#include <vector>

#include "daemon/daemon_options.h"
#include "save/save_coordinator.h"
#include "storage/memory_tier.h"

namespace ckpt {

class LiveReload {
 public:
  LiveReload(const DaemonOptions& running, SaveCoordinator* saves, MemoryTier* tier)
      : running_(running), saves_(saves), tier_(tier) {}

  // What Apply did, for the log and tests: "key: old -> new" per change.
  struct Outcome {
    std::vector<std::string> applied;
    std::vector<std::string> need_restart;
  };
  // Applies the live settings of `next` that differ from those in effect.
  // `next` must have passed ValidateOptions.
  Outcome Apply(const DaemonOptions& next);

  // The options in effect: the start's, with the live keys reloaded since.
  const DaemonOptions& running() const { return running_; }

 private:
  DaemonOptions running_;
  SaveCoordinator* const saves_;
  MemoryTier* const tier_;
};

}  // namespace ckpt

// DaemonMetrics: every metric ckptd exports, in one process-wide registry.
//
// The rooms count where the work happens (save/, restore/, io/, session/,
// daemon/), so the metrics live in the foundation every room may include
// (tests/layering_test.py), and are reached through Get() rather than
// passed down through every constructor: a count is one line at its site.
// What each metric means, and where it is counted, is documented once, in
// docs/OPERATIONS.md ("Metrics"); the HELP texts below say it briefly.
//
// Gauges of state a component already keeps (staging pool, memory tier,
// sessions, connections) are bound by that component for its lifetime
// (Gauge::Bind), so they are read at render time and read 0 once it is
// gone; saves in flight and the I/O queue depth are moved where they change.
//
// Ownership: Get() returns a process-wide instance that is never destroyed
// (threads may still count during exit). Thread-safety: as MetricRegistry:
// updates are lock-free, any thread may count.
#pragma once

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"

namespace ckpt {

class DaemonMetrics {
 public:
  // The daemon's metrics.
  static DaemonMetrics& Get();

  // A registry of its own, with the same metrics (tests).
  DaemonMetrics();
  DaemonMetrics(const DaemonMetrics&) = delete;
  DaemonMetrics& operator=(const DaemonMetrics&) = delete;

  MetricRegistry& registry() { return registry_; }

  // One error of `status`'s kind (nothing for OK).
  void CountError(const absl::Status& status) { CountError(status.code()); }
  void CountError(absl::StatusCode code);
  // The error counter of `code` (UNKNOWN for a code outside absl's).
  Counter& errors(absl::StatusCode code);

  // Sets ckptd_build_info{version} and ckptd_start_time_seconds (now).
  void MarkStarted(absl::string_view version);

 private:
  MetricRegistry registry_;  // first: the references below point into it

 public:
  // Saves: one per Save call accepted (a rank's part), by how it ended.
  Counter& saves_committed;
  Counter& saves_failed;
  Counter& saves_cancelled;
  Gauge& saves_in_flight;
  // Loads the loader finished.
  Counter& loads_ok;
  Counter& loads_failed;
  // Data-file bytes.
  Counter& staged_bytes;
  Counter& written_bytes;
  Counter& read_bytes_storage;
  Counter& read_bytes_memory;
  Counter& read_bytes_remote;  // fetched from the remote tier for loads

  // The remote tier (storage/remote_tier.h).
  Counter& remote_uploads_committed;
  Counter& remote_uploads_failed;
  Counter& remote_uploaded_bytes;
  Counter& remote_retries;  // S3 requests tried again (storage/s3/retry_policy.h)
  Counter& remote_deleted_committed;  // remote retention (storage/remote_retention.h)
  Counter& remote_deleted_remnants;
  Gauge& remote_backlog;  // uploads queued or running
  // Latencies, in seconds.
  Histogram& save_call_seconds;       // the Save RPC's handling
  Histogram& save_staged_seconds;     // accepted -> STAGED
  Histogram& save_durable_seconds;    // accepted -> DURABLE
  Histogram& save_committed_seconds;  // accepted -> COMMITTED
  Histogram& load_seconds;            // a Load, request to answer
  // Bound by their components (see above).
  Gauge& staging_pool_used_bytes;
  Gauge& staging_pool_size_bytes;
  Gauge& staging_pool_withheld_bytes;
  Gauge& gpu_saves_held;
  Gauge& memory_tier_used_bytes;
  Gauge& memory_tier_budget_bytes;
  Gauge& sessions;
  Gauge& connections;
  // Transfers submitted to the I/O workers' queues, not yet completed.
  Gauge& io_queue_depth;
  Gauge& start_time_seconds;

 private:
  // By absl::StatusCode value; [0] (OK) unused.
  std::array<Counter*, 17> errors_{};
};

}  // namespace ckpt

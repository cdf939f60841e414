#include "common/daemon_metrics.h"

#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckpt {
namespace {

// The Save call returns at ACCEPTED, in about a millisecond: buckets from
// 100 us to 10 s.
std::vector<double> CallBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5, 5, 10};
}

// Phases and loads take from milliseconds (a small save into a large pool)
// to the commit timeout's ten minutes and beyond.
std::vector<double> PhaseBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
          5,     10,   30,    60,   120, 300,  600, 1200, 3600};
}

constexpr char kSaves[] = "ckptd_saves_total";
constexpr char kSavesHelp[] =
    "Save calls (one rank's part of a checkpoint) that ended, by outcome.";
constexpr char kLoads[] = "ckptd_loads_total";
constexpr char kLoadsHelp[] =
    "Loads the daemon ran (past the session and access checks), by outcome.";
constexpr char kRead[] = "ckptd_read_bytes_total";
constexpr char kReadHelp[] =
    "Data-file bytes read for loads and verifies, from storage (O_DIRECT "
    "reads), from the memory tier, or fetched from the remote tier.";
constexpr char kRemoteUploads[] = "ckptd_remote_uploads_total";
constexpr char kRemoteUploadsHelp[] =
    "Checkpoints this node's remote tier finished uploading, by outcome "
    "(committed there, or failed naming why in the log).";
constexpr char kRemoteDeleted[] = "ckptd_remote_deleted_total";
constexpr char kRemoteDeletedHelp[] =
    "Checkpoints remote retention deleted from the remote tier: committed "
    "ones beyond --remote_keep_last, and uncommitted remnants older than "
    "remote LATEST.";
constexpr char kErrors[] = "ckptd_errors_total";
constexpr char kErrorsHelp[] =
    "Errors by status code: calls answered with an error, and saves that an "
    "error ended after their call returned.";

}  // namespace

DaemonMetrics& DaemonMetrics::Get() {
  // Never destroyed: I/O workers and gRPC threads may count during exit.
  static DaemonMetrics* const metrics = new DaemonMetrics();
  return *metrics;
}

DaemonMetrics::DaemonMetrics()
    : saves_committed(registry_.AddCounter(kSaves, kSavesHelp, "outcome", "committed")),
      saves_failed(registry_.AddCounter(kSaves, kSavesHelp, "outcome", "failed")),
      saves_cancelled(registry_.AddCounter(kSaves, kSavesHelp, "outcome", "cancelled")),
      saves_in_flight(registry_.AddGauge(
          "ckptd_saves_in_flight", "Save calls accepted that have not ended yet.")),
      loads_ok(registry_.AddCounter(kLoads, kLoadsHelp, "outcome", "ok")),
      loads_failed(registry_.AddCounter(kLoads, kLoadsHelp, "outcome", "failed")),
      staged_bytes(registry_.AddCounter(
          "ckptd_staged_bytes_total",
          "Data-file bytes filled into staging buffers (headers included).")),
      written_bytes(registry_.AddCounter(
          "ckptd_written_bytes_total",
          "Data-file bytes written to storage by completed writes (the last "
          "block of a file padded to 4096).")),
      read_bytes_storage(registry_.AddCounter(kRead, kReadHelp, "source", "storage")),
      read_bytes_memory(registry_.AddCounter(kRead, kReadHelp, "source", "memory")),
      read_bytes_remote(registry_.AddCounter(kRead, kReadHelp, "source", "remote")),
      remote_uploads_committed(
          registry_.AddCounter(kRemoteUploads, kRemoteUploadsHelp, "outcome", "committed")),
      remote_uploads_failed(
          registry_.AddCounter(kRemoteUploads, kRemoteUploadsHelp, "outcome", "failed")),
      remote_uploaded_bytes(registry_.AddCounter(
          "ckptd_remote_uploaded_bytes_total",
          "Data-file bytes this node sent to the remote tier (parts retried by "
          "the S3 client counted once).")),
      remote_retries(registry_.AddCounter(
          "ckptd_remote_retries_total",
          "Requests to the remote tier's S3 server tried again (5xx, SlowDown, "
          "timeouts, connection errors) by the client's retry policy.")),
      remote_deleted_committed(
          registry_.AddCounter(kRemoteDeleted, kRemoteDeletedHelp, "what", "committed")),
      remote_deleted_remnants(
          registry_.AddCounter(kRemoteDeleted, kRemoteDeletedHelp, "what", "remnant")),
      remote_backlog(registry_.AddGauge(
          "ckptd_remote_backlog",
          "Checkpoints waiting for or in their upload to the remote tier.")),
      save_call_seconds(registry_.AddHistogram(
          "ckptd_save_call_seconds",
          "Time the daemon took to handle a Save call (validate, queue, answer).",
          CallBuckets())),
      save_staged_seconds(registry_.AddHistogram(
          "ckptd_save_staged_seconds",
          "Time from a save's acceptance to STAGED (every byte copied out).",
          PhaseBuckets())),
      save_durable_seconds(registry_.AddHistogram(
          "ckptd_save_durable_seconds",
          "Time from a save's acceptance to DURABLE (this node's files and "
          "manifest fsynced).",
          PhaseBuckets())),
      save_committed_seconds(registry_.AddHistogram(
          "ckptd_save_committed_seconds",
          "Time from a save's acceptance to COMMITTED.", PhaseBuckets())),
      load_seconds(registry_.AddHistogram(
          "ckptd_load_seconds",
          "Time from a Load call to its answer (batching, reads, verification "
          "and delivery).",
          PhaseBuckets())),
      staging_pool_used_bytes(registry_.AddGauge(
          "ckptd_staging_pool_used_bytes", "Staging pool bytes lent out now.")),
      staging_pool_size_bytes(registry_.AddGauge("ckptd_staging_pool_size_bytes",
                                                 "Staging pool size in bytes.")),
      staging_pool_withheld_bytes(registry_.AddGauge(
          "ckptd_staging_pool_withheld_bytes",
          "Staging pool bytes kept out of the pool for good (copies or I/O whose "
          "end cannot be known).")),
      gpu_saves_held(registry_.AddGauge(
          "ckptd_gpu_saves_held",
          "Failed saves whose GPU copies may still run: their staging buffers and "
          "GPU mappings are held until the copies end.")),
      memory_tier_used_bytes(registry_.AddGauge(
          "ckptd_memory_tier_used_bytes",
          "Bytes of checkpoint images the memory tier holds.")),
      memory_tier_budget_bytes(registry_.AddGauge(
          "ckptd_memory_tier_budget_bytes",
          "The memory tier's budget in bytes (0: the tier is off).")),
      sessions(registry_.AddGauge("ckptd_sessions", "Trainer sessions open.")),
      connections(registry_.AddGauge("ckptd_connections", "gRPC connections open.")),
      io_queue_depth(registry_.AddGauge(
          "ckptd_io_queue_depth",
          "Transfers submitted to the I/O workers' queues and not yet completed.")),
      start_time_seconds(registry_.AddGauge(
          "ckptd_start_time_seconds", "When the daemon started, in Unix seconds.")) {
  for (int code = 1; code < static_cast<int>(errors_.size()); ++code) {
    errors_[code] = &registry_.AddCounter(
        kErrors, kErrorsHelp, "code",
        absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  }
}

Counter& DaemonMetrics::errors(absl::StatusCode code) {
  const int c = static_cast<int>(code);
  if (c <= 0 || c >= static_cast<int>(errors_.size())) {
    return *errors_[static_cast<int>(absl::StatusCode::kUnknown)];
  }
  return *errors_[c];
}

void DaemonMetrics::CountError(absl::StatusCode code) {
  if (code != absl::StatusCode::kOk) errors(code).Add();
}

void DaemonMetrics::MarkStarted(absl::string_view version) {
  registry_
      .AddGauge("ckptd_build_info", "The daemon's version; the value is 1.",
                "version", version)
      .Set(1);
  start_time_seconds.Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
}

}  // namespace ckpt

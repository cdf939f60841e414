// MetricsWriter: writes the daemon's metrics (common/daemon_metrics.h) for
// node_exporter's textfile collector, every `interval`, and a final time
// when it stops.
//
// Why a file and not an HTTP endpoint: the daemon runs privileged and opens
// no TCP port at all (its sockets are Unix sockets under the trust model of
// docs/OPERATIONS.md); node_exporter, already on every node, serves the
// file with the node's other metrics. docs/OPERATIONS.md ("Metrics") says
// more.
//
// Each write replaces the file atomically, so the collector never reads a
// half-written one:
//   1. render the metrics,
//   2. create "<name>.tmp.<pid>" O_EXCL beneath the directory's descriptor
//      (no symlink followed: storage/storage_dir.h), mode 0644 whatever the
//      umask (the collector runs as another user; nobody else may write),
//   3. write it whole,
//   4. renameat it over <name> in the same directory (a link planted under
//      <name> is replaced, never written through).
// No fsync: the file is rewritten every interval, and after a crash the
// next daemon rewrites it. The collector reads only *.prom files, so the
// temporary is never collected.
//
// The directory is the one the operator named (it must exist); it is
// opened once at Start, refusing a symlink as its last component, and kept
// open, so every write lands in that directory. A write that fails (disk
// full) is logged once until one succeeds again; the daemon goes on.
//
// Ownership: owns the directory descriptor and the writer thread.
// Thread-safety: Stop (and the destructor) from the thread that started it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "storage/storage_dir.h"

namespace ckpt {

class MetricsWriter {
 public:
  // Writes `registry` to `path` (absolute; empty: metrics off, and Start
  // returns null) now, then every `interval_ms` (> 0) on a thread of its
  // own. Fails, naming the flag, if the path is unusable or the first
  // write fails, or if `registry` reports a registration error.
  static absl::StatusOr<std::unique_ptr<MetricsWriter>> Start(
      const std::string& path, uint64_t interval_ms, const MetricRegistry* registry);
  ~MetricsWriter();  // Stop
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Stops the thread and writes the file a final time. Idempotent.
  void Stop();

  // One write now (for Start, the thread and Stop; tests).
  absl::Status WriteOnce();

 private:
  MetricsWriter(StorageDir dir, std::string name, std::chrono::milliseconds interval,
                const MetricRegistry* registry);
  void Run();
  // WriteOnce, logging a failure once until a write succeeds again.
  void WriteAndLog();

  // Constant after construction.
  const StorageDir dir_;
  const std::string name_;  // the file's name in dir_
  const std::chrono::milliseconds interval_;
  const MetricRegistry* const registry_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failing_ = false;  // the last write failed; only the writing thread
  std::thread thread_;
};

}  // namespace ckpt

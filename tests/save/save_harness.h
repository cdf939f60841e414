// SaveHarness: a SaveCoordinator and everything it borrows, in the test's
// own process, with no daemon and no gRPC, for tests of the save path
// through its seams:
//
//   - the I/O workers run on FaultInjectingQueues (IoWorkers' QueueFactory)
//     that the harness owns, so a test sets faults before the workers start
//     and reads the queues' observations once they have stopped;
//   - the data files' ftruncate/fsync and the node manifest's and COMMIT's
//     writes go through the FileOps the test passes;
//   - each rank is a Session of this very process (OpenOwnProcessSession)
//     with its tensors in a buffer the harness owns;
//   - every save is watched through WatchNext as a trainer's stream would
//     (ProgressLog), and the test waits for a phase with a deadline.
//
// Ownership: owns all of the above; borrows the storage root (a TempDir the
// test owns, so that two harnesses, two nodes, can share it).
// Thread-safety: a harness is used from the test's thread; ProgressLog
// records from whichever thread publishes.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "ckpt/v1/control.pb.h"
#include "io/io_queue.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "save/save_coordinator.h"
#include "save/save_options.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "storage/memory_tier.h"
#include "support/fault_injecting_queue.h"

namespace ckpt::testing {

// No test waits longer than this for a phase.
inline constexpr absl::Duration kPhaseWaitLimit = absl::Seconds(30);

// Every progress one save publishes, as its trainer's watch stream sees it:
// the listener records the progress and asks WatchNext for the next version
// until a final phase. Publications that follow each other before the
// listener asks again reach it as the newest one only, as on the stream.
//
// Thread-safety: all methods may be called from any thread.
class ProgressLog {
 public:
  static std::shared_ptr<ProgressLog> Watch(SaveCoordinator* coordinator,
                                            std::shared_ptr<Session> session,
                                            uint64_t save_id);

  // The newest progress once `done` holds for it; nullopt if that takes
  // longer than `limit`.
  std::optional<v1::SaveProgress> WaitFor(
      const std::function<bool(const v1::SaveProgress&)>& done,
      absl::Duration limit = kPhaseWaitLimit) const;
  std::optional<v1::SaveProgress> WaitForPhase(
      v1::Phase phase, absl::Duration limit = kPhaseWaitLimit) const;
  // The newest progress once it is COMMITTED, FAILED or CANCELLED.
  std::optional<v1::SaveProgress> WaitForEnd(
      absl::Duration limit = kPhaseWaitLimit) const;

  uint64_t save_id() const { return id_; }
  // The phases seen, in order, each once however often it was published.
  std::vector<v1::Phase> Phases() const;
  // The newest progress seen (a default one before any).
  v1::SaveProgress Latest() const;
  // What WatchNext answered, if it refused.
  absl::Status watch_error() const;
  // For failure messages: the phases and the last reason.
  std::string Describe() const;

 private:
  ProgressLog(SaveCoordinator* coordinator, std::shared_ptr<Session> session,
              uint64_t save_id)
      : coordinator_(coordinator), session_(std::move(session)), id_(save_id) {}
  void Arm(const std::shared_ptr<ProgressLog>& self, uint64_t after);

  SaveCoordinator* const coordinator_;
  const std::shared_ptr<Session> session_;
  const uint64_t id_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;
  std::vector<v1::SaveProgress> seen_ ABSL_GUARDED_BY(mu_);
  absl::Status watch_error_ ABSL_GUARDED_BY(mu_);
};

struct SaveHarnessOptions {
  uint32_t node_id = 0;
  uint32_t nodes = 1;
  uint32_t io_workers = 2;
  uint64_t commit_timeout_ms = 60'000;
  uint64_t local_ranks_timeout_ms = 60'000;
  FileOps* file_ops = nullptr;  // null: the real syscalls
  uint64_t memory_tier_bytes = 0;  // the tier's budget; 0: off
  // Applied to each worker's queue before the workers start.
  std::function<void(FaultInjectingQueue&)> faults;
};

class SaveHarness {
 public:
  static constexpr uint32_t kBufferBytes = 64 * 1024;
  static constexpr uint32_t kPoolBuffers = 8;
  static constexpr uint32_t kQueueDepth = 8;
  // Each rank's shard of "model.weight" is larger than the pool, so its
  // file streams through back-pressure; "model.bias" is small.
  static constexpr uint64_t kWeightElements = 160 * 1024;  // 640 KiB of F32
  static constexpr uint64_t kBiasElements = 1000;
  static constexpr const char* kJob = "job";

  // One rank of the job on this node.
  struct Rank {
    uint32_t rank = 0;
    std::shared_ptr<Session> session;
    std::string memory;        // its tensors, one registered host region
    v1::SaveRequest request;   // every tensor and a byte item
  };

  // `root`, the storage root, exists and outlives the harness.
  explicit SaveHarness(std::string root, SaveHarnessOptions options = {});
  // Lets held workers go, finishes every queued task, then the coordinator.
  ~SaveHarness();
  SaveHarness(const SaveHarness&) = delete;
  SaveHarness& operator=(const SaveHarness&) = delete;

  // Opens a session for `rank` of a job of `world_size` ranks with
  // `local_world_size` on this node, and fills its memory.
  Rank& AddRank(uint32_t rank, uint32_t world_size, uint32_t local_world_size);
  // Submits the rank's save of `checkpoint` (the test fails if it is
  // refused) and watches it.
  std::shared_ptr<ProgressLog> Save(Rank& rank, const std::string& checkpoint);

  // Keeps every worker busy until ReleaseWorkers: parts submitted meanwhile
  // wait in the queue.
  void HoldWorkers();
  void ReleaseWorkers();
  // Stops the coordinator's commit watcher (it posts to the workers), then
  // finishes every queued task, the removal of a failed save's files
  // included, and joins the workers. The coordinator posts nothing more
  // afterwards only if no save is left in flight.
  void StopWorkers();

  SaveCoordinator& coordinator() { return *coordinator_; }
  const CheckpointStore& store() const { return store_; }
  const StagingPool& pool() const { return *pool_; }
  const MemoryTier& tier() const { return tier_; }
  // Read them only after StopWorkers.
  const std::vector<std::unique_ptr<FaultInjectingQueue>>& queues() const {
    return queues_;
  }

 private:
  const std::string root_;
  const SaveHarnessOptions options_;
  std::unique_ptr<StagingPool> pool_;
  std::vector<std::unique_ptr<FaultInjectingQueue>> queues_;
  CheckpointStore store_;
  CheckpointLeases leases_;
  MemoryTier tier_;
  std::deque<Rank> ranks_;
  std::shared_ptr<absl::Notification> gate_;  // set while workers are held
  std::unique_ptr<IoWorkers> workers_;
  std::unique_ptr<SaveCoordinator> coordinator_;
};

// Every path under `root`, relative to it, sorted: what a save left there.
std::vector<std::string> PathsUnder(const std::string& root);

}  // namespace ckpt::testing

// Loader: restores committed checkpoints into sessions' registered memory,
// resharding to whatever boxes the ranks ask for.
//
// A round holds a lease on its checkpoint while it reads (so retention
// cannot delete it underneath). Requests for the same checkpoint from a
// node's ranks are gathered into a round, which starts once every local rank of the job has asked or
// load_batch_ms after the first request. A round resolves the checkpoint
// once (COMMIT or LATEST), plans each request by intersecting its
// destination boxes with the stored chunks of the same fqn (common/box.h),
// and merges the plans: every stored chunk any rank needs becomes one
// ItemRead whose deliveries fan out to all of them, so each byte is read from
// storage once per round. Data files are read in parallel on the I/O
// workers (ShardReader verifies every block before any byte of it reaches a
// rank's memory), from the in-memory tier where
// it holds the file; the last file to finish
// completes the requests. A request that is invalid, or whose file fails,
// fails alone; the others proceed.
//
// Thread-safety: Start may be called from any thread; `done` is called on a
// worker (or the batching thread).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckpt/v1/control.pb.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "restore/load_plan_budget.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/memory_tier.h"

namespace ckpt {

class Loader {
 public:
  using Done = std::function<void(absl::StatusOr<v1::LoadResponse>)>;

  // `plan_bytes`: the memory the plans of loads in flight may hold
  // (restore/load_plan_budget.h).
  Loader(std::chrono::milliseconds batch_window, const CheckpointStore* store,
         StagingPool* pool, IoWorkers* workers, CheckpointLeases* leases,
         const MemoryTier* tier, uint64_t plan_bytes);
  ~Loader();  // stops the batching thread; queued rounds still run

  // Queues the load; `done` receives the result.
  void Start(std::shared_ptr<Session> session, v1::LoadRequest request, Done done);

 private:
  struct Request {
    std::shared_ptr<Session> session;
    v1::LoadRequest request;
    Done done;
  };
  struct Round {
    std::vector<Request> requests;
    uint32_t local_ranks = 0;
    std::chrono::steady_clock::time_point deadline;
  };

  void Batch();
  void Launch(std::vector<Request> requests);

  // Loads of one checkpoint by this node's ranks are batched until every
  // local rank asked or this long after the first request.
  const std::chrono::milliseconds batch_window_;
  const CheckpointStore* const store_;
  StagingPool* const pool_;
  IoWorkers* const workers_;
  CheckpointLeases* const leases_;
  const MemoryTier* const tier_;
  const std::shared_ptr<LoadPlanBudget> plan_budget_;

  absl::Mutex mu_;
  absl::CondVar wake_;
  std::map<std::string, Round> rounds_ ABSL_GUARDED_BY(mu_);  // "job/checkpoint"
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread batcher_;
};

}  // namespace ckpt

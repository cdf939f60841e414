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
// A checkpoint committed only in the remote tier (storage/remote_tier.h:
// a node with an empty disk, or one whose local copy retention removed)
// is read from there: each data file a rank needs is fetched whole with
// ranged GETs, within the tier's fetch memory, and verified block by block
// like a file from storage. A round reads one checkpoint from one tier:
// never a mixture.
//
// Cancelling: each load writes through its LoadGate (restore/load_gate.h).
// CancelLoad closes the gate of a session's load and returns once no write
// of it is in progress; the load's call being cancelled closes it too. A
// cancelled load still finishes (CANCELLED) with its round; its deliveries
// are skipped, the other ranks' proceed.
//
// Thread-safety: Start and CancelLoad may be called from any thread; `done`
// is called on a worker (or the batching thread), after the load's last
// write.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <utility>
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
#include "restore/load_gate.h"
#include "restore/load_plan_budget.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/memory_tier.h"
#include "storage/remote_tier.h"

namespace ckpt {

class Loader {
 public:
  using Done = std::function<void(absl::StatusOr<v1::LoadResponse>)>;

  // `plan_bytes`: the memory the plans of loads in flight may hold
  // (restore/load_plan_budget.h).
  // With `remote` (null: none), a checkpoint committed in the remote tier
  // and not in the local root is read from there, and "latest" is the
  // newer of the two tiers' (it must outlive the loader).
  Loader(std::chrono::milliseconds batch_window, const CheckpointStore* store,
         StagingPool* pool, IoWorkers* workers, CheckpointLeases* leases,
         const MemoryTier* tier, uint64_t plan_bytes, const RemoteTier* remote = nullptr);
  ~Loader();  // stops the batching thread; queued rounds still run

  // Queues the load; `done` receives the result. `call_cancelled` (may be
  // empty) tells whether the caller gave up (its gRPC call was cancelled):
  // it must stay callable until `done` has run.
  void Start(std::shared_ptr<Session> session, v1::LoadRequest request, Done done,
             std::function<bool()> call_cancelled = {});

  // Cancels the loads `session` started with LoadRequest.load_id `load_id`:
  // returns how many there were, once none of them is writing into the
  // session's memory or will (0: none queued or running).
  uint32_t CancelLoad(const Session& session, uint64_t load_id);

  // The gates of loads in flight that carry a load_id, by session and id:
  // shared with each load's `done`, which removes its own.
  struct Gates {
    absl::Mutex mu;
    std::multimap<std::pair<const Session*, uint64_t>, std::shared_ptr<LoadGate>> by_load
        ABSL_GUARDED_BY(mu);
  };

 private:
  struct Request {
    std::shared_ptr<Session> session;
    v1::LoadRequest request;
    Done done;
    std::shared_ptr<LoadGate> gate;
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
  const RemoteTier* const remote_;
  const std::shared_ptr<LoadPlanBudget> plan_budget_;
  const std::shared_ptr<Gates> gates_ = std::make_shared<Gates>();

  absl::Mutex mu_;
  absl::CondVar wake_;
  std::map<std::string, Round> rounds_ ABSL_GUARDED_BY(mu_);  // "job/checkpoint"
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread batcher_;
};

}  // namespace ckpt

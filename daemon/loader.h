// Loader: restores a committed checkpoint into a session's registered memory.
//
// A load names destinations by (fqn, offsets) with their dtype and shapes;
// protocol v1 restores into the layout the checkpoint was saved from, so
// each destination must match one stored chunk exactly (shape or dtype
// disagreements and missing fqns are errors that name the fqn). The reads
// go through ShardReader, which verifies every block checksum before the
// load succeeds and can read sub-ranges of items, the building block for
// resharding.
//
// Thread-safety: Start may be called from any thread; the work runs on an
// I/O worker and `done` is called there.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "ckpt/v1/control.pb.h"
#include "daemon/checkpoint_store.h"
#include "daemon/daemon_options.h"
#include "daemon/io_workers.h"
#include "daemon/session.h"
#include "daemon/staging_pool.h"

namespace ckpt {

class Loader {
 public:
  using Done = std::function<void(absl::StatusOr<v1::LoadResponse>)>;

  Loader(const DaemonOptions& options, const CheckpointStore* store,
         StagingPool* pool, IoWorkers* workers)
      : options_(options), store_(store), pool_(pool), workers_(workers) {}

  // Queues the load; `done` receives the result.
  void Start(std::shared_ptr<Session> session, v1::LoadRequest request,
             Done done);

 private:
  absl::StatusOr<v1::LoadResponse> Run(Session& session,
                                       const v1::LoadRequest& request,
                                       IoQueue& queue);

  const DaemonOptions options_;
  const CheckpointStore* const store_;
  StagingPool* const pool_;
  IoWorkers* const workers_;
};

}  // namespace ckpt

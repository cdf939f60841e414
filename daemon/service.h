// CkptdService: the gRPC face of the daemon (callback API).
//
// Handlers validate, hand work to the SaveCoordinator / Loader and finish
// through a reactor; none of them waits for storage on a gRPC thread:
// Verify, ListCheckpoints, Inspect and CollectGarbage read or delete
// directories, so they run on an I/O worker and finish the call from there.
// (Save's one storage access is a stat for an existing COMMIT, so that a
// reused name is refused by the call itself.) absl::Status becomes
// grpc::Status only here (ToGrpcStatus).
//
// Ownership: borrows the components, which outlive the server; the I/O
// workers must outlive every call (the server shuts down first).
// Thread-safety: handlers run concurrently on gRPC threads; the service
// holds no state of its own besides the borrowed components.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "ckpt/v1/control.grpc.pb.h"
#include "daemon/daemon_options.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "restore/loader.h"
#include "save/save_coordinator.h"
#include "session/session.h"
#include "storage/checkpoint_store.h"
#include "storage/memory_tier.h"

namespace ckpt {

grpc::Status ToGrpcStatus(const absl::Status& status);

class CkptdService final : public v1::Ckptd::CallbackService {
 public:
  struct Components {
    const DaemonOptions* options;
    SessionRegistry* sessions;
    SaveCoordinator* saves;
    Loader* loader;
    const CheckpointStore* store;
    StagingPool* pool;
    IoWorkers* workers;
    const MemoryTier* tier;
    std::string io_backend;
    std::string gpu;  // GpuBackend::name()
  };
  explicit CkptdService(Components components) : c_(std::move(components)) {}

  grpc::ServerUnaryReactor* OpenSession(
      grpc::CallbackServerContext* context,
      const v1::OpenSessionRequest* request,
      v1::OpenSessionResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseRegions(
      grpc::CallbackServerContext* context,
      const v1::ReleaseRegionsRequest* request,
      v1::ReleaseRegionsResponse* response) override;
  grpc::ServerUnaryReactor* RegisterRegions(
      grpc::CallbackServerContext* context,
      const v1::RegisterRegionsRequest* request,
      v1::RegisterRegionsResponse* response) override;
  grpc::ServerUnaryReactor* DefineLayout(
      grpc::CallbackServerContext* context,
      const v1::DefineLayoutRequest* request,
      v1::DefineLayoutResponse* response) override;
  grpc::ServerUnaryReactor* Save(grpc::CallbackServerContext* context,
                                 const v1::SaveRequest* request,
                                 v1::SaveResponse* response) override;
  grpc::ServerWriteReactor<v1::SaveProgress>* WatchSave(
      grpc::CallbackServerContext* context,
      const v1::WatchSaveRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;
  grpc::ServerUnaryReactor* Load(grpc::CallbackServerContext* context,
                                 const v1::LoadRequest* request,
                                 v1::LoadResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* context,
      const v1::ListCheckpointsRequest* request,
      v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* DaemonStatus(
      grpc::CallbackServerContext* context,
      const v1::DaemonStatusRequest* request,
      v1::DaemonStatusResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* Inspect(grpc::CallbackServerContext* context,
                                    const v1::InspectRequest* request,
                                    v1::InspectResponse* response) override;
  grpc::ServerUnaryReactor* CollectGarbage(
      grpc::CallbackServerContext* context,
      const v1::CollectGarbageRequest* request,
      v1::CollectGarbageResponse* response) override;

 private:
  const Components c_;
};

}  // namespace ckpt

// CkptdService: the gRPC face of the daemon (callback API).
//
// Every call first learns who made it (the credentials of its connection,
// daemon/connection_listener.h) and is checked against the access policy
// (daemon/access_policy.h): a session token only from its own process,
// jobs only by their owner or an operator.
//
// Handlers validate, hand work to the SaveCoordinator / Loader and finish
// through a reactor; none of them waits for storage on a gRPC thread:
// Verify, ListCheckpoints, Inspect, LoadByteItems and CollectGarbage read
// or delete directories and files, so they run on an I/O worker and finish
// the call from there. Inspect and Load answer in pages where the reply
// could pass the message limit (daemon/response_pages.h).
// (Save's storage accesses are a stat of the job directory for its owner
// and one for an existing COMMIT, so that a foreign job or a reused name is
// refused by the call itself; Load and Verify stat the job directory too.)
// absl::Status becomes grpc::Status only here (ToGrpcStatus).
//
// Ownership: borrows the components, which outlive the server; the I/O
// workers must outlive every call (the server shuts down first).
// Thread-safety: handlers run concurrently on gRPC threads; the service
// holds no state of its own besides the borrowed components (its message
// allocators are stateless).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "ckpt/v1/control.grpc.pb.h"
#include "daemon/access_policy.h"
#include "storage/startup_recovery.h"
#include "daemon/connection_listener.h"
#include "daemon/daemon_options.h"
#include "daemon/trimming_message_allocator.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "restore/loader.h"
#include "save/save_coordinator.h"
#include "session/abandoned_copies.h"
#include "storage/remote_tier.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
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
    // Verify's read lease, so retention does not delete what it checks.
    CheckpointLeases* leases = nullptr;
    // Who is calling (each call's connection) and what they may do.
    ConnectionListener* connections = nullptr;
    const AccessPolicy* policy = nullptr;
    // What startup recovery did, for DaemonStatus (ckptctl status).
    const StartupRecovery* recovery = nullptr;
    // Saves' GPU copies that outlived them (DaemonStatus).
    const AbandonedCopies* abandoned_copies = nullptr;
    // The remote tier's uploads (DaemonStatus); null without --remote.
    const RemoteTier* remote = nullptr;
  };
  explicit CkptdService(Components components) : c_(std::move(components)) {
    // The calls whose requests may carry up to --max_items_per_save items
    // give their memory back once done (trimming_message_allocator.h).
    SetMessageAllocatorFor_DefineLayout(&define_layout_messages_);
    SetMessageAllocatorFor_Save(&save_messages_);
  }

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
  grpc::ServerUnaryReactor* LoadByteItems(
      grpc::CallbackServerContext* context, const v1::LoadByteItemsRequest* request,
      v1::LoadByteItemsResponse* response) override;
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
  // The caller of `context`'s call, or why it has none.
  absl::StatusOr<Caller> CallerOf(const grpc::CallbackServerContext& context) const;
  // OK if `caller` may run operator call `what` on `job`.
  absl::Status MayOperate(const Caller& caller, absl::string_view what,
                          absl::string_view job) const;

  const Components c_;
  // Registered with gRPC above: they outlive the server, as the service
  // does.
  TrimmingMessageAllocator<v1::DefineLayoutRequest, v1::DefineLayoutResponse>
      define_layout_messages_;
  TrimmingMessageAllocator<v1::SaveRequest, v1::SaveResponse> save_messages_;
};

}  // namespace ckpt

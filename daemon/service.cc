#include "daemon/service.h"

#include <unistd.h>

#include <atomic>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "restore/verifier.h"
#include "save/save_plan.h"
#include "storage/durable_file.h"

namespace ckpt {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// VmHWM of this process, in bytes; 0 if /proc cannot be read.
uint64_t PeakRssBytes() {
  auto status = ReadSmallFile("/proc/self/status");
  if (!status.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmHWM:")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, " kB");
    uint64_t kb = 0;
    if (absl::SimpleAtoi(line, &kb)) return kb * 1024;
  }
  return 0;
}

// Streams a save's progress: one message per published version, until a
// final phase. The coordinator calls back when a newer version exists, so
// no thread waits; `mu_` orders those callbacks against Finish and OnDone.
class WatchReactor final : public grpc::ServerWriteReactor<v1::SaveProgress> {
 public:
  WatchReactor(SaveCoordinator* saves, std::shared_ptr<Session> session,
               uint64_t save_id)
      : saves_(saves), session_(std::move(session)), save_id_(save_id) {
    Next(0);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
    if (final_) return FinishOnce(grpc::Status::OK);
    Next(version_);
  }
  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }
  void OnDone() override {
    {
      std::lock_guard lock(*mu_);
      *alive_ = false;
    }
    delete this;
  }

 private:
  void Next(uint64_t after) {
    auto mu = mu_;
    auto alive = alive_;
    absl::Status status = saves_->WatchNext(
        *session_, save_id_, after,
        [this, mu, alive](const v1::SaveProgress& progress, uint64_t version) {
          std::lock_guard lock(*mu);
          if (!*alive || finished_) return;
          message_ = progress;
          version_ = version;
          final_ = progress.phase() == v1::PHASE_COMMITTED ||
                   progress.phase() == v1::PHASE_FAILED ||
                   progress.phase() == v1::PHASE_CANCELLED;
          StartWrite(&message_);
        });
    if (!status.ok()) FinishOnce(ToGrpcStatus(status));
  }
  void FinishOnce(const grpc::Status& status) {
    std::lock_guard lock(*mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  SaveCoordinator* const saves_;
  const std::shared_ptr<Session> session_;
  const uint64_t save_id_;
  // Shared with pending callbacks, which may outlive the reactor.
  const std::shared_ptr<std::recursive_mutex> mu_ = std::make_shared<std::recursive_mutex>();
  const std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  bool finished_ = false;  // guarded by *mu_
  bool final_ = false;
  uint64_t version_ = 0;
  v1::SaveProgress message_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::ServerUnaryReactor* CkptdService::OpenSession(
    grpc::CallbackServerContext* context, const v1::OpenSessionRequest* request,
    v1::OpenSessionResponse* response) {
  auto session = c_.sessions->Find(request->session_token());
  if (!session.ok()) return Finish(context, session.status());
  absl::Status status =
      (*session)->Open(*request, c_.options->node_id, c_.options->nodes);
  if (status.ok()) {
    response->set_session_id((*session)->id());
    response->set_daemon_pid(static_cast<uint32_t>(::getpid()));
    response->set_staging_pool_bytes(c_.pool->pool_bytes());
  }
  return Finish(context, status);
}

grpc::ServerUnaryReactor* CkptdService::RegisterRegions(
    grpc::CallbackServerContext* context,
    const v1::RegisterRegionsRequest* request,
    v1::RegisterRegionsResponse* response) {
  auto session = c_.sessions->Find(request->session_token());
  if (!session.ok()) return Finish(context, session.status());
  auto ids = (*session)->RegisterRegions(request->regions());
  if (!ids.ok()) return Finish(context, ids.status());
  for (uint64_t id : *ids) response->add_region_ids(id);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CkptdService::ReleaseRegions(
    grpc::CallbackServerContext* context,
    const v1::ReleaseRegionsRequest* request, v1::ReleaseRegionsResponse*) {
  auto session = c_.sessions->Find(request->session_token());
  if (!session.ok()) return Finish(context, session.status());
  return Finish(context, (*session)->ReleaseRegions(request->region_ids()));
}

grpc::ServerUnaryReactor* CkptdService::DefineLayout(
    grpc::CallbackServerContext* context, const v1::DefineLayoutRequest* request,
    v1::DefineLayoutResponse* response) {
  auto session = c_.sessions->Find(request->session_token());
  if (!session.ok()) return Finish(context, session.status());
  auto layout = PlanTensorLayout(**session, request->tensors(),
                                 c_.options->max_items_per_save);
  if (!layout.ok()) return Finish(context, layout.status());
  auto id = (*session)->AddLayout(*std::move(layout));
  if (id.ok()) response->set_layout_id(*id);
  return Finish(context, id.status());
}

grpc::ServerUnaryReactor* CkptdService::Save(grpc::CallbackServerContext* context,
                                             const v1::SaveRequest* request,
                                             v1::SaveResponse* response) {
  auto session = c_.sessions->Find(request->session_token());
  if (!session.ok()) return Finish(context, session.status());
  auto id = c_.saves->Submit(*session, *request);
  if (id.ok()) response->set_save_id(*id);
  return Finish(context, id.status());
}

grpc::ServerWriteReactor<v1::SaveProgress>* CkptdService::WatchSave(
    grpc::CallbackServerContext* /*context*/, const v1::WatchSaveRequest* request) {
  auto session = c_.sessions->Find(request->session_token());
  if (!session.ok()) {
    // A reactor that finishes at once with the error.
    class Failed final : public grpc::ServerWriteReactor<v1::SaveProgress> {
     public:
      explicit Failed(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Failed(session.status());
  }
  return new WatchReactor(c_.saves, *session, request->save_id());
}

grpc::ServerUnaryReactor* CkptdService::Cancel(grpc::CallbackServerContext* context,
                                               const v1::CancelRequest* request,
                                               v1::CancelResponse* response) {
  absl::StatusOr<uint32_t> n;
  if (!request->session_token().empty()) {
    auto session = c_.sessions->Find(request->session_token());
    if (!session.ok()) return Finish(context, session.status());
    n = c_.saves->CancelSave(**session, request->save_id());
  } else {
    n = c_.saves->CancelCheckpoint(request->job(), request->checkpoint());
  }
  if (n.ok()) response->set_cancelled_saves(*n);
  return Finish(context, n.status());
}

grpc::ServerUnaryReactor* CkptdService::Load(grpc::CallbackServerContext* context,
                                             const v1::LoadRequest* request,
                                             v1::LoadResponse* response) {
  auto session = c_.sessions->Find(request->session_token());
  if (!session.ok()) return Finish(context, session.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  c_.loader->Start(*session, *request,
                   [reactor, response](absl::StatusOr<v1::LoadResponse> result) {
                     if (result.ok()) *response = *std::move(result);
                     reactor->Finish(ToGrpcStatus(result.status()));
                   });
  return reactor;
}

grpc::ServerUnaryReactor* CkptdService::ListCheckpoints(
    grpc::CallbackServerContext* context,
    const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  auto list = c_.store->List(request->job());
  if (!list.ok()) return Finish(context, list.status());
  for (auto& info : *list) *response->add_checkpoints() = std::move(info);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CkptdService::DaemonStatus(
    grpc::CallbackServerContext* context, const v1::DaemonStatusRequest*,
    v1::DaemonStatusResponse* response) {
  response->set_pid(static_cast<uint32_t>(::getpid()));
  response->set_version(CKPT_VERSION);
  response->set_root(c_.store->root());
  response->set_io_backend(c_.io_backend);
  response->set_staging_pool_bytes(c_.pool->pool_bytes());
  response->set_staging_pool_free_bytes(c_.pool->free_bytes());
  response->set_peak_rss_bytes(PeakRssBytes());
  response->set_sessions(c_.sessions->size());
  for (auto& p : c_.saves->InFlight()) *response->add_saves() = std::move(p);
  response->set_now_unix_micros(absl::ToUnixMicros(absl::Now()));
  response->set_node_id(c_.options->node_id);
  response->set_nodes(c_.options->nodes);
  response->set_tensor_bytes_written(c_.saves->tensor_bytes_written());
  response->set_memory_tier_bytes(c_.tier->used_bytes());
  response->set_gpu(c_.gpu);
  response->set_gpu_regions(static_cast<uint32_t>(c_.sessions->gpu_regions()));
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CkptdService::Verify(grpc::CallbackServerContext* context,
                                               const v1::VerifyRequest* request,
                                               v1::VerifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  VerifyCheckpoint(c_.store, c_.pool, c_.workers, request->job(), request->checkpoint(),
                   [reactor, response](absl::StatusOr<v1::VerifyResponse> result) {
                     if (result.ok()) *response = *std::move(result);
                     reactor->Finish(ToGrpcStatus(result.status()));
                   });
  return reactor;
}

grpc::ServerUnaryReactor* CkptdService::Inspect(grpc::CallbackServerContext* context,
                                                const v1::InspectRequest* request,
                                                v1::InspectResponse* response) {
  auto record = c_.store->ReadCommit(
      request->job(), request->checkpoint().empty() ? kLatestAlias : request->checkpoint());
  if (record.ok()) *response->mutable_record() = *std::move(record);
  return Finish(context, record.status());
}

grpc::ServerUnaryReactor* CkptdService::CollectGarbage(
    grpc::CallbackServerContext* context, const v1::CollectGarbageRequest* request,
    v1::CollectGarbageResponse* response) {
  auto removed = c_.saves->CollectGarbage(request->job());
  if (removed.ok()) {
    for (const std::string& r : *removed) response->add_removed(r);
  }
  return Finish(context, removed.status());
}

}  // namespace ckpt

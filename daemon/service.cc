#include "daemon/service.h"

#include <unistd.h>

#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/save_phase.h"
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

// The one session lookup of the handlers that act for a trainer: runs
// `handle` with the request's session, or finishes the call with why there
// is none (an unknown or closed token).
template <typename Request, typename Handle>
grpc::ServerUnaryReactor* WithSession(SessionRegistry& sessions,
                                      grpc::CallbackServerContext* context,
                                      const Request& request, Handle handle) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions.Find(request.session_token());
  if (!session.ok()) return Finish(context, session.status());
  return handle(*session);
}

// Runs `work` on an I/O worker and finishes the call there with its status:
// for handlers that read or delete directories, which may wait on storage
// and so must not run on a gRPC thread. The request and response stay
// valid until the call finishes.
grpc::ServerUnaryReactor* FinishOnIoWorker(IoWorkers* workers,
                                           grpc::CallbackServerContext* context,
                                           std::function<absl::Status()> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  workers->Post([reactor, work = std::move(work)](IoQueue&) {
    reactor->Finish(ToGrpcStatus(work()));
  });
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
// no thread waits. The callback may come after the reactor is gone (OnDone
// deletes it), so what it touches lives in a State shared with it; the
// State's lock orders callbacks against Finish and OnDone.
//
// Holding the lock across StartWrite and Finish is safe: gRPC runs no
// reaction inline in them (OnWriteDone and OnDone are always dispatched to
// another thread), so nothing re-enters this lock.
class WatchReactor final : public grpc::ServerWriteReactor<v1::SaveProgress> {
 public:
  WatchReactor(SaveCoordinator* saves, std::shared_ptr<Session> session,
               uint64_t save_id)
      : saves_(saves), session_(std::move(session)), save_id_(save_id) {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = this;
    }
    Next(0);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
      return;
    }
    uint64_t version = 0;
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->final) {
        FinishLocked(grpc::Status::OK);
        return;
      }
      version = state_->version;
    }
    Next(version);
  }
  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct State {
    absl::Mutex mu;
    WatchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;  // null after OnDone
    bool finished ABSL_GUARDED_BY(mu) = false;
    bool final ABSL_GUARDED_BY(mu) = false;  // the message written is the last
    uint64_t version ABSL_GUARDED_BY(mu) = 0;
    // Written only between writes: gRPC reads it until OnWriteDone.
    v1::SaveProgress message ABSL_GUARDED_BY(mu);
  };

  void Next(uint64_t after) {
    absl::Status status = saves_->WatchNext(
        *session_, save_id_, after,
        [state = state_](const v1::SaveProgress& progress, uint64_t version) {
          absl::MutexLock lock(&state->mu);
          if (state->reactor == nullptr || state->finished) return;
          state->message = progress;
          state->version = version;
          state->final = IsFinalPhase(progress.phase());
          state->reactor->StartWrite(&state->message);
        });
    if (!status.ok()) FinishOnce(ToGrpcStatus(status));
  }
  void FinishOnce(const grpc::Status& status) {
    absl::MutexLock lock(&state_->mu);
    FinishLocked(status);
  }
  void FinishLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (state_->finished) return;
    state_->finished = true;
    Finish(status);
  }

  SaveCoordinator* const saves_;
  const std::shared_ptr<Session> session_;
  const uint64_t save_id_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
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
  return WithSession(
      *c_.sessions, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        absl::Status status =
            session->Open(*request, c_.options->node_id, c_.options->nodes);
        if (status.ok()) {
          response->set_session_id(session->id());
          response->set_daemon_pid(static_cast<uint32_t>(::getpid()));
          response->set_staging_pool_bytes(c_.pool->pool_bytes());
        }
        return Finish(context, status);
      });
}

grpc::ServerUnaryReactor* CkptdService::RegisterRegions(
    grpc::CallbackServerContext* context,
    const v1::RegisterRegionsRequest* request,
    v1::RegisterRegionsResponse* response) {
  return WithSession(*c_.sessions, context, *request,
                     [&](const std::shared_ptr<Session>& session) {
                       auto ids = session->RegisterRegions(request->regions());
                       if (!ids.ok()) return Finish(context, ids.status());
                       for (uint64_t id : *ids) response->add_region_ids(id);
                       return Finish(context, absl::OkStatus());
                     });
}

grpc::ServerUnaryReactor* CkptdService::ReleaseRegions(
    grpc::CallbackServerContext* context,
    const v1::ReleaseRegionsRequest* request, v1::ReleaseRegionsResponse*) {
  return WithSession(
      *c_.sessions, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        return Finish(context, session->ReleaseRegions(request->region_ids()));
      });
}

grpc::ServerUnaryReactor* CkptdService::DefineLayout(
    grpc::CallbackServerContext* context,
    const v1::DefineLayoutRequest* request,
    v1::DefineLayoutResponse* response) {
  return WithSession(*c_.sessions, context, *request,
                     [&](const std::shared_ptr<Session>& session) {
                       auto layout =
                           PlanTensorLayout(*session, request->tensors(),
                                            c_.options->max_items_per_save);
                       if (!layout.ok()) {
                         return Finish(context, layout.status());
                       }
                       auto id = session->AddLayout(*std::move(layout));
                       if (id.ok()) response->set_layout_id(*id);
                       return Finish(context, id.status());
                     });
}

grpc::ServerUnaryReactor* CkptdService::Save(
    grpc::CallbackServerContext* context, const v1::SaveRequest* request,
    v1::SaveResponse* response) {
  return WithSession(*c_.sessions, context, *request,
                     [&](const std::shared_ptr<Session>& session) {
                       auto id = c_.saves->Submit(session, *request);
                       if (id.ok()) response->set_save_id(*id);
                       return Finish(context, id.status());
                     });
}

grpc::ServerWriteReactor<v1::SaveProgress>* CkptdService::WatchSave(
    grpc::CallbackServerContext* /*context*/,
    const v1::WatchSaveRequest* request) {
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

grpc::ServerUnaryReactor* CkptdService::Cancel(
    grpc::CallbackServerContext* context, const v1::CancelRequest* request,
    v1::CancelResponse* response) {
  auto finish = [&](const absl::StatusOr<uint32_t>& cancelled) {
    if (cancelled.ok()) response->set_cancelled_saves(*cancelled);
    return Finish(context, cancelled.status());
  };
  if (request->session_token().empty()) {
    return finish(
        c_.saves->CancelCheckpoint(request->job(), request->checkpoint()));
  }
  return WithSession(
      *c_.sessions, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        return finish(c_.saves->CancelSave(*session, request->save_id()));
      });
}

grpc::ServerUnaryReactor* CkptdService::Load(
    grpc::CallbackServerContext* context, const v1::LoadRequest* request,
    v1::LoadResponse* response) {
  return WithSession(
      *c_.sessions, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
        c_.loader->Start(
            session, *request,
            [reactor, response](absl::StatusOr<v1::LoadResponse> result) {
              if (result.ok()) *response = *std::move(result);
              reactor->Finish(ToGrpcStatus(result.status()));
            });
        return reactor;
      });
}

grpc::ServerUnaryReactor* CkptdService::ListCheckpoints(
    grpc::CallbackServerContext* context,
    const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return FinishOnIoWorker(
      c_.workers, context,
      [store = c_.store, request, response]() -> absl::Status {
        ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> list,
                         store->List(request->job()));
        for (auto& info : list) *response->add_checkpoints() = std::move(info);
        return absl::OkStatus();
      });
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

grpc::ServerUnaryReactor* CkptdService::Verify(
    grpc::CallbackServerContext* context, const v1::VerifyRequest* request,
    v1::VerifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  VerifyCheckpoint(
      c_.store, c_.pool, c_.workers, request->job(), request->checkpoint(),
      [reactor, response](absl::StatusOr<v1::VerifyResponse> result) {
        if (result.ok()) *response = *std::move(result);
        reactor->Finish(ToGrpcStatus(result.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* CkptdService::Inspect(
    grpc::CallbackServerContext* context, const v1::InspectRequest* request,
    v1::InspectResponse* response) {
  return FinishOnIoWorker(
      c_.workers, context,
      [store = c_.store, request, response]() -> absl::Status {
        ASSIGN_OR_RETURN(
            *response->mutable_record(),
            store->ReadCommit(request->job(), request->checkpoint().empty()
                                                  ? kLatestAlias
                                                  : request->checkpoint()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CkptdService::CollectGarbage(
    grpc::CallbackServerContext* context,
    const v1::CollectGarbageRequest* request,
    v1::CollectGarbageResponse* response) {
  return FinishOnIoWorker(
      c_.workers, context,
      [saves = c_.saves, request, response]() -> absl::Status {
        ASSIGN_OR_RETURN(GarbageCollection gc, saves->CollectGarbage(request->job()));
        for (const std::string& r : gc.removed) response->add_removed(r);
        for (const std::string& l : gc.left) response->add_left(l);
        return absl::OkStatus();
      });
}

}  // namespace ckpt

#include "daemon/service.h"

#include <unistd.h>

#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/names.h"
#include "common/save_phase.h"
#include "common/status.h"
#include "daemon/checkpoint_locations.h"
#include "daemon/response_pages.h"
#include "restore/verifier.h"
#include "save/save_plan.h"
#include "session/layout_bytes.h"
#include "storage/durable_file.h"
#include "storage/job_ownership.h"

namespace ckpt {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The request's session, if the call comes from the session's own process
// (the token alone is not enough: daemon/access_policy.h).
absl::StatusOr<std::shared_ptr<Session>> FindSession(
    const CkptdService::Components& c, const grpc::CallbackServerContext& context,
    const std::string& token) {
  ASSIGN_OR_RETURN(const Caller caller, c.connections->CallerOf(context.peer()));
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, c.sessions->Find(token));
  RETURN_IF_ERROR(AccessPolicy::MayActFor(caller, session->pid()));
  return session;
}

// The one session lookup of the handlers that act for a trainer: runs
// `handle` with the request's session, or finishes the call with why there
// is none (an unknown or closed token, another process's token).
template <typename Request, typename Handle>
grpc::ServerUnaryReactor* WithSession(const CkptdService::Components& c,
                                      grpc::CallbackServerContext* context,
                                      const Request& request, Handle handle) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      FindSession(c, *context, request.session_token());
  if (!session.ok()) return Finish(context, session.status());
  // Whatever the handler logs names the trainer.
  const ScopedLogFields trainer((*session)->log_fields());
  return handle(*session);
}

// Which jobs a listing shows its caller: every job to an operator, only
// their own to anyone else (one stat per distinct job).
class VisibleJobs {
 public:
  VisibleJobs(const CheckpointStore& store, const AccessPolicy& policy,
              const Caller& caller)
      : store_(store), caller_(caller), all_(policy.IsOperator(caller)) {}

  bool Shows(const std::string& job) {
    if (all_) return true;
    auto [it, inserted] = shows_.try_emplace(job, false);
    if (inserted) {
      absl::StatusOr<std::optional<uid_t>> owner = JobOwner(store_, job);
      it->second = owner.ok() && owner->has_value() && **owner == caller_.uid;
    }
    return it->second;
  }

 private:
  const CheckpointStore& store_;
  const Caller caller_;
  const bool all_;
  absl::flat_hash_map<std::string, bool> shows_;
};

// The job a startup recovery line names: its text up to the first '/' or
// ':' ("job/step-2/COMMIT.tmp...", "job: step-1 -> step-2").
std::string JobOfRecoveryLine(absl::string_view line) {
  return std::string(line.substr(0, line.find_first_of("/:")));
}

// `recovery`'s lines of the jobs `visible` shows.
void ReportRecovery(const StartupRecovery& recovery, VisibleJobs& visible,
                    v1::StartupRecoveryReport* report) {
  auto add = [&](const std::vector<std::string>& lines,
                 google::protobuf::RepeatedPtrField<std::string>* into) {
    for (const std::string& line : lines) {
      if (visible.Shows(JobOfRecoveryLine(line))) *into->Add() = line;
    }
  };
  add(recovery.temporaries_removed, report->mutable_temporaries_removed());
  add(recovery.checkpoints_removed, report->mutable_checkpoints_removed());
  // The report has no field of its own for them: an empty directory left
  // by a save that died before its marker is an uncommitted checkpoint
  // removed whole.
  add(recovery.empty_directories_removed, report->mutable_checkpoints_removed());
  add(recovery.parts_removed, report->mutable_parts_removed());
  add(recovery.latest_repaired, report->mutable_latest_repaired());
  add(recovery.left, report->mutable_left());
  add(recovery.errors, report->mutable_errors());
}

// OK if `session` may save into or load from `job` (its owner's, or root's).
absl::Status MayUseJob(const CheckpointStore& store, const Session& session,
                       const std::string& job) {
  ASSIGN_OR_RETURN(std::optional<uid_t> owner, JobOwner(store, job));
  return AccessPolicy::MayUseJob(session.uid(), job, owner);
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

// One line per load, as it is answered.
void LogLoad(LogFields fields, const absl::StatusOr<v1::LoadResponse>& result,
             absl::Duration took) {
  fields.Set("elapsed_ms", absl::ToInt64Milliseconds(took));
  if (!result.ok()) {
    LogWarning(fields, "load failed: ", result.status().ToString());
    return;
  }
  // "latest" resolved: the line names what was loaded.
  fields.Checkpoint(result->checkpoint())
      .Set("source", result->source())
      .Set("bytes_read", result->bytes_read())
      .Set("missing", result->missing_size());
  LogInfo(fields, "loaded");
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
// final phase; with follow_remote, past COMMITTED until the remote phase
// begun with it ends (common/save_phase.h). The coordinator calls back
// when a newer version exists, so no thread waits. The callback may come
// after the reactor is gone (OnDone deletes it), so what it touches lives
// in a State shared with it; the State's lock orders callbacks against
// Finish and OnDone.
//
// Holding the lock across StartWrite and Finish is safe: gRPC runs no
// reaction inline in them (OnWriteDone and OnDone are always dispatched to
// another thread), so nothing re-enters this lock.
class WatchReactor final : public grpc::ServerWriteReactor<v1::SaveProgress> {
 public:
  WatchReactor(SaveCoordinator* saves, std::shared_ptr<Session> session,
               uint64_t save_id, bool follow_remote)
      : saves_(saves),
        session_(std::move(session)),
        save_id_(save_id),
        follow_remote_(follow_remote) {
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
        [state = state_, follow_remote = follow_remote_](const v1::SaveProgress& progress,
                                                         uint64_t version) {
          absl::MutexLock lock(&state->mu);
          if (state->reactor == nullptr || state->finished) return;
          state->message = progress;
          state->version = version;
          state->final = IsFinalPhase(progress.phase()) &&
                         !(follow_remote && RemotePhasePending(progress));
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
  const bool follow_remote_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Every call that ends in an error passes here once: the errors by kind.
  DaemonMetrics::Get().CountError(status);
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::StatusOr<Caller> CkptdService::CallerOf(
    const grpc::CallbackServerContext& context) const {
  return c_.connections->CallerOf(context.peer());
}

absl::Status CkptdService::MayOperate(const Caller& caller, absl::string_view what,
                                      absl::string_view job) const {
  ASSIGN_OR_RETURN(std::optional<uid_t> owner, JobOwner(*c_.store, job));
  return c_.policy->MayOperate(caller, what, job, owner);
}

grpc::ServerUnaryReactor* CkptdService::OpenSession(
    grpc::CallbackServerContext* context, const v1::OpenSessionRequest* request,
    v1::OpenSessionResponse* response) {
  // A drain (daemon/save_drain.h) takes no new trainer: it could only
  // start saves that the stop cancels.
  if (!c_.saves->accepting()) {
    return Finish(context, absl::UnavailableError("ckptd is stopping"));
  }
  return WithSession(
      c_, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        // Another user's session must not join a job: its hang-up would
        // fail the job's in-flight checkpoint. The job's owner decides
        // where it has a directory, its open sessions' user before that.
        absl::Status status = MayUseJob(*c_.store, *session, request->job());
        if (status.ok()) {
          status = c_.saves->OpenSession(session, *request, c_.options->node_id,
                                         c_.options->nodes);
        }
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
  return WithSession(c_, context, *request,
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
      c_, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        return Finish(context, session->ReleaseRegions(request->region_ids()));
      });
}

grpc::ServerUnaryReactor* CkptdService::DefineLayout(
    grpc::CallbackServerContext* context,
    const v1::DefineLayoutRequest* request,
    v1::DefineLayoutResponse* response) {
  return WithSession(
      c_, context, *request, [&](const std::shared_ptr<Session>& session) {
        // Bounded before anything is built: its item count, then an upper
        // bound of what the layout will hold (one pass over the request,
        // no allocation), reserved from the session's and the daemon's
        // layout budget. A layout that cannot fit is refused without being
        // built, and a build in flight counts against the budget until
        // AddLayout charges its real size instead.
        const size_t items = static_cast<size_t>(request->tensors_size());
        absl::Status status =
            CheckTensorItemCount(items, c_.options->max_items_per_save);
        if (!status.ok()) return Finish(context, status);
        const uint64_t bound = LayoutBytesBound(request->tensors());
        absl::StatusOr<LayoutBudget::Charge> reserved =
            session->ReserveLayout(bound);
        if (!reserved.ok()) {
          return Finish(context,
                        Annotate(reserved.status(),
                                 absl::StrCat(items, " items")));
        }
        auto layout = PlanTensorLayout(*session, request->tensors(),
                                       c_.options->max_items_per_save);
        if (!layout.ok()) return Finish(context, layout.status());
        auto id = session->AddLayout(*std::move(layout), *std::move(reserved));
        if (id.ok()) response->set_layout_id(*id);
        return Finish(context, id.status());
      });
}

grpc::ServerUnaryReactor* CkptdService::Save(
    grpc::CallbackServerContext* context, const v1::SaveRequest* request,
    v1::SaveResponse* response) {
  const ScopedLatency handling(DaemonMetrics::Get().save_call_seconds);
  return WithSession(c_, context, *request,
                     [&](const std::shared_ptr<Session>& session) {
                       auto submit = [&]() -> absl::StatusOr<uint64_t> {
                         RETURN_IF_ERROR(
                             MayUseJob(*c_.store, *session, request->job()));
                         return c_.saves->Submit(session, *request, response);
                       };
                       const absl::StatusOr<uint64_t> id = submit();
                       if (id.ok()) {
                         response->set_save_id(*id);
                       } else {
                         // Accepted saves are logged with their phases
                         // (save/save_progress_board.cc).
                         LogInfo(LogFields()
                                     .Job(request->job())
                                     .Checkpoint(request->checkpoint()),
                                 "save refused: ", id.status().ToString());
                       }
                       return Finish(context, id.status());
                     });
}

grpc::ServerWriteReactor<v1::SaveProgress>* CkptdService::WatchSave(
    grpc::CallbackServerContext* context, const v1::WatchSaveRequest* request) {
  auto session = FindSession(c_, *context, request->session_token());
  if (!session.ok()) {
    // A reactor that finishes at once with the error.
    class Failed final : public grpc::ServerWriteReactor<v1::SaveProgress> {
     public:
      explicit Failed(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Failed(session.status());
  }
  return new WatchReactor(c_.saves, *session, request->save_id(), request->follow_remote());
}

grpc::ServerUnaryReactor* CkptdService::Cancel(
    grpc::CallbackServerContext* context, const v1::CancelRequest* request,
    v1::CancelResponse* response) {
  auto finish = [&](const absl::StatusOr<uint32_t>& cancelled) {
    if (cancelled.ok()) response->set_cancelled_saves(*cancelled);
    return Finish(context, cancelled.status());
  };
  if (request->session_token().empty()) {
    absl::StatusOr<Caller> caller = CallerOf(*context);
    if (!caller.ok()) return finish(caller.status());
    absl::Status allowed = MayOperate(*caller, "cancel", request->job());
    if (!allowed.ok()) return finish(allowed);
    return finish(
        c_.saves->CancelCheckpoint(request->job(), request->checkpoint()));
  }
  return WithSession(
      c_, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        if (request->load_id() != 0) {
          // Answered only once none of the load's writes is in progress
          // (Loader::CancelLoad): the client relies on it before it returns
          // to a trainer that may free the destination memory. It waits
          // here, on the gRPC thread, for at most one slice's write (a few
          // MiB): the I/O workers may all be busy with the very loads being
          // cancelled, so handing it to them could delay the answer.
          response->set_cancelled_loads(c_.loader->CancelLoad(*session, request->load_id()));
          return Finish(context, absl::OkStatus());
        }
        return finish(c_.saves->CancelSave(*session, request->save_id()));
      });
}

grpc::ServerUnaryReactor* CkptdService::Load(
    grpc::CallbackServerContext* context, const v1::LoadRequest* request,
    v1::LoadResponse* response) {
  return WithSession(
      c_, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        absl::Status allowed = MayUseJob(*c_.store, *session, request->job());
        if (!allowed.ok()) return Finish(context, allowed);
        grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
        LogFields fields = session->log_fields();
        fields.Job(request->job()).Checkpoint(request->checkpoint());
        c_.loader->Start(
            session, *request,
            [reactor, response, paged = request->page_byte_items(),
             max_bytes = c_.options->max_request_bytes, fields,
             started = absl::Now()](absl::StatusOr<v1::LoadResponse> result) {
              // Byte items past the message limit go in later pages
              // (daemon/response_pages.h).
              if (result.ok()) {
                absl::Status fits = FitLoadResponse(paged, max_bytes, &*result);
                if (!fits.ok()) result = fits;
              }
              LogLoad(fields, result, absl::Now() - started);
              if (result.ok()) *response = *std::move(result);
              reactor->Finish(ToGrpcStatus(result.status()));
            },
            // A client that gave up (cancelled, deadline, gone) gets no
            // more writes. The context lives until Finish, after `done`.
            [context] { return context->IsCancelled(); });
        return reactor;
      });
}

grpc::ServerUnaryReactor* CkptdService::LoadByteItems(
    grpc::CallbackServerContext* context, const v1::LoadByteItemsRequest* request,
    v1::LoadByteItemsResponse* response) {
  return WithSession(
      c_, context, *request,
      [&](const std::shared_ptr<Session>& session) {
        if (!session->opened()) {
          return Finish(context, absl::FailedPreconditionError(
                                     "call OpenSession before LoadByteItems"));
        }
        if (request->job() != session->job()) {
          return Finish(context, absl::InvalidArgumentError(absl::StrCat(
                                     "LoadByteItems names job '", request->job(),
                                     "' but the session is for job '",
                                     session->job(), "'")));
        }
        // A name, not "latest": the pages of one load must come from the
        // checkpoint it loaded, even if a newer one committed since.
        if (request->checkpoint() == kLatestAlias) {
          return Finish(context, absl::InvalidArgumentError(
                                     "LoadByteItems needs the checkpoint's name "
                                     "(LoadResponse.checkpoint), not 'latest'"));
        }
        absl::Status allowed = MayUseJob(*c_.store, *session, request->job());
        if (!allowed.ok()) return Finish(context, allowed);
        // Reads COMMIT: on an I/O worker, like Inspect.
        return FinishOnIoWorker(
            c_.workers, context,
            [store = c_.store, session, request, response,
             max_bytes = c_.options->max_request_bytes]() -> absl::Status {
              RETURN_IF_ERROR(ValidateStorageName(request->checkpoint(), "checkpoint"));
              ASSIGN_OR_RETURN(const v1::CommitRecord record,
                               store->ReadCommit(request->job(), request->checkpoint()));
              return FillByteItemsPage(record.index(), session->rank(),
                                       request->byte_items(), max_bytes, response);
            });
      });
}

grpc::ServerUnaryReactor* CkptdService::ListCheckpoints(
    grpc::CallbackServerContext* context,
    const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return Finish(context, caller.status());
  return FinishOnIoWorker(
      c_.workers, context,
      [this, caller = *std::move(caller), request, response]() -> absl::Status {
        if (!request->job().empty()) {
          RETURN_IF_ERROR(MayOperate(caller, "list", request->job()));
        }
        const std::string& only = request->checkpoint();
        if (!only.empty()) {
          if (request->job().empty()) {
            return absl::InvalidArgumentError("listing one checkpoint name needs its job");
          }
          RETURN_IF_ERROR(ValidateStorageName(only, "checkpoint"));
        }
        ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> list,
                         c_.store->List(request->job()));
        VisibleJobs visible(*c_.store, *c_.policy, caller);
        std::vector<v1::CheckpointInfo> shown;
        for (auto& info : list) {
          if (!visible.Shows(info.job())) continue;
          if (!only.empty() && !IsGenerationOf(info.checkpoint(), only)) continue;
          shown.push_back(std::move(info));
        }
        // Where each is; an unreachable remote tier leaves the rest whole.
        absl::Status remote = AddCheckpointLocations(
            c_.tier, c_.remote, request->job(), only,
            [&visible](const std::string& job) { return visible.Shows(job); }, &shown);
        if (!remote.ok()) response->set_remote_error(remote.ToString());
        for (auto& info : shown) *response->add_checkpoints() = std::move(info);
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
  response->set_staging_pool_unpinned(!c_.pool->pinned());
  response->set_peak_rss_bytes(PeakRssBytes());
  response->set_sessions(c_.sessions->size());
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return Finish(context, caller.status());
  // Saves in flight of other users' jobs are theirs to see, not the caller's.
  VisibleJobs visible(*c_.store, *c_.policy, *caller);
  for (auto& p : c_.saves->InFlight()) {
    if (visible.Shows(p.job())) *response->add_saves() = std::move(p);
  }
  response->set_now_unix_micros(absl::ToUnixMicros(absl::Now()));
  response->set_node_id(c_.options->node_id);
  response->set_nodes(c_.options->nodes);
  response->set_tensor_bytes_written(c_.saves->tensor_bytes_written());
  response->set_memory_tier_bytes(c_.tier->used_bytes());
  response->set_gpu(c_.gpu);
  response->set_gpu_regions(static_cast<uint32_t>(c_.sessions->gpu_regions()));
  response->set_staging_buffers_withheld(c_.pool->withheld_buffers());
  if (c_.abandoned_copies != nullptr) {
    response->set_gpu_saves_held(static_cast<uint32_t>(c_.abandoned_copies->pending()));
  }
  for (const std::shared_ptr<Session>& session : c_.sessions->PoolHolders()) {
    if (!visible.Shows(session->job())) continue;
    v1::StagingPoolHolder* holder = response->add_staging_pool_holders();
    holder->set_session_id(session->id());
    holder->set_job(session->job());
    holder->set_rank(session->rank());
    holder->set_pid(static_cast<uint32_t>(session->pid()));
    holder->set_buffers(static_cast<uint32_t>(session->pool_share()->held()));
    holder->set_limit_buffers(static_cast<uint32_t>(session->pool_share()->limit()));
  }
  if (c_.recovery != nullptr) {
    ReportRecovery(*c_.recovery, visible, response->mutable_startup_recovery());
  }
  if (c_.remote != nullptr) {
    response->set_remote(c_.remote->remote().Describe(""));
    DaemonMetrics& m = DaemonMetrics::Get();
    v1::RemoteTierCounters* counters = response->mutable_remote_counters();
    counters->set_uploaded_bytes(m.remote_uploaded_bytes.value());
    counters->set_committed(m.remote_uploads_committed.value());
    counters->set_failed(m.remote_uploads_failed.value());
    counters->set_retries(m.remote_retries.value());
    counters->set_deleted_committed(m.remote_deleted_committed.value());
    counters->set_deleted_remnants(m.remote_deleted_remnants.value());
    counters->set_backlog(static_cast<uint32_t>(c_.remote->Backlog()));
    counters->set_keep_last(c_.remote->keep_last());
    for (const RemoteProgress& p : c_.remote->Progress()) {
      if (!visible.Shows(p.job)) continue;
      FillRemoteUpload(p, response->add_remote_uploads());
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CkptdService::Verify(
    grpc::CallbackServerContext* context, const v1::VerifyRequest* request,
    v1::VerifyResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return Finish(context, caller.status());
  absl::Status allowed = MayOperate(*caller, "verify", request->job());
  if (!allowed.ok()) return Finish(context, allowed);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  VerifyCheckpoint(
      c_.store, c_.pool, c_.workers, c_.leases, request->job(),
      request->checkpoint(),
      [reactor, response](absl::StatusOr<v1::VerifyResponse> result) {
        if (result.ok()) *response = *std::move(result);
        reactor->Finish(ToGrpcStatus(result.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* CkptdService::Inspect(
    grpc::CallbackServerContext* context, const v1::InspectRequest* request,
    v1::InspectResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return Finish(context, caller.status());
  return FinishOnIoWorker(
      c_.workers, context,
      [this, caller = *std::move(caller), store = c_.store, request,
       response]() -> absl::Status {
        RETURN_IF_ERROR(MayOperate(caller, "inspect", request->job()));
        // Every page of a paged inspect is cut from the checkpoint the first
        // one resolved (daemon/response_pages.h).
        InspectPosition from;
        if (!request->page_token().empty()) {
          ASSIGN_OR_RETURN(from, ParseInspectPageToken(request->page_token()));
        } else if (request->checkpoint().empty() ||
                   request->checkpoint() == kLatestAlias) {
          ASSIGN_OR_RETURN(from.checkpoint, store->ResolveLatest(request->job()));
        } else {
          from.checkpoint = request->checkpoint();
        }
        ASSIGN_OR_RETURN(v1::CommitRecord record,
                         store->ReadCommit(request->job(), from.checkpoint));
        ASSIGN_OR_RETURN(*response,
                         InspectPage(std::move(record), from.checkpoint, request->paged(),
                                     from, c_.options->max_request_bytes));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CkptdService::CollectGarbage(
    grpc::CallbackServerContext* context,
    const v1::CollectGarbageRequest* request,
    v1::CollectGarbageResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return Finish(context, caller.status());
  return FinishOnIoWorker(
      c_.workers, context,
      [this, caller = *std::move(caller), saves = c_.saves, request,
       response]() -> absl::Status {
        RETURN_IF_ERROR(request->job().empty()
                            ? c_.policy->MayOperateOnAll(caller, "gc")
                            : MayOperate(caller, "gc", request->job()));
        ASSIGN_OR_RETURN(GarbageCollection gc, saves->CollectGarbage(request->job()));
        for (const std::string& r : gc.removed) response->add_removed(r);
        for (const std::string& l : gc.left) response->add_left(l);
        return absl::OkStatus();
      });
}

}  // namespace ckpt

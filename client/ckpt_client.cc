#include "client/ckpt_client.h"

#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/daemon_handshake.h"
#include "client/unary_call.h"
#include "common/handshake_frame.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"

namespace ckpt {
namespace {

// The staged record to wait for on each of `devices` (the save's GPU
// devices), when the stream wait alone orders the trainer's later writes
// after the save's reads: every tensor is in GPU memory or in a snapshot
// host region, and the daemon reserved exactly one record per device.
// Empty otherwise (the CPU waits).
std::vector<uint64_t> StreamWaitRecords(const v1::SaveResponse& response,
                                        const std::vector<std::string>& devices) {
  if (!response.stream_wait_suffices() || devices.empty()) return {};
  std::vector<uint64_t> records;
  for (const std::string& uuid : devices) {
    int found = 0;
    for (const v1::StagedRecord& r : response.staged_records()) {
      if (r.device_uuid() != uuid) continue;
      ++found;
      records.push_back(r.number());
    }
    if (found != 1) return {};
  }
  return records;
}

}  // namespace

std::shared_ptr<grpc::Channel> DaemonChannel(const std::string& socket,
                                           uint32_t keepalive_ms,
                                           uint32_t keepalive_timeout_ms) {
  grpc::ChannelArguments args;
  // Both limits are the daemon's ceiling: every request it may accept leaves
  // this end, and every response it may send arrives (control_socket.h).
  args.SetMaxReceiveMessageSize(kMaxControlMessageBytes);
  args.SetMaxSendMessageSize(kMaxControlMessageBytes);
  // Pings while a call is open, however long it waits without data (gRPC
  // stops after 2 pings without data unless told otherwise): a wait for
  // COMMITTED may see no message for minutes.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(keepalive_ms));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(keepalive_timeout_ms));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(absl::StrCat("unix:", socket),
                                   grpc::InsecureChannelCredentials(), args);
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ConnectOptions& options, CallCanceller* canceller) {
  if (options.keepalive_ms < kMinKeepaliveMs || options.keepalive_timeout_ms == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keepalive_ms ", options.keepalive_ms, " is below the daemon's floor of ",
        kMinKeepaliveMs, " ms, or keepalive_timeout_ms is 0"));
  }
  ASSIGN_OR_RETURN(UniqueFd fd,
                   DialHandshake(HandshakeSocketPath(options.socket), canceller));
  ASSIGN_OR_RETURN(HandshakeFrame frame, ReadHandshakeFrame(fd.get(), canceller));
  // Under Yama ptrace_scope=1 only a declared tracer may read our memory.
  // Without Yama the call fails with EINVAL, which is fine.
  if (::prctl(PR_SET_PTRACER, static_cast<unsigned long>(frame.daemon_pid), 0, 0, 0) != 0 &&
      errno != EINVAL) {
    return ErrnoToStatus(errno, "prctl(PR_SET_PTRACER)");
  }
  std::unique_ptr<Client> client(new Client(
      options, std::move(fd), std::move(frame.session_token),
      static_cast<uint32_t>(frame.daemon_pid),
      DaemonChannel(options.socket, options.keepalive_ms, options.keepalive_timeout_ms)));
  v1::OpenSessionRequest request;
  request.set_session_token(client->token_);
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  request.set_job(options.job);
  request.set_node(options.node);
  request.set_local_world_size(options.local_world_size);
  if (options.local_rank.has_value()) request.set_local_rank(*options.local_rank);
  v1::OpenSessionResponse response;
  RETURN_IF_ERROR(Unary(client->stub_.get(), canceller, "OpenSession",
                        &v1::Ckptd::StubInterface::OpenSession,
                        &v1::Ckptd::StubInterface::async_interface::OpenSession, request,
                        &response));
  return client;
}

Client::Client(ConnectOptions options, UniqueFd handshake, std::string token,
               uint32_t daemon_pid, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      handshake_(std::move(handshake)),
      token_(std::move(token)),
      daemon_pid_(daemon_pid),
      channel_(std::move(channel)),
      stub_(v1::Ckptd::NewStub(channel_)) {}

absl::StatusOr<uint64_t> Client::RegisterRegion(const void* address,
                                                uint64_t length,
                                                CallCanceller* canceller) {
  return RegisterHostRegion(address, length, /*snapshot=*/false, canceller);
}

absl::StatusOr<uint64_t> Client::RegisterSnapshotRegion(const void* address,
                                                        uint64_t length,
                                                        CallCanceller* canceller) {
  return RegisterHostRegion(address, length, /*snapshot=*/true, canceller);
}

absl::StatusOr<uint64_t> Client::RegisterHostRegion(const void* address,
                                                    uint64_t length, bool snapshot,
                                                    CallCanceller* canceller) {
  v1::RegisterRegionsRequest request;
  request.set_session_token(token_);
  v1::HostRegion* host = request.add_regions()->mutable_host();
  host->set_address(reinterpret_cast<uint64_t>(address));
  host->set_length(length);
  host->set_snapshot(snapshot);
  return RegisterOne(request, canceller);
}

absl::StatusOr<uint64_t> Client::RegisterOne(const v1::RegisterRegionsRequest& request,
                                             CallCanceller* canceller) {
  v1::RegisterRegionsResponse response;
  RETURN_IF_ERROR(Unary(stub_.get(), canceller, "RegisterRegions",
                        &v1::Ckptd::StubInterface::RegisterRegions,
                        &v1::Ckptd::StubInterface::async_interface::RegisterRegions, request,
                        &response));
  if (response.region_ids_size() != 1) {
    return absl::InternalError("RegisterRegions returned no id");
  }
  return response.region_ids(0);
}

Client::~Client() {
  std::thread watcher;
  {
    absl::MutexLock lock(&gpu_mu_);
    if (daemon_watch_.joinable()) {
      const uint64_t one = 1;
      // An eventfd write fails only if its counter would overflow.
      if (::write(watch_stop_.get(), &one, sizeof(one)) != sizeof(one)) {
        std::fprintf(stderr, "libckpt: cannot stop the daemon watcher: %s\n",
                     std::strerror(errno));
      }
      watcher = std::move(daemon_watch_);
    }
  }
  // Joined without the lock: a watcher that saw the daemon exit takes it to
  // release the staged waits. watch_stop_ outlives it (a member).
  if (watcher.joinable()) watcher.join();
}

absl::StatusOr<bool> Client::DaemonAlive() const {
  pollfd fd = {handshake_.get(), POLLRDHUP, 0};
  for (;;) {
    const int n = ::poll(&fd, 1, 0);
    if (n >= 0) break;
    if (errno != EINTR) return ErrnoToStatus(errno, "poll(session socket)");
  }
  return (fd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
}

absl::Status Client::ReleaseRegions(const std::vector<uint64_t>& ids,
                                    CallCanceller* canceller) {
  v1::ReleaseRegionsRequest request;
  request.set_session_token(token_);
  absl::MutexLock lock(&gpu_mu_);
  for (uint64_t id : ids) {
    auto it = gpu_regions_.find(id);
    request.add_region_ids(it == gpu_regions_.end() ? id : it->second.daemon_id);
  }
  v1::ReleaseRegionsResponse response;
  RETURN_IF_ERROR(Unary(stub_.get(), canceller, "ReleaseRegions",
                        &v1::Ckptd::StubInterface::ReleaseRegions,
                        &v1::Ckptd::StubInterface::async_interface::ReleaseRegions, request,
                        &response));
  // Forgotten only once the daemon released them: a retry sends the same ids.
  for (uint64_t id : ids) gpu_regions_.erase(id);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Client::DefineLayout(
    const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors,
    CallCanceller* canceller) {
  v1::DefineLayoutRequest request;
  request.set_session_token(token_);
  *request.mutable_tensors() = tensors;
  RemapRegionIds(request.mutable_tensors());
  v1::DefineLayoutResponse response;
  RETURN_IF_ERROR(Unary(stub_.get(), canceller, "DefineLayout",
                        &v1::Ckptd::StubInterface::DefineLayout,
                        &v1::Ckptd::StubInterface::async_interface::DefineLayout, request,
                        &response));
  return response.layout_id();
}

absl::StatusOr<std::unique_ptr<SaveHandle>> Client::Save(v1::SaveRequest request,
                                                         GpuStreamHandle stream,
                                                         CallCanceller* canceller,
                                                         GpuReady ready) {
  request.set_session_token(token_);
  TrainerGpu* gpu = nullptr;
  std::vector<std::string> devices;
  RETURN_IF_ERROR(RefreshGpuRegions(canceller, &gpu, &devices));
  if (ready == GpuReady::kRecordedBefore) {
    RETURN_IF_ERROR(TakeRecordedReady(devices));
  } else {
    for (const std::string& uuid : devices) {
      RETURN_IF_ERROR(gpu->RecordReady(uuid, stream));
    }
  }
  RemapRegionIds(request.mutable_tensors());
  v1::SaveResponse response;
  RETURN_IF_ERROR(Unary(stub_.get(), canceller, "Save", &v1::Ckptd::StubInterface::Save,
                        &v1::Ckptd::StubInterface::async_interface::Save, request,
                        &response));
  std::vector<uint64_t> stream_wait = StreamWaitRecords(response, devices);
  const bool cpu_waits = gpu != nullptr && stream_wait.empty();
  std::unique_ptr<SaveHandle> handle(new SaveHandle(stub_.get(), token_, response.save_id(),
                                                    gpu, std::move(devices),
                                                    std::move(stream_wait)));
  // A GPU save whose staged wait needs the CPU is followed at once:
  // WaitStagedOnStream then finds the progress stream already open.
  if (cpu_waits) handle->StartFollowing();
  return handle;
}

absl::StatusOr<v1::LoadResponse> Client::Load(v1::LoadRequest request,
                                              CallCanceller* canceller) {
  request.set_session_token(token_);
  RemapRegionIds(request.mutable_tensors());
  // Byte items that do not fit the daemon's message limit come in further
  // pages (LoadByteItems), fetched here so the caller sees one response.
  request.set_page_byte_items(true);
  v1::LoadResponse response;
  if (canceller == nullptr) {
    grpc::ClientContext context;
    RETURN_IF_ERROR(FromGrpc(stub_->Load(&context, request, &response), "Load"));
  } else {
    const uint64_t load_id = next_load_id_.fetch_add(1);
    request.set_load_id(load_id);
    absl::Status confirmed = absl::OkStatus();
    grpc::ClientContext context;
    const grpc::Status status = canceller->Run(
        &context,
        [&](CallCanceller::Completion done) {
          stub_->async()->Load(&context, &request, &response, std::move(done));
        },
        // Before the call is cancelled here (which ends it at once on this
        // side, not the daemon's writes), the daemon confirms the writes
        // are over.
        [&](const std::function<bool()>& call_ended) {
          confirmed = CancelLoadAndConfirm(load_id, call_ended);
        });
    if (!confirmed.ok()) return confirmed;
    RETURN_IF_ERROR(FromGrpc(status, "Load"));
  }
  while (!response.pending_byte_items().empty()) {
    v1::LoadByteItemsRequest more;
    more.set_session_token(token_);
    more.set_job(request.job());
    more.set_checkpoint(response.checkpoint());  // the one loaded, not "latest"
    more.mutable_byte_items()->Swap(response.mutable_pending_byte_items());
    v1::LoadByteItemsResponse page;
    RETURN_IF_ERROR(Unary(stub_.get(), canceller, "LoadByteItems",
                          &v1::Ckptd::StubInterface::LoadByteItems,
                          &v1::Ckptd::StubInterface::async_interface::LoadByteItems, more,
                          &page));
    if (page.byte_items().empty()) {
      // Each page answers at least one item; a daemon that does not would
      // keep this loop going for good.
      return absl::InternalError(absl::StrCat(
          "LoadByteItems answered none of ", more.byte_items_size(), " byte items"));
    }
    for (v1::ByteItem& item : *page.mutable_byte_items()) {
      *response.add_byte_items() = std::move(item);
    }
    response.mutable_pending_byte_items()->Swap(page.mutable_pending_byte_items());
  }
  return response;
}

absl::Status Client::CancelLoadAndConfirm(uint64_t load_id,
                                          const std::function<bool()>& call_ended) {
  // The Cancel may overtake the Load (they are separate calls): the daemon
  // then does not know the load yet and says so (cancelled_loads 0), and
  // the Cancel is sent again until the load is found or its call ends.
  constexpr absl::Duration kRetryEvery = absl::Milliseconds(5);
  const absl::Time give_up = absl::Now() + absl::Milliseconds(options_.cancel_confirm_ms);
  absl::Status last = absl::OkStatus();
  while (!call_ended()) {
    const absl::Time now = absl::Now();
    if (now >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Load cancelled, but ckptd (pid ", daemon_pid_, ") did not confirm within ",
          options_.cancel_confirm_ms,
          " ms that it writes no more into this process's memory (is it stopped or "
          "hung?): it may still write the checkpoint's bytes into the destination "
          "memory if it resumes",
          last.ok() ? "" : absl::StrCat("; last Cancel: ", last.message())));
    }
    v1::CancelRequest cancel;
    cancel.set_session_token(token_);
    cancel.set_load_id(load_id);
    v1::CancelResponse answer;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(give_up));
    last = FromGrpc(stub_->Cancel(&context, cancel, &answer), "Cancel");
    if (last.ok() && answer.cancelled_loads() > 0) return absl::OkStatus();
    if (!last.ok() && !absl::IsDeadlineExceeded(last) && !absl::IsUnavailable(last)) {
      // A daemon that refuses the Cancel (one too old to know load_id)
      // will not confirm: no use waiting for it.
      return absl::DeadlineExceededError(absl::StrCat(
          "Load cancelled, but ckptd refused to cancel it (", last.message(),
          "): it may still write the checkpoint's bytes into the destination memory"));
    }
    absl::SleepFor(kRetryEvery);
  }
  return absl::OkStatus();  // the load's call ended: so did its writes
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> Client::List(const std::string& job,
                                                              CallCanceller* canceller,
                                                              const std::string& checkpoint) {
  v1::ListCheckpointsRequest request;
  request.set_job(job);
  request.set_checkpoint(checkpoint);
  v1::ListCheckpointsResponse response;
  RETURN_IF_ERROR(Unary(stub_.get(), canceller, "ListCheckpoints",
                        &v1::Ckptd::StubInterface::ListCheckpoints,
                        &v1::Ckptd::StubInterface::async_interface::ListCheckpoints,
                        request, &response));
  return std::vector<v1::CheckpointInfo>(response.checkpoints().begin(),
                                         response.checkpoints().end());
}

absl::StatusOr<v1::RemoteUpload> Client::WaitRemoteCommitted(const std::string& checkpoint,
                                                              absl::Duration timeout,
                                                              CallCanceller* canceller) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "not handed to the remote tier yet";
  while (true) {
    v1::DaemonStatusResponse status;
    RETURN_IF_ERROR(Unary(stub_.get(), canceller, "DaemonStatus",
                          &v1::Ckptd::StubInterface::DaemonStatus,
                          &v1::Ckptd::StubInterface::async_interface::DaemonStatus,
                          v1::DaemonStatusRequest(), &status));
    if (status.remote().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemon at ", options_.socket, " has no remote tier (ckptd --remote)"));
    }
    // The newest entry of the checkpoint (a retried upload comes later).
    const v1::RemoteUpload* upload = nullptr;
    for (const v1::RemoteUpload& u : status.remote_uploads()) {
      if (u.job() == options_.job && u.checkpoint() == checkpoint) upload = &u;
    }
    if (upload != nullptr) {
      if (upload->state() == "committed") return *upload;
      if (upload->state() == "failed") {
        return absl::AbortedError(absl::StrCat("the upload of ", options_.job, "/", checkpoint,
                                               " to the remote tier failed: ",
                                               upload->error()));
      }
      last = absl::StrCat(upload->state(), ", ", upload->bytes_uploaded(), " of ",
                          upload->bytes_total(), " bytes");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          options_.job, "/", checkpoint, " not committed in the remote tier ", status.remote(),
          " within ", absl::FormatDuration(timeout), " (", last, ")"));
    }
    if (canceller != nullptr && canceller->cancelled()) {
      return absl::CancelledError("waiting for the remote commit was interrupted");
    }
    absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
  }
}

}  // namespace ckpt

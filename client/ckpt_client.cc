#include "client/ckpt_client.h"

#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "common/status.h"

namespace ckpt {
namespace {

constexpr size_t kTokenBytes = 16;
constexpr int kMaxMessageBytes = 256 << 20;

bool IsFinal(v1::Phase phase) {
  return phase == v1::PHASE_COMMITTED || phase == v1::PHASE_FAILED ||
         phase == v1::PHASE_CANCELLED;
}

absl::StatusOr<UniqueFd> DialHandshake(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Annotate(ErrnoToStatus(errno, absl::StrCat("connect ", path)),
                    "is ckptd running?");
  }
  return fd;
}

}  // namespace

std::shared_ptr<grpc::Channel> DaemonChannel(const std::string& socket) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(absl::StrCat("unix:", socket),
                                   grpc::InsecureChannelCredentials(), args);
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ConnectOptions& options) {
  ASSIGN_OR_RETURN(UniqueFd fd, DialHandshake(absl::StrCat(options.socket, ".session")));
  char reply[kTokenBytes + 4];
  size_t got = 0;
  while (got < sizeof(reply)) {
    const ssize_t n = ::recv(fd.get(), reply + got, sizeof(reply) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "handshake recv");
    if (n == 0) {
      return absl::UnavailableError(
          "ckptd closed the handshake (too many sessions? see its log)");
    }
    got += static_cast<size_t>(n);
  }
  uint32_t daemon_pid = 0;
  std::memcpy(&daemon_pid, reply + kTokenBytes, 4);
  // Under Yama ptrace_scope=1 only a declared tracer may read our memory.
  // Without Yama the call fails with EINVAL, which is fine.
  if (::prctl(PR_SET_PTRACER, static_cast<unsigned long>(daemon_pid), 0, 0, 0) != 0 &&
      errno != EINVAL) {
    return ErrnoToStatus(errno, "prctl(PR_SET_PTRACER)");
  }
  std::unique_ptr<Client> client(new Client(options, std::move(fd),
                                            std::string(reply, kTokenBytes),
                                            daemon_pid, DaemonChannel(options.socket)));
  v1::OpenSessionRequest request;
  request.set_session_token(client->token_);
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  request.set_job(options.job);
  request.set_node(options.node);
  request.set_local_world_size(options.local_world_size);
  v1::OpenSessionResponse response;
  grpc::ClientContext context;
  RETURN_IF_ERROR(FromGrpc(client->stub_->OpenSession(&context, request, &response),
                           "OpenSession"));
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
                                                uint64_t length) {
  v1::RegisterRegionsRequest request;
  request.set_session_token(token_);
  v1::HostRegion* host = request.add_regions()->mutable_host();
  host->set_address(reinterpret_cast<uint64_t>(address));
  host->set_length(length);
  v1::RegisterRegionsResponse response;
  grpc::ClientContext context;
  RETURN_IF_ERROR(FromGrpc(stub_->RegisterRegions(&context, request, &response),
                           "RegisterRegions"));
  if (response.region_ids_size() != 1) {
    return absl::InternalError("RegisterRegions returned no id");
  }
  return response.region_ids(0);
}

absl::StatusOr<uint64_t> Client::DefineLayout(
    const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors) {
  v1::DefineLayoutRequest request;
  request.set_session_token(token_);
  *request.mutable_tensors() = tensors;
  v1::DefineLayoutResponse response;
  grpc::ClientContext context;
  RETURN_IF_ERROR(FromGrpc(stub_->DefineLayout(&context, request, &response),
                           "DefineLayout"));
  return response.layout_id();
}

absl::StatusOr<std::unique_ptr<SaveHandle>> Client::Save(v1::SaveRequest request) {
  request.set_session_token(token_);
  v1::SaveResponse response;
  grpc::ClientContext context;
  RETURN_IF_ERROR(FromGrpc(stub_->Save(&context, request, &response), "Save"));
  return std::unique_ptr<SaveHandle>(
      new SaveHandle(stub_.get(), token_, response.save_id()));
}

absl::StatusOr<v1::LoadResponse> Client::Load(v1::LoadRequest request) {
  request.set_session_token(token_);
  v1::LoadResponse response;
  grpc::ClientContext context;
  RETURN_IF_ERROR(FromGrpc(stub_->Load(&context, request, &response), "Load"));
  return response;
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> Client::List(const std::string& job) {
  v1::ListCheckpointsRequest request;
  request.set_job(job);
  v1::ListCheckpointsResponse response;
  grpc::ClientContext context;
  RETURN_IF_ERROR(FromGrpc(stub_->ListCheckpoints(&context, request, &response),
                           "ListCheckpoints"));
  return std::vector<v1::CheckpointInfo>(response.checkpoints().begin(),
                                         response.checkpoints().end());
}

SaveHandle::SaveHandle(v1::Ckptd::Stub* stub, std::string token, uint64_t id)
    : stub_(stub), token_(std::move(token)), id_(id) {
  progress_.set_save_id(id);
  progress_.set_phase(v1::PHASE_ACCEPTED);
}

SaveHandle::~SaveHandle() {
  context_.TryCancel();
  if (follower_.joinable()) follower_.join();
}

void SaveHandle::StartFollowing() {
  std::call_once(follow_once_, [this] { follower_ = std::thread([this] { Follow(); }); });
}

void SaveHandle::Follow() {
  v1::WatchSaveRequest request;
  request.set_session_token(token_);
  request.set_save_id(id_);
  auto reader = stub_->WatchSave(&context_, request);
  v1::SaveProgress progress;
  while (reader->Read(&progress)) {
    std::lock_guard lock(mu_);
    progress_ = progress;
    changed_.notify_all();
  }
  grpc::Status status = reader->Finish();
  std::lock_guard lock(mu_);
  ended_ = true;
  if (!IsFinal(progress_.phase())) {
    stream_error_ = status.ok()
                        ? absl::UnavailableError("progress stream ended early")
                        : FromGrpc(status, "WatchSave");
  }
  changed_.notify_all();
}

absl::Status SaveHandle::WaitFor(v1::Phase phase) {
  StartFollowing();
  std::unique_lock lock(mu_);
  changed_.wait(lock, [&] {
    return ended_ || IsFinal(progress_.phase()) || progress_.phase() >= phase;
  });
  if (progress_.phase() == v1::PHASE_FAILED ||
      progress_.phase() == v1::PHASE_CANCELLED) {
    const auto code = progress_.phase() == v1::PHASE_CANCELLED
                          ? absl::StatusCode::kCancelled
                          : absl::StatusCode::kAborted;
    return absl::Status(code, absl::StrCat("save ", id_, " of ",
                                           progress_.checkpoint(), " ",
                                           v1::Phase_Name(progress_.phase()),
                                           ": ", progress_.reason()));
  }
  if (progress_.phase() >= phase) return absl::OkStatus();
  return stream_error_;
}

absl::Status SaveHandle::WaitStaged() { return WaitFor(v1::PHASE_STAGED); }
absl::Status SaveHandle::WaitCommitted() { return WaitFor(v1::PHASE_COMMITTED); }

v1::SaveProgress SaveHandle::progress() {
  StartFollowing();
  std::lock_guard lock(mu_);
  return progress_;
}

absl::Status SaveHandle::Cancel() {
  v1::CancelRequest request;
  request.set_session_token(token_);
  request.set_save_id(id_);
  v1::CancelResponse response;
  grpc::ClientContext context;
  return FromGrpc(stub_->Cancel(&context, request, &response), "Cancel");
}

}  // namespace ckpt

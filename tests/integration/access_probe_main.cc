// ckpt-access-probe: one trainer call, made by whatever user runs this
// binary, for the isolation tests (tests/integration/isolation_test.cc).
//
//   ckpt-access-probe SOCKET save JOB CHECKPOINT   a save of one byte item
//   ckpt-access-probe SOCKET load JOB CHECKPOINT   a load of that byte item
//   ckpt-access-probe SOCKET token TOKEN_HEX       OpenSession with a token
//                                                  this process did not get
//   ckpt-access-probe SOCKET open JOB RANK WORLD   opens a session as that
//                                                  rank, then hangs up
//
// Prints the call's status and exits 0 if it succeeded, 3 if it was refused
// with PERMISSION_DENIED, 1 for any other error.
#include <cstdio>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "ckpt/v1/control.grpc.pb.h"
#include "client/ckpt_client.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"

namespace {

constexpr char kItem[] = "probe.bytes";

int Report(const absl::Status& status) {
  std::printf("%s\n", status.ToString().c_str());
  if (status.ok()) return 0;
  return absl::IsPermissionDenied(status) ? 3 : 1;
}

absl::Status Save(const std::string& socket, const std::string& job,
                  const std::string& checkpoint) {
  ASSIGN_OR_RETURN(auto client, ckpt::Client::Connect({.socket = socket, .job = job}));
  ckpt::v1::SaveRequest request;
  request.set_job(job);
  request.set_checkpoint(checkpoint);
  ckpt::v1::ByteItem* item = request.add_byte_items();
  item->set_fqn(kItem);
  item->set_data("written by the access probe");
  ASSIGN_OR_RETURN(auto save, client->Save(std::move(request)));
  return save->WaitCommitted();
}

absl::Status Load(const std::string& socket, const std::string& job,
                  const std::string& checkpoint) {
  ASSIGN_OR_RETURN(auto client, ckpt::Client::Connect({.socket = socket, .job = job}));
  ckpt::v1::LoadRequest request;
  request.set_job(job);
  request.set_checkpoint(checkpoint);
  request.add_byte_items(kItem);
  return client->Load(std::move(request)).status();
}

// A raw OpenSession with someone else's token, on this process's own
// connection: what a process that read another's token would try.
absl::Status UseToken(const std::string& socket, const std::string& token_hex) {
  auto stub = ckpt::v1::Ckptd::NewStub(ckpt::DaemonChannel(socket));
  ckpt::v1::OpenSessionRequest request;
  request.set_session_token(absl::HexStringToBytes(token_hex));
  // A request the daemon would otherwise accept: only the token is wrong.
  request.set_job("stolen");
  request.set_world_size(1);
  ckpt::v1::OpenSessionResponse response;
  grpc::ClientContext context;
  return ckpt::FromGrpc(stub->OpenSession(&context, request, &response), "OpenSession");
}

// What a user would try against another's in-flight checkpoint: join its
// job as one of its ranks, then hang up.
absl::Status OpenAndHangUp(const std::string& socket, const std::string& job,
                           const std::string& rank, const std::string& world) {
  uint32_t r = 0, w = 0;
  if (!absl::SimpleAtoi(rank, &r) || !absl::SimpleAtoi(world, &w)) {
    return absl::InvalidArgumentError("RANK and WORLD are numbers");
  }
  return ckpt::Client::Connect(
             {.socket = socket, .job = job, .rank = r, .world_size = w,
              .local_world_size = w})
      .status();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[2]) == "save") {
    return Report(Save(argv[1], argv[3], argv[4]));
  }
  if (argc == 5 && std::string(argv[2]) == "load") {
    return Report(Load(argv[1], argv[3], argv[4]));
  }
  if (argc == 4 && std::string(argv[2]) == "token") {
    return Report(UseToken(argv[1], argv[3]));
  }
  if (argc == 6 && std::string(argv[2]) == "open") {
    return Report(OpenAndHangUp(argv[1], argv[3], argv[4], argv[5]));
  }
  std::fprintf(stderr,
               "usage: ckpt-access-probe SOCKET save|load JOB CHECKPOINT\n"
               "       ckpt-access-probe SOCKET token TOKEN_HEX\n"
               "       ckpt-access-probe SOCKET open JOB RANK WORLD\n");
  return 2;
}

// libckpt: the trainer-side client of ckptd.
//
//   auto client = ckpt::Client::Connect({.socket = ..., .job = "llama",
//                                        .rank = r, .world_size = n});
//   auto region = (*client)->RegisterRegion(buffer, bytes);
//   auto save = (*client)->Save(request);     // returns at ACCEPTED (~1 ms)
//   (*save)->WaitStaged();                    // before mutating the memory
//   (*save)->WaitCommitted();                 // optional
//
// Connect performs the handshake (the daemon learns this process's pid from
// the kernel and returns a session token), allows the daemon to read this
// process's memory where Yama would forbid it (PR_SET_PTRACER), and opens
// the session. Keep the Client alive while saves run: closing it tells the
// daemon this rank is gone.
//
// Thread-safety: Client methods may be called from any thread. A SaveHandle
// is safe to use from several threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ckpt/v1/control.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "common/unique_fd.h"

namespace ckpt {

inline constexpr char kDefaultSocket[] = "/run/ckptd/ckptd.sock";

struct ConnectOptions {
  std::string socket = kDefaultSocket;
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t node = 0;              // the daemon's --node_id
  uint32_t local_world_size = 0;  // ranks on this node; 0: all (one node)
};

// A gRPC channel to the daemon's socket with the message size limits the
// daemon uses.
std::shared_ptr<grpc::Channel> DaemonChannel(const std::string& socket);

// Turns a gRPC status into an absl::Status with `what` as context.
absl::Status FromGrpc(const grpc::Status& status, absl::string_view what);

// One rank's in-flight save. A background thread, started on first use (so
// the save call itself stays cheap), follows the daemon's progress stream.
class SaveHandle {
 public:
  ~SaveHandle();
  uint64_t id() const { return id_; }

  // Blocks until every byte of this rank is copied out of its memory (the
  // memory may be mutated after this returns OK), or the save fails.
  absl::Status WaitStaged();
  // Blocks until the checkpoint is committed, or fails.
  absl::Status WaitCommitted();
  // The latest progress seen.
  v1::SaveProgress progress();
  // Cancels the whole checkpoint this save belongs to.
  absl::Status Cancel();

 private:
  friend class Client;
  SaveHandle(v1::Ckptd::Stub* stub, std::string token, uint64_t id);
  void Follow();
  void StartFollowing();
  absl::Status WaitFor(v1::Phase phase);

  v1::Ckptd::Stub* const stub_;
  const std::string token_;
  const uint64_t id_;
  grpc::ClientContext context_;
  std::once_flag follow_once_;
  std::thread follower_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  v1::SaveProgress progress_ ABSL_GUARDED_BY(mu_);
  absl::Status stream_error_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ConnectOptions& options);

  // Registers [address, address+length) of this process; returns its id.
  absl::StatusOr<uint64_t> RegisterRegion(const void* address, uint64_t length);

  // Registers this rank's tensor items once; later saves pass the returned
  // id in SaveRequest.layout_id instead of the items, which keeps the save
  // call at about a millisecond however many tensors there are.
  absl::StatusOr<uint64_t> DefineLayout(
      const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors);

  // Fills in the session token and submits; returns once ACCEPTED.
  absl::StatusOr<std::unique_ptr<SaveHandle>> Save(v1::SaveRequest request);

  // Restores into registered memory; returns once every byte is verified
  // and in place.
  absl::StatusOr<v1::LoadResponse> Load(v1::LoadRequest request);

  absl::StatusOr<std::vector<v1::CheckpointInfo>> List(const std::string& job);

  const ConnectOptions& options() const { return options_; }
  uint32_t daemon_pid() const { return daemon_pid_; }

 private:
  Client(ConnectOptions options, UniqueFd handshake, std::string token,
         uint32_t daemon_pid, std::shared_ptr<grpc::Channel> channel);

  const ConnectOptions options_;
  const UniqueFd handshake_;  // held open: the session lives while it does
  const std::string token_;
  const uint32_t daemon_pid_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ckptd::Stub> stub_;
};

}  // namespace ckpt

#include "daemon/server.h"

#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/control_socket.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/service.h"
#include "grpcpp/grpcpp.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "restore/loader.h"
#include "save/save_coordinator.h"
#include "session/gpu_backend.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"

namespace ckpt {
namespace {

absl::Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("create ", path));
  return absl::OkStatus();
}

// The save side's share of the daemon's options.
SaveOptions SaveOptionsOf(const DaemonOptions& o) {
  SaveOptions save;
  save.node_id = o.node_id;
  save.nodes = o.nodes;
  save.checksum_block_bytes = o.checksum_block_bytes;
  save.commit_timeout_ms = o.commit_timeout_ms;
  save.keep_last = o.keep_last;
  save.max_items_per_save = o.max_items_per_save;
  save.write_rate_limit = o.write_rate_limit;
  return save;
}

}  // namespace

absl::Status ValidateOptions(const DaemonOptions& o) {
  if (o.root.empty()) return absl::InvalidArgumentError("--root is empty");
  if (o.socket.empty()) return absl::InvalidArgumentError("--socket is empty");
  if (o.io_workers == 0 || o.queue_depth == 0) {
    return absl::InvalidArgumentError("--io_workers and --queue_depth must be > 0");
  }
  if (o.nodes == 0 || o.node_id >= o.nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--node_id ", o.node_id, " is not inside --nodes ", o.nodes));
  }
  if (o.checksum_block_bytes == 0) {
    return absl::InvalidArgumentError("--checksum_block_bytes must be > 0");
  }
  // Clients send and receive at most kMaxControlMessageBytes: a larger limit
  // here would let the daemon send responses every client refuses.
  if (o.max_request_bytes > static_cast<uint32_t>(kMaxControlMessageBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_request_bytes ", o.max_request_bytes, " is above ",
        kMaxControlMessageBytes, ", the largest message clients send and receive"));
  }
  return absl::OkStatus();
}

absl::Status RunServer(const DaemonOptions& options, const sigset_t& stop_signals) {
  RETURN_IF_ERROR(ValidateOptions(options));
  RETURN_IF_ERROR(MakeDirs(options.root));
  RETURN_IF_ERROR(
      MakeDirs(std::filesystem::path(options.socket).parent_path().string()));
  ASSIGN_OR_RETURN(std::unique_ptr<StagingPool> pool,
                   StagingPool::Create(options.pool_bytes, options.buffer_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuBackend> gpu,
                   GpuBackend::Open(options.gpu, pool.get()));
  auto workers = std::make_unique<IoWorkers>(options.io_workers,
                                             options.queue_depth, *pool);
  // The root is opened once, here; everything under it is reached from this
  // descriptor without following symlinks (storage/storage_dir.h).
  CheckpointStore store(options.root);
  RETURN_IF_ERROR(store.status());
  CheckpointLeases leases;
  MemoryTier tier(options.keep_in_memory_bytes);
  if (gpu->device() != nullptr) tier.SetPinner(gpu.get());
  auto saves = std::make_unique<SaveCoordinator>(SaveOptionsOf(options), &store, pool.get(),
                                                 workers.get(), &leases, &tier);
  auto loader = std::make_unique<Loader>(
      std::chrono::milliseconds(options.load_batch_ms), &store, pool.get(), workers.get(),
                                         &leases, &tier);
  ASSIGN_OR_RETURN(
      std::unique_ptr<SessionRegistry> sessions,
      SessionRegistry::Start(
          HandshakeSocketPath(options.socket), options.max_sessions,
          SessionGpu{gpu.get(), absl::Milliseconds(options.gpu_copy_timeout_ms)},
          [s = saves.get()](const std::shared_ptr<Session>& session) {
            s->OnSessionClosed(session);
          }));

  CkptdService service({&options, sessions.get(), saves.get(), loader.get(), &store,
                        pool.get(), workers.get(), &tier, workers->backend(),
                        gpu->name()});
  ::unlink(options.socket.c_str());  // a stale socket of a previous run
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", options.socket),
                           grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_request_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_request_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", options.socket));
  }
  RETURN_IF_ERROR(sessions->Publish());
  LogInfo("ckptd listening on ", options.socket, " root ", options.root,
          " pool ", pool->pool_bytes(), " bytes, io backend ",
          workers->backend(), ", gpu ", gpu->name());

  int signal = 0;
  sigwait(&stop_signals, &signal);
  LogInfo("ckptd stopping on signal ", signal);
  server->Shutdown();  // waits for in-flight RPCs, loads included
  sessions.reset();
  loader.reset();     // no round is pending once every Load has finished
  // Finishes the queued tasks (parts, the file removals of failed saves they
  // post, list/inspect/gc) before `saves` goes away: the coordinator posts
  // to the workers and its tasks call back into it.
  workers.reset();
  saves.reset();
  return absl::OkStatus();
}

}  // namespace ckpt

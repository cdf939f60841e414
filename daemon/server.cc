#include "daemon/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/control_socket.h"
#include "common/instance_lock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/socket_access.h"
#include "daemon/access_policy.h"
#include "daemon/connection_listener.h"
#include "daemon/open_files_limit.h"
#include "daemon/service.h"
#include "grpcpp/grpcpp.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "restore/loader.h"
#include "restore/shard_reader.h"
#include "save/save_coordinator.h"
#include "session/gpu_backend.h"
#include "session/session.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/node_lock.h"
#include "storage/startup_recovery.h"

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
  save.local_ranks_timeout_ms = o.local_ranks_timeout_ms;
  save.keep_last = o.keep_last;
  save.max_items_per_save = o.max_items_per_save;
  save.write_rate_limit = o.write_rate_limit;
  return save;
}

// An optional group flag: unset when empty.
absl::StatusOr<std::optional<gid_t>> GroupOption(const std::string& value,
                                                 absl::string_view flag) {
  if (value.empty()) return std::optional<gid_t>();
  absl::StatusOr<gid_t> gid = ResolveGroup(value);
  if (!gid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", gid.status().message()));
  }
  return std::optional<gid_t>(*gid);
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
  // A restore verifies each block whole in one staging buffer before it
  // delivers a byte of it (restore/shard_reader.h): refuse to save blocks
  // this daemon could not restore.
  if (o.checksum_block_bytes > MaxChecksumBlockBytes(o.buffer_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checksum_block_bytes ", o.checksum_block_bytes, " is above ",
        MaxChecksumBlockBytes(o.buffer_bytes), ", the largest block --buffer_bytes ",
        o.buffer_bytes, " can verify before delivering it (a buffer less 4096)"));
  }
  // 0 would fail every save of several local ranks at the first check.
  if (o.local_ranks_timeout_ms == 0) {
    return absl::InvalidArgumentError("--local_ranks_timeout_ms must be > 0");
  }
  // Clients send and receive at most kMaxControlMessageBytes: a larger limit
  // here would let the daemon send responses every client refuses.
  if (o.max_request_bytes > static_cast<uint32_t>(kMaxControlMessageBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_request_bytes ", o.max_request_bytes, " is above ",
        kMaxControlMessageBytes, ", the largest message clients send and receive"));
  }
  if (o.max_sessions == 0 || o.max_connections == 0) {
    return absl::InvalidArgumentError("--max_sessions and --max_connections must be > 0");
  }
  return absl::OkStatus();
}

absl::Status RunServer(const DaemonOptions& options, const sigset_t& stop_signals) {
  RETURN_IF_ERROR(ValidateOptions(options));
  // Before any descriptor is opened: a limit the bounds cannot fit in
  // refuses the start (daemon/open_files_limit.h).
  RETURN_IF_ERROR(RaiseOpenFilesLimit(options).status());
  ASSIGN_OR_RETURN(const std::optional<gid_t> socket_group,
                   GroupOption(options.socket_group, "socket_group"));
  ASSIGN_OR_RETURN(const std::optional<gid_t> operator_group,
                   GroupOption(options.operator_group, "operator_group"));
  const SocketAccess socket_access{.group = socket_group};
  const AccessPolicy policy(operator_group);
  RETURN_IF_ERROR(MakeDirs(options.root));
  RETURN_IF_ERROR(
      MakeDirs(std::filesystem::path(options.socket).parent_path().string()));
  // One daemon per socket and per node of a root, checked before anything
  // of either is touched: a second daemon would remove the first's sockets
  // and take its saves in flight for a crash's leftovers. Held until exit.
  ASSIGN_OR_RETURN(InstanceLock socket_lock,
                   InstanceLock::AcquireAt(absl::StrCat(options.socket, ".lock"),
                                           absl::StrCat("socket ", options.socket)));
  if (absl::Status s = socket_lock.WriteRecord(absl::StrCat("pid ", ::getpid(), "\n"));
      !s.ok()) {
    LogWarning(s.ToString(), " (a second daemon's refusal will not name this one)");
  }
  ASSIGN_OR_RETURN(NodeLock node_lock, NodeLock::Acquire(options.root, options.node_id));
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
  // Before any save: an earlier run's leftovers (storage/startup_recovery.h).
  ASSIGN_OR_RETURN(StartupRecovery recovery,
                   RecoverAtStart(store, {.node_id = options.node_id,
                                          .nodes = options.nodes,
                                          .earlier_temp_tags =
                                              node_lock.earlier_temp_tags()}));
  // Tags of temporaries that could not be removed stay for the next start.
  if (absl::Status s = recovery.errors.empty() ? node_lock.RecoveryDone()
                                               : absl::OkStatus();
      !s.ok()) {
    LogWarning(s.ToString(), " (the next start looks for its leftovers again)");
  }
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
          HandshakeSocketPath(options.socket), socket_access, options.max_sessions,
          SessionGpu{gpu.get(), absl::Milliseconds(options.gpu_copy_timeout_ms)},
          [s = saves.get()](const std::shared_ptr<Session>& session) {
            s->OnSessionClosed(session);
          },
          LayoutLimits{.per_session = options.layout_bytes_per_session,
                       .total = options.layout_bytes_total}));

  // The daemon accepts gRPC connections itself, to know who made each one
  // (daemon/connection_listener.h); gRPC gets them one by one.
  ASSIGN_OR_RETURN(std::unique_ptr<ConnectionListener> connections,
                   ConnectionListener::Bind(options.socket, socket_access,
                                            options.max_connections));
  CkptdService service({&options, sessions.get(), saves.get(), loader.get(), &store,
                        pool.get(), workers.get(), &tier, workers->backend(),
                        gpu->name(), &leases, connections.get(), &policy});
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_request_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_request_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::UnavailableError("cannot start the gRPC server");
  RETURN_IF_ERROR(connections->Serve(server.get()));
  RETURN_IF_ERROR(sessions->Publish());
  LogInfo("ckptd listening on ", options.socket, " root ", options.root,
          " pool ", pool->pool_bytes(), " bytes, io backend ",
          workers->backend(), ", gpu ", gpu->name());

  int signal = 0;
  sigwait(&stop_signals, &signal);
  LogInfo("ckptd stopping on signal ", signal);
  connections->Stop();  // no connection is added to a server shutting down
  server->Shutdown();  // waits for in-flight RPCs, loads included
  sessions.reset();
  loader.reset();     // no round is pending once every Load has finished
  // Finishes the queued tasks (parts, the file removals of failed saves they
  // post, list/inspect/gc) before `saves` goes away: the coordinator posts
  // to the workers and its tasks call back into it. Its commit watcher
  // posts to them too (a timed-out save's file removal), so it stops first.
  saves->StopWatching();
  workers.reset();
  saves.reset();
  return absl::OkStatus();
}

}  // namespace ckpt

#include "daemon/server.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/control_socket.h"
#include "common/daemon_metrics.h"
#include "common/instance_lock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/socket_access.h"
#include "daemon/access_policy.h"
#include "daemon/config_file.h"
#include "daemon/connection_listener.h"
#include "daemon/live_reload.h"
#include "daemon/metrics_writer.h"
#include "daemon/open_files_limit.h"
#include "daemon/remote_store.h"
#include "daemon/save_drain.h"
#include "daemon/service.h"
#include "daemon/service_notifier.h"
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
#include "storage/tree_local_commit.h"

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
  save.node_local_root = o.node_local_root;
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

// How often the service status (sd_notify STATUS=) is refreshed.
constexpr absl::Duration kStatusInterval = absl::Seconds(3);
// How long the gRPC server waits for calls in flight once the drain is
// over, before it cancels them.
constexpr absl::Duration kShutdownGrace = absl::Seconds(10);

// SIGHUP: re-reads the options and applies what changes live. A file that
// does not read, parse or validate changes nothing.
void Reload(const OptionsReader& reread, LiveReload& reload) {
  if (!reread) {
    LogInfo("reload: SIGHUP ignored, ckptd was started without --config");
    return;
  }
  absl::StatusOr<DaemonOptions> next = reread();
  if (!next.ok()) {
    LogError("reload: nothing changed: ", next.status().message());
    return;
  }
  reload.Apply(*next);
}

}  // namespace

absl::Status ValidateOptions(const DaemonOptions& o, const OptionOrigins& origins) {
  // Each message names the setting as the operator wrote it: the config
  // file's key and line, or the flag.
  auto name = [&](absl::string_view key) { return origins.Name(key); };
  if (o.root.empty()) return absl::InvalidArgumentError(absl::StrCat(name("root"), " is empty"));
  if (o.socket.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name("socket"), " is empty"));
  }
  if (o.io_workers == 0 || o.queue_depth == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(o.io_workers == 0 ? "io_workers" : "queue_depth"), " must be > 0"));
  }
  if (o.nodes == 0 || o.node_id >= o.nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name("node_id"), " ", o.node_id, " is not inside ", name("nodes"), " ", o.nodes));
  }
  // Nodes with a root each can only meet in the remote tier to commit.
  if (o.node_local_root && o.nodes > 1 && o.remote.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name("node_local_root"), " with ", name("nodes"), " ", o.nodes, " needs ",
        name("remote"), ": no node sees another's root, so the nodes commit by meeting in "
        "the remote tier"));
  }
  if (o.checksum_block_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name("checksum_block_bytes"), " must be > 0"));
  }
  // A restore verifies each block whole in one staging buffer before it
  // delivers a byte of it (restore/shard_reader.h): refuse to save blocks
  // this daemon could not restore.
  if (o.checksum_block_bytes > MaxChecksumBlockBytes(o.buffer_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name("checksum_block_bytes"), " ", o.checksum_block_bytes, " is above ",
        MaxChecksumBlockBytes(o.buffer_bytes), ", the largest block ",
        name("buffer_bytes"), " ", o.buffer_bytes,
        " can verify before delivering it (a buffer less 4096)"));
  }
  // 0 would fail every save of several local ranks at the first check.
  if (o.local_ranks_timeout_ms == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name("local_ranks_timeout_ms"), " must be > 0"));
  }
  // Clients send and receive at most kMaxControlMessageBytes: a larger limit
  // here would let the daemon send responses every client refuses.
  if (o.max_request_bytes > static_cast<uint32_t>(kMaxControlMessageBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name("max_request_bytes"), " ", o.max_request_bytes, " is above ",
        kMaxControlMessageBytes, ", the largest message clients send and receive"));
  }
  // 0 would fail every GPU save; above 100 would bound nothing.
  if (o.gpu_pool_share_percent < 1 || o.gpu_pool_share_percent > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        name("gpu_pool_share_percent"), " ", o.gpu_pool_share_percent, " must be 1 to 100"));
  }
  if (o.max_sessions == 0 || o.max_connections == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(o.max_sessions == 0 ? "max_sessions" : "max_connections"), " must be > 0"));
  }
  for (const auto& [key, group] : {std::pair<absl::string_view, const std::string&>(
                                       "socket_group", o.socket_group),
                                   {"operator_group", o.operator_group}}) {
    if (group.empty()) continue;
    if (absl::StatusOr<gid_t> gid = ResolveGroup(group); !gid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(key), ": ", gid.status().message()));
    }
  }
  if (absl::StatusOr<LogLevel> level = ParseLogLevel(o.log_level); !level.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name("log_level"), ": ", level.status().message()));
  }
  return absl::OkStatus();
}

absl::Status RunServer(const DaemonOptions& options, const sigset_t& signals,
                       const OptionsReader& reread) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(const LogLevel log_level, ParseLogLevel(options.log_level));
  SetLogLevel(log_level);
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
                   GpuBackend::Open(options.gpu, pool.get(), options.gpu_pool_share_percent));
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
  // The remote tier, if any (storage/remote_tier.h): stopped (its upload in
  // progress failed, the local copy kept) before the store, the memory tier
  // and the leases it reads go.
  std::unique_ptr<RemoteTier> remote;
  if (!options.remote.empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> remote_store, OpenRemoteStore(options));
    LogInfo("remote tier: ", remote_store->Describe(""));
    remote = std::make_unique<RemoteTier>(RemoteTierOptionsOf(options), &store, &tier, &leases,
                                          std::move(remote_store));
    // A commit of nodes with a root each that a crash cut short after the
    // nodes had met: finished here, before its upload resumes below.
    if (options.node_local_root && options.nodes > 1) {
      TreeLocalCommit(&store, remote->remote_store(), TreeLocalCommit::Root::kPerNode,
                      options.node_id, TreeCommitOptions())
          .RollForward();
    }
    // An earlier daemon's uploads that never committed there, newest first.
    remote->ResumeUnfinished();
  }
  // Nodes sharing the root meet in it, through the root's own driver, for
  // the local commit (storage/tree_local_commit.h); a crash after they met
  // is finished here, as above.
  std::shared_ptr<ObjectStore> shared_root;
  if (options.nodes > 1 && !options.node_local_root) {
    ASSIGN_OR_RETURN(shared_root, store.Objects());
    TreeLocalCommit(&store, shared_root, TreeLocalCommit::Root::kShared, options.node_id,
                    TreeCommitOptions())
        .RollForward();
  }
  auto saves = std::make_unique<SaveCoordinator>(SaveOptionsOf(options), &store, pool.get(),
                                                 workers.get(), &leases, &tier,
                                                 DefaultFileOps(), remote.get(), shared_root);
  auto loader = std::make_unique<Loader>(
      std::chrono::milliseconds(options.load_batch_ms), &store, pool.get(), workers.get(),
      &leases, &tier, options.load_plan_bytes, remote.get());
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
                        gpu->name(), &leases, connections.get(), &policy, &recovery,
                        &gpu->abandoned(), remote.get()});
  // Prometheus metrics for node_exporter (daemon/metrics_writer.h); none
  // without --metrics_file.
  DaemonMetrics::Get().MarkStarted(CKPT_VERSION);
  ASSIGN_OR_RETURN(std::unique_ptr<MetricsWriter> metrics,
                   MetricsWriter::Start(options.metrics_file, options.metrics_interval_ms,
                                        &DaemonMetrics::Get().registry()));
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_request_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_request_bytes));
  // Clients ping while their calls wait (common/control_socket.h): accept
  // that as often as the floor the clients keep to, rather than gRPC's
  // default of once in 5 minutes, past which it closes the connection.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinKeepaliveMs);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::UnavailableError("cannot start the gRPC server");
  RETURN_IF_ERROR(connections->Serve(server.get()));
  RETURN_IF_ERROR(sessions->Publish());
  LogInfo("ckptd listening on ", options.socket, " root ", options.root,
          " pool ", pool->pool_bytes(), " bytes", pool->pinned() ? "" : " (unpinned)",
          ", io backend ",
          workers->backend(), ", gpu ", gpu->name());

  ServiceNotifier notifier;
  notifier.Ready();
  // Only now: faulting in the resident fetch windows takes half a second
  // or so of one core and holds the process's memory map, which the
  // start-up's own mappings (the staging pool's) would wait for.
  if (remote != nullptr) remote->StartResidentFetchWindows();
  auto status_line = [&] {
    return ServiceStatusLine(saves->InFlight().size(),
                             pool->pool_bytes() - pool->free_bytes(), pool->pool_bytes());
  };
  notifier.Status(status_line());
  LiveReload reload(options, saves.get(), &tier);

  // Serve until a stop signal, reloading on SIGHUP and refreshing the
  // service status between signals.
  int signal = 0;
  while (signal != SIGTERM && signal != SIGINT) {
    const timespec interval = absl::ToTimespec(kStatusInterval);
    signal = sigtimedwait(&signals, nullptr, &interval);
    if (signal < 0) {
      if (errno != EAGAIN && errno != EINTR) {
        return ErrnoToStatus(errno, "waiting for signals (sigtimedwait)");
      }
      notifier.Status(status_line());
    } else if (signal == SIGHUP) {
      Reload(reread, reload);
      notifier.Status(status_line());
    }
  }
  LogInfo("ckptd stopping on signal ", signal);
  notifier.Stopping();

  // Saves in flight may finish, up to the drain deadline; the rest are
  // cancelled (daemon/save_drain.h). Everything below still serves them
  // meanwhile; afterwards no save is left that could wait on anything.
  absl::Time last_status = absl::Now();
  DrainSaves(*saves, absl::Milliseconds(options.drain_timeout_ms), signals, [&] {
    if (absl::Now() - last_status < kStatusInterval) return;
    last_status = absl::Now();
    notifier.Status(absl::StrCat("stopping: ", status_line()));
  });
  notifier.Status("stopping: shutting down");

  connections->Stop();  // no connection is added to a server shutting down
  // The upload in progress fails ("daemon stopping", the local copy kept;
  // the next start resumes it) and its saves' remote phase ends with it,
  // so that no progress stream following it waits out the grace below.
  if (remote != nullptr) remote->Stop();
  // Waits for in-flight RPCs, loads included; the progress streams end as
  // every save has reached a final phase. Past the deadline (an attempt
  // left to its worker that waits for other nodes, CancelAll says which)
  // gRPC cancels the calls left.
  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(kShutdownGrace));
  sessions.reset();
  loader.reset();     // no round is pending once every Load has finished
  // Finishes the queued tasks (parts, the file removals of failed saves they
  // post, list/inspect/gc) before `saves` goes away: the coordinator posts
  // to the workers and its tasks call back into it. Its commit watcher
  // posts to them too (a timed-out save's file removal), so it stops first.
  saves->StopWatching();
  workers.reset();
  saves.reset();
  metrics.reset();  // its final write: every save has ended by now
  return absl::OkStatus();
}

}  // namespace ckpt

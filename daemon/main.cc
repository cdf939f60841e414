// ckptd: the checkpoint daemon. main only parses flags (over the config
// file, daemon/config_file.h) and starts the server (daemon/server.h does
// the wiring).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/control_socket.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/config_file.h"
#include "daemon/daemon_options.h"
#include "daemon/server.h"

namespace {
const ckpt::DaemonOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, socket, kDefaults.socket,
          "gRPC Unix socket; the handshake socket is <socket>.session. "
          "Without this flag or the config's socket: $CKPTD_SOCKET, else "
          "(not root) $XDG_RUNTIME_DIR/ckptd/ckptd.sock, else the default");
ABSL_FLAG(std::string, root, kDefaults.root, "storage root directory");
ABSL_FLAG(uint64_t, pool_bytes, kDefaults.pool_bytes,
          "pinned staging pool size in bytes (the daemon's memory bound)");
ABSL_FLAG(uint32_t, buffer_bytes, kDefaults.buffer_bytes,
          "staging buffer size (one O_DIRECT transfer), a multiple of 4096");
ABSL_FLAG(uint32_t, io_workers, kDefaults.io_workers,
          "I/O worker threads, each with its own io_uring");
ABSL_FLAG(uint32_t, queue_depth, kDefaults.queue_depth,
          "io_uring entries per worker");
ABSL_FLAG(uint64_t, checksum_block_bytes, kDefaults.checksum_block_bytes,
          "bytes per XXH3 checksum block");
ABSL_FLAG(uint32_t, max_request_bytes, kDefaults.max_request_bytes,
          "largest gRPC message accepted or sent; at most the default, which "
          "is the limit clients set on their side");
ABSL_FLAG(uint64_t, write_rate_limit, kDefaults.write_rate_limit,
          "storage write cap in bytes/s (0: unlimited)");
ABSL_FLAG(uint32_t, node_id, kDefaults.node_id, "this node's id (0..nodes-1)");
ABSL_FLAG(uint32_t, nodes, kDefaults.nodes,
          "nodes of the jobs this daemon serves; a checkpoint commits once "
          "every node's manifest is in the shared storage root");
ABSL_FLAG(bool, node_local_root, kDefaults.node_local_root,
          "--root is this node's own disk, not shared: with --nodes > 1 the nodes "
          "commit by meeting in the remote tier (needs --remote)");
ABSL_FLAG(uint64_t, commit_timeout_ms, kDefaults.commit_timeout_ms,
          "how long a durable node waits for the other nodes");
ABSL_FLAG(uint64_t, local_ranks_timeout_ms, kDefaults.local_ranks_timeout_ms,
          "how long a checkpoint waits, from its first part, for every local "
          "rank's part before it fails naming the missing ranks");
ABSL_FLAG(uint32_t, max_connections, kDefaults.max_connections,
          "open gRPC connections at most; more are closed at once");
ABSL_FLAG(uint32_t, max_sessions, kDefaults.max_sessions,
          "trainer sessions open at once; more handshakes are refused");
ABSL_FLAG(uint64_t, layout_bytes_per_session, kDefaults.layout_bytes_per_session,
          "memory the layouts of one session may hold (DefineLayout)");
ABSL_FLAG(uint64_t, layout_bytes_total, kDefaults.layout_bytes_total,
          "memory the layouts of all sessions together may hold");
ABSL_FLAG(uint64_t, load_plan_bytes, kDefaults.load_plan_bytes,
          "memory the plans of loads in flight may hold at their peak (64 "
          "bytes per copy run; a slice narrower than the stored rows is a run "
          "per row)");
ABSL_FLAG(std::string, socket_group, kDefaults.socket_group,
          "group (name or number) whose members may use the sockets besides "
          "root and the daemon's user; empty: nobody else");
ABSL_FLAG(std::string, operator_group, kDefaults.operator_group,
          "group (name or number) whose members may list, inspect, verify, "
          "cancel and gc every user's jobs; empty: only root and the daemon's user");
ABSL_FLAG(uint64_t, load_batch_ms, kDefaults.load_batch_ms,
          "how long loads of one checkpoint wait for this node's other ranks, "
          "so bytes several ranks need are read once");
ABSL_FLAG(uint32_t, keep_last, kDefaults.keep_last,
          "keep the newest N committed checkpoints per job, delete older ones "
          "after each commit (0: keep all)");
ABSL_FLAG(uint64_t, keep_in_memory_bytes, kDefaults.keep_in_memory_bytes,
          "RAM for this node's files of recent checkpoints, so a restarted "
          "trainer restores from memory (0: off)");
ABSL_FLAG(std::string, gpu, kDefaults.gpu,
          "GPU device: auto (CUDA if built with it), cuda, simulated or off");
ABSL_FLAG(uint64_t, gpu_copy_timeout_ms, kDefaults.gpu_copy_timeout_ms,
          "longest wait for a save's GPU copies before the save fails");
ABSL_FLAG(uint32_t, gpu_pool_share_percent, kDefaults.gpu_pool_share_percent,
          "the most of the staging pool, in percent of its buffers, that one "
          "session's unfinished GPU copies may hold");
ABSL_FLAG(uint32_t, max_items_per_save, kDefaults.max_items_per_save,
          "items (tensors and byte items) one save request may name");
ABSL_FLAG(uint64_t, drain_timeout_ms, kDefaults.drain_timeout_ms,
          "on SIGTERM, how long saves in flight may go on to COMMITTED before "
          "the rest are cancelled; keep the unit's TimeoutStopSec above it");
ABSL_FLAG(std::string, log_level, kDefaults.log_level,
          "least severe log lines written: debug, info, warning or error");
ABSL_FLAG(std::string, metrics_file, kDefaults.metrics_file,
          "Prometheus metrics file for node_exporter's textfile collector "
          "(an absolute *.prom path in an existing directory), replaced "
          "atomically every --metrics_interval_ms; empty: off");
ABSL_FLAG(uint64_t, metrics_interval_ms, kDefaults.metrics_interval_ms,
          "how often --metrics_file is rewritten");
ABSL_FLAG(std::string, remote, kDefaults.remote,
          "remote (cluster) tier: s3://bucket/prefix or an absolute directory on a "
          "file system every node mounts; each checkpoint committed here is copied "
          "there and committed there once every node's part is in; empty: off");
ABSL_FLAG(std::string, remote_endpoint, kDefaults.remote_endpoint,
          "S3 server URL for --remote s3://... (e.g. http://127.0.0.1:8333)");
ABSL_FLAG(std::string, remote_region, kDefaults.remote_region, "S3 region for --remote");
ABSL_FLAG(std::string, remote_addressing, kDefaults.remote_addressing,
          "S3 addressing for --remote: virtual or path");
ABSL_FLAG(std::string, remote_credentials_file, kDefaults.remote_credentials_file,
          "S3 credentials file (AWS INI format); empty: the environment, then "
          "~/.aws/credentials and AWS_PROFILE");
ABSL_FLAG(uint64_t, remote_max_bytes_per_second, kDefaults.remote_max_bytes_per_second,
          "upload rate cap of the remote tier in bytes/s; 0: none");
ABSL_FLAG(uint64_t, remote_upload_timeout_ms, kDefaults.remote_upload_timeout_ms,
          "how long one checkpoint's upload and remote commit may take");
ABSL_FLAG(uint64_t, remote_fetch_bytes, kDefaults.remote_fetch_bytes,
          "memory for the file windows a restore from the remote tier fetches at once");
ABSL_FLAG(uint64_t, remote_fetch_resident_bytes, kDefaults.remote_fetch_resident_bytes,
          "of --remote_fetch_bytes, the bytes faulted in at start and kept, so that a "
          "restore's first windows need no zeroing of fresh pages; 0: none");
ABSL_FLAG(uint64_t, remote_part_bytes, kDefaults.remote_part_bytes,
          "size of an upload part or ranged GET of the remote tier (S3: 5 MiB to 5 GiB)");
ABSL_FLAG(uint32_t, remote_requests_in_flight, kDefaults.remote_requests_in_flight,
          "requests one file's upload or fetch runs at once (1 to 64)");
ABSL_FLAG(uint32_t, remote_keep_last, kDefaults.remote_keep_last,
          "remote retention: keep the newest N checkpoints committed in the remote "
          "tier per job, delete the older ones; 0: keep all");
ABSL_FLAG(bool, verbose, false, "log debug messages (--log_level debug)");
ABSL_FLAG(std::string, config, "",
          "config file (protobuf text format, see deploy/ckptd.conf); flags "
          "given on the command line override its keys; SIGHUP re-reads it");

namespace {

// Flags may be spelled with dashes too (--keep-in-memory-bytes, as in the
// docs of other tools): the name part of each "--flag[=value]" before a
// bare "--" gets underscores.
void AcceptDashedFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) return;
    if (arg[0] != '-') continue;
    for (char* c = arg + (arg[1] == '-' ? 2 : 1); *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}

// The names of the flags the command line gives (argv before parsing, with
// dashes already underscores). abseil 20220623 keeps
// CommandLineFlag::IsSpecifiedOnCommandLine private, so argv is read
// directly: "--name", "--name=value", "-name", and "--noname" for a bool.
// Flags read from a --flagfile are not seen here: they do not override the
// config file.
std::set<std::string>& FlagsOnCommandLine() {
  static auto* names = new std::set<std::string>();
  return *names;
}

void FindFlagsOnCommandLine(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") return;
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    const absl::string_view name = arg.substr(0, arg.find('='));
    FlagsOnCommandLine().insert(std::string(name));
    if (absl::StartsWith(name, "no")) FlagsOnCommandLine().insert(std::string(name.substr(2)));
  }
}

bool GivenOnCommandLine(absl::string_view name) {
  return FlagsOnCommandLine().count(std::string(name)) > 0;
}

// The config keys whose flags the command line gives: they win over the
// config file, at start and at every reload.
std::set<std::string> ConfigKeysOnCommandLine() {
  std::set<std::string> keys;
  const google::protobuf::Descriptor* config = ckpt::v1::Config::descriptor();
  for (int i = 0; i < config->field_count(); ++i) {
    const std::string& key = config->field(i)->name();
    if (GivenOnCommandLine(key)) keys.insert(key);
  }
  if (absl::GetFlag(FLAGS_verbose)) keys.insert("log_level");
  return keys;
}

// Sets the options whose flags the command line gives; the others keep
// the config file's value or the default (the flags' defaults are
// DaemonOptions').
void ApplyCommandLine(ckpt::DaemonOptions* options) {
#define CKPT_FROM_FLAG(name) \
  if (GivenOnCommandLine(#name)) options->name = absl::GetFlag(FLAGS_##name);
  CKPT_FROM_FLAG(socket) CKPT_FROM_FLAG(root) CKPT_FROM_FLAG(pool_bytes)
  CKPT_FROM_FLAG(buffer_bytes) CKPT_FROM_FLAG(io_workers) CKPT_FROM_FLAG(queue_depth)
  CKPT_FROM_FLAG(checksum_block_bytes) CKPT_FROM_FLAG(max_request_bytes)
  CKPT_FROM_FLAG(max_items_per_save) CKPT_FROM_FLAG(write_rate_limit)
  CKPT_FROM_FLAG(node_id) CKPT_FROM_FLAG(nodes) CKPT_FROM_FLAG(node_local_root)
  CKPT_FROM_FLAG(commit_timeout_ms)
  CKPT_FROM_FLAG(local_ranks_timeout_ms) CKPT_FROM_FLAG(load_batch_ms)
  CKPT_FROM_FLAG(max_connections) CKPT_FROM_FLAG(max_sessions)
  CKPT_FROM_FLAG(layout_bytes_per_session) CKPT_FROM_FLAG(layout_bytes_total)
  CKPT_FROM_FLAG(load_plan_bytes) CKPT_FROM_FLAG(socket_group)
  CKPT_FROM_FLAG(operator_group) CKPT_FROM_FLAG(keep_last)
  CKPT_FROM_FLAG(keep_in_memory_bytes) CKPT_FROM_FLAG(gpu)
  CKPT_FROM_FLAG(gpu_copy_timeout_ms) CKPT_FROM_FLAG(gpu_pool_share_percent)
  CKPT_FROM_FLAG(drain_timeout_ms)
  CKPT_FROM_FLAG(log_level)
  CKPT_FROM_FLAG(metrics_file) CKPT_FROM_FLAG(metrics_interval_ms)
  CKPT_FROM_FLAG(remote) CKPT_FROM_FLAG(remote_endpoint) CKPT_FROM_FLAG(remote_region)
  CKPT_FROM_FLAG(remote_addressing) CKPT_FROM_FLAG(remote_credentials_file)
  CKPT_FROM_FLAG(remote_max_bytes_per_second) CKPT_FROM_FLAG(remote_upload_timeout_ms)
  CKPT_FROM_FLAG(remote_fetch_bytes) CKPT_FROM_FLAG(remote_fetch_resident_bytes)
  CKPT_FROM_FLAG(remote_part_bytes)
  CKPT_FROM_FLAG(remote_requests_in_flight)
  CKPT_FROM_FLAG(remote_keep_last)
#undef CKPT_FROM_FLAG
  // --verbose is --log_level debug, unless --log_level is given too.
  if (absl::GetFlag(FLAGS_verbose) && !GivenOnCommandLine("log_level")) {
    options->log_level = "debug";
  }
}

// The options as the config file (if any) and the command line give them
// now, validated: at start, and again at each SIGHUP.
absl::StatusOr<ckpt::DaemonOptions> ReadOptions(const std::string& config) {
  ckpt::DaemonOptions options;
  // $CKPTD_SOCKET or an ordinary user's runtime directory, unless the
  // config file or the command line names the socket.
  options.socket = ckpt::DefaultDaemonSocket();
  ckpt::OptionOrigins origins;
  if (!config.empty()) {
    ASSIGN_OR_RETURN(ckpt::ConfigFile file, ckpt::ReadConfigFile(config));
    ckpt::ApplyConfig(file, ConfigKeysOnCommandLine(), &options, &origins);
  }
  ApplyCommandLine(&options);
  RETURN_IF_ERROR(ckpt::ValidateOptions(options, origins));
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ckptd: checkpoint sidecar daemon");
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return std::string("ckptd " CKPT_VERSION "\n"); };
  // --help lists the flags of the files whose names match the program's by
  // default, and ours live in daemon/main.cc: name the file.
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "daemon/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  AcceptDashedFlagNames(argc, argv);
  FindFlagsOnCommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const std::string config = absl::GetFlag(FLAGS_config);
  absl::StatusOr<ckpt::DaemonOptions> options = ReadOptions(config);
  if (!options.ok()) {
    ckpt::LogError("ckptd: ", options.status().message());
    return 1;
  }
  ckpt::OptionsReader reread;
  if (!config.empty()) reread = [config] { return ReadOptions(config); };

  // SIGTERM/SIGINT (stop) and SIGHUP (reload) are taken synchronously by
  // RunServer: blocked here, before any thread starts, so that every
  // thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  absl::Status status = ckpt::RunServer(*options, signals, reread);
  if (!status.ok()) {
    ckpt::LogError("ckptd: ", status.ToString());
    return 1;
  }
  return 0;
}

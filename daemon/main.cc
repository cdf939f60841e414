// ckptd: the checkpoint daemon. main only parses flags and starts the
// server (daemon/server.h does the wiring).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "common/log.h"
#include "daemon/daemon_options.h"
#include "daemon/server.h"

namespace {
const ckpt::DaemonOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, socket, kDefaults.socket,
          "gRPC Unix socket; the handshake socket is <socket>.session");
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
ABSL_FLAG(bool, verbose, false, "log debug messages");

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
  absl::ParseCommandLine(argc, argv);
  ckpt::DaemonOptions options;
  options.socket = absl::GetFlag(FLAGS_socket);
  options.root = absl::GetFlag(FLAGS_root);
  options.pool_bytes = absl::GetFlag(FLAGS_pool_bytes);
  options.buffer_bytes = absl::GetFlag(FLAGS_buffer_bytes);
  options.io_workers = absl::GetFlag(FLAGS_io_workers);
  options.queue_depth = absl::GetFlag(FLAGS_queue_depth);
  options.checksum_block_bytes = absl::GetFlag(FLAGS_checksum_block_bytes);
  options.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  options.write_rate_limit = absl::GetFlag(FLAGS_write_rate_limit);
  options.node_id = absl::GetFlag(FLAGS_node_id);
  options.nodes = absl::GetFlag(FLAGS_nodes);
  options.commit_timeout_ms = absl::GetFlag(FLAGS_commit_timeout_ms);
  options.local_ranks_timeout_ms = absl::GetFlag(FLAGS_local_ranks_timeout_ms);
  options.load_batch_ms = absl::GetFlag(FLAGS_load_batch_ms);
  options.max_connections = absl::GetFlag(FLAGS_max_connections);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.layout_bytes_per_session = absl::GetFlag(FLAGS_layout_bytes_per_session);
  options.layout_bytes_total = absl::GetFlag(FLAGS_layout_bytes_total);
  options.socket_group = absl::GetFlag(FLAGS_socket_group);
  options.operator_group = absl::GetFlag(FLAGS_operator_group);
  options.keep_last = absl::GetFlag(FLAGS_keep_last);
  options.keep_in_memory_bytes = absl::GetFlag(FLAGS_keep_in_memory_bytes);
  options.gpu = absl::GetFlag(FLAGS_gpu);
  options.gpu_copy_timeout_ms = absl::GetFlag(FLAGS_gpu_copy_timeout_ms);
  if (absl::GetFlag(FLAGS_verbose)) ckpt::SetLogLevel(ckpt::LogLevel::kDebug);

  // SIGTERM/SIGINT are taken synchronously by RunServer.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  absl::Status status = ckpt::RunServer(options, signals);
  if (!status.ok()) {
    ckpt::LogError("ckptd: ", status.ToString());
    return 1;
  }
  return 0;
}

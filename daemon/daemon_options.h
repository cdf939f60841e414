// DaemonOptions: every tunable of ckptd in one place, with its default.
// The config file's keys (proto/ckpt/v1/config.proto, daemon/config_file.h)
// override the defaults, and flags of the same name (see main.cc) given on
// the command line override the file.
#pragma once

#include <cstdint>
#include <string>

#include "common/control_socket.h"

namespace ckpt {

struct DaemonOptions {
  // gRPC socket; the handshake socket is HandshakeSocketPath(socket).
  std::string socket = kDefaultSocket;
  // Storage root: <root>/<job>/<checkpoint>/...
  std::string root = "/var/lib/ckptd";
  // Pinned staging memory; the daemon's memory bound (invariant 5).
  uint64_t pool_bytes = 512ull << 20;
  // One staging buffer = one O_DIRECT write or read.
  uint32_t buffer_bytes = 8u << 20;
  // I/O worker threads, each with its own io_uring; one data file each at a
  // time, so this many ranks stage in parallel.
  uint32_t io_workers = 8;
  // io_uring entries per worker (transfers in flight per file).
  uint32_t queue_depth = 16;
  // Granularity of the per-item XXH3 checksums in the manifest.
  uint64_t checksum_block_bytes = 1ull << 20;
  // Largest gRPC message accepted (a save request with its byte items) and
  // sent (a load's or an inspect's response; replies that would be larger
  // come in pages, daemon/response_pages.h). At most kMaxControlMessageBytes,
  // the limit clients set on their channels (common/control_socket.h says why).
  uint32_t max_request_bytes = kMaxControlMessageBytes;
  // Items (tensors + byte items) per save request.
  uint32_t max_items_per_save = 1u << 20;
  // Trainer sessions open at once; more handshakes are refused. Each holds
  // up to kDescriptorsPerSession descriptors (daemon/open_files_limit.h),
  // so with max_connections it sizes the open-files limit the daemon needs
  // at start.
  uint32_t max_sessions = 1024;
  // Memory for the layouts sessions define (DefineLayout), per session and
  // over the daemon: a DefineLayout past either fails RESOURCE_EXHAUSTED.
  // A layout's bytes are its in-memory size as the daemon holds it
  // (session/layout_budget.h); they go back once the session has ended and
  // no save uses the layout any more. A layout costs about 600 bytes per
  // item; the defaults and their reasons are LayoutLimits'.
  uint64_t layout_bytes_per_session = 256ull << 20;
  uint64_t layout_bytes_total = 1ull << 30;
  // Memory the plans of loads in flight may hold at their peak, over the
  // daemon: 64 bytes per copy run (its delivery and its one transient
  // copy), and a slice narrower than the stored rows is a run per row
  // (restore/load_plan_budget.h). A load past it fails RESOURCE_EXHAUSTED.
  // 1 GiB is 16M runs: loading every matrix of a 70B model (stored in row
  // shards) into column shards takes ~6.7M runs per rank, so a node of 2
  // ranks doing that in one round fits; 8 need ~3.2 GiB.
  uint64_t load_plan_bytes = 1ull << 30;
  // Open gRPC connections; more are closed at once (each costs a descriptor).
  uint32_t max_connections = 4096;
  // Who may connect besides root and the daemon's own user: members of this
  // group (a name or a number; empty: nobody else). Both sockets get mode
  // 0660 and this group, else 0600 (common/socket_access.h).
  std::string socket_group;
  // Members of this group (name or number; empty: none) may run operator
  // calls (list, inspect, verify, cancel, gc) on every user's jobs; others
  // only on their own (daemon/access_policy.h).
  std::string operator_group;
  // Storage write rate cap in bytes/s across the daemon; 0 = unlimited.
  // Keeps checkpoint traffic from starving the trainer's own I/O.
  uint64_t write_rate_limit = 0;
  // This daemon's node and the job's node count; every node writes its own
  // manifest and the checkpoint commits once all `nodes` manifests exist.
  uint32_t node_id = 0;
  uint32_t nodes = 1;
  // The root is this node's own disk (node-local NVMe), which no other
  // node sees: with nodes > 1 the nodes meet in the remote tier to commit
  // (storage/tree_local_commit.h), so `remote` must be set. False: with
  // nodes > 1 the root is a file system every node mounts.
  bool node_local_root = false;
  // How long a node that is durable waits for the other nodes' manifests
  // before it declares the checkpoint failed.
  uint64_t commit_timeout_ms = 600'000;
  // How long a checkpoint waits, from the first of this node's parts, for
  // every local rank (local_world_size of them) to submit its part before
  // it fails naming the missing ranks and its name is free again: a rank
  // that never connects or never calls save must not hold the others'
  // checkpoint open forever. Must be > 0.
  uint64_t local_ranks_timeout_ms = 600'000;
  // Loads of one checkpoint by this node's ranks are batched (so bytes
  // several ranks need are read once) until every local rank has asked or
  // this long after the first request.
  uint64_t load_batch_ms = 200;
  // Retention: after a checkpoint commits, keep the newest `keep_last`
  // committed checkpoints of its job and delete older ones; 0 keeps all.
  uint32_t keep_last = 0;
  // In-memory tier: RAM for this node's files of recent checkpoints, so a
  // restarted trainer restores from memory; 0 turns it off. Separate from
  // (and in addition to) the staging pool.
  uint64_t keep_in_memory_bytes = 0;
  // GPU device: auto, cuda, simulated (tests) or off (session/gpu_backend.h).
  std::string gpu = "auto";
  // How long a save's GPU copies may take, waiting for the trainer's ready
  // event included, before the save fails (a trainer that died mid-copy).
  uint64_t gpu_copy_timeout_ms = 300'000;
  // The most of the staging pool (percent of its buffers, 1..100) one
  // session's GPU copies that have not ended may hold: a trainer whose
  // stream never reaches its ready event cannot take the pool from the
  // other users (session/pool_share.h).
  uint32_t gpu_pool_share_percent = 50;
  // On SIGTERM or SIGINT, how long saves in flight may go on to COMMITTED
  // before the ones left are cancelled (daemon/save_drain.h). The systemd
  // unit's TimeoutStopSec must stay above it.
  uint64_t drain_timeout_ms = 60'000;
  // Least severe log lines written: debug, info, warning or error.
  std::string log_level = "info";
  // Prometheus metrics for node_exporter's textfile collector: this file
  // (an absolute path in an existing directory, e.g.
  // /var/lib/prometheus/node-exporter/ckptd.prom) is replaced atomically
  // every metrics_interval_ms and once more at stop (daemon/metrics_writer.h).
  // Empty (the default): no metrics file. Off by default because the
  // directory is node_exporter's and may not exist on a node without it,
  // and a hardened unit must list it in ReadWritePaths.
  std::string metrics_file;
  uint64_t metrics_interval_ms = 5000;
  // The remote (cluster) tier (storage/remote_tier.h): each checkpoint
  // committed here is copied there in the background and committed there
  // once every node's part is in. "s3://bucket/prefix", or an absolute path
  // to a directory on a file system every node mounts; empty: off.
  std::string remote;
  // For s3:// only: the server ("https://s3.us-east-1.amazonaws.com",
  // "http://127.0.0.1:8333"), its region, and "virtual" or "path" style
  // addressing (path for most S3-compatible servers).
  std::string remote_endpoint;
  std::string remote_region = "us-east-1";
  std::string remote_addressing = "virtual";
  // An S3 credentials file in the AWS INI format (the unit's
  // LoadCredential= puts one in $CREDENTIALS_DIRECTORY); empty: the
  // environment, then the shared credentials file and AWS_PROFILE.
  std::string remote_credentials_file;
  // Upload rate cap in bytes/s (0: none), and how long one checkpoint's
  // upload and remote commit may take before they fail, naming why.
  uint64_t remote_max_bytes_per_second = 0;
  uint64_t remote_upload_timeout_ms = 1'800'000;
  // Memory for the windows of remote files a restore fetches at once (a
  // window holds at most this much; files of any size restore in windows).
  uint64_t remote_fetch_bytes = 4ull << 30;
  // Of that, the bytes mapped and faulted in at start and kept, so that a
  // restore's first windows need no zeroing of fresh pages (memory the
  // daemon holds for its life when --remote is set; 0: none).
  uint64_t remote_fetch_resident_bytes = 512ull << 20;
  // Requests to the remote tier: the size of an upload part or a ranged
  // GET, and how many of them one file's upload or fetch runs at once
  // (S3: parts of 5 MiB to 5 GiB, 1 to 64 at once). An upload read from
  // disk holds that many part buffers.
  uint64_t remote_part_bytes = 16ull << 20;
  uint32_t remote_requests_in_flight = 8;
  // Remote retention (storage/remote_retention.h): after a remote commit,
  // the node that moved the job's remote LATEST keeps the newest
  // `remote_keep_last` checkpoints committed there and deletes the older
  // ones (and uncommitted remnants older than LATEST's). 0: keep all, as
  // keep_last: a delete from the cluster tier cannot be undone, and a
  // bucket may have its own lifecycle rules.
  uint32_t remote_keep_last = 0;
};

}  // namespace ckpt

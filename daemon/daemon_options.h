// DaemonOptions: every tunable of ckptd in one place, with its default.
// Flags of the same name (see main.cc) override the defaults.
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
  // sent (a load's or an inspect's response). At most kMaxControlMessageBytes,
  // the limit clients set on their channels (common/control_socket.h says why).
  uint32_t max_request_bytes = kMaxControlMessageBytes;
  // Items (tensors + byte items) per save request.
  uint32_t max_items_per_save = 1u << 20;
  uint32_t max_sessions = 1024;
  // Storage write rate cap in bytes/s across the daemon; 0 = unlimited.
  // Keeps checkpoint traffic from starving the trainer's own I/O.
  uint64_t write_rate_limit = 0;
  // This daemon's node and the job's node count; every node writes its own
  // manifest and the checkpoint commits once all `nodes` manifests exist.
  uint32_t node_id = 0;
  uint32_t nodes = 1;
  // How long a node that is durable waits for the other nodes' manifests
  // before it declares the checkpoint failed.
  uint64_t commit_timeout_ms = 600'000;
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
};

}  // namespace ckpt

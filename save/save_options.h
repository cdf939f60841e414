// SaveOptions: the tunables the save side reads, filled by the daemon from
// DaemonOptions (daemon/daemon_options.h documents each one and its default).
//
// A struct of its own so that save/ depends on nothing above it.
#pragma once

#include <cstdint>

namespace ckpt {

struct SaveOptions {
  uint32_t node_id = 0;
  uint32_t nodes = 1;
  uint64_t checksum_block_bytes = 1ull << 20;
  uint64_t commit_timeout_ms = 600'000;
  uint64_t local_ranks_timeout_ms = 600'000;
  uint32_t keep_last = 0;
  uint32_t max_items_per_save = 1u << 20;
  uint64_t write_rate_limit = 0;
  // The root is this node's own (storage/tree_local_commit.h): with
  // several nodes they commit by meeting in the remote tier.
  bool node_local_root = false;
};

}  // namespace ckpt

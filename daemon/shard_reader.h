// ShardReader: reads byte ranges of stored chunks from one data file,
// verifies them against the manifest's block checksums, and copies them
// into a peer's memory.
//
// Each requested range is widened to whole checksum blocks (so every byte
// handed to the peer is covered by a verified block), the widened ranges are
// coalesced and read with O_DIRECT in staging-buffer-sized windows, up to the
// queue depth in flight. Windows are consumed in file order, so each item's
// hasher sees its bytes in order whatever order the reads complete in. A
// mismatch fails the whole read with DataLoss naming file, item and byte
// range.
//
// Ownership: borrows everything passed to Read. Thread-safety: one call at a
// time per object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/io_queue.h"
#include "daemon/memory_source.h"
#include "daemon/staging_pool.h"

namespace ckpt {

// One range of one stored item to deliver.
struct ItemRead {
  std::string fqn;                 // for error messages
  uint64_t item_file_offset = 0;   // where the item's bytes start in the file
  uint64_t item_length = 0;
  const uint64_t* block_xxh3 = nullptr;  // the item's block checksums
  size_t block_count = 0;
  uint64_t begin = 0;              // range within the item
  uint64_t end = 0;
  uint64_t remote = 0;             // peer address for byte `begin`
};

struct ShardReadRequest {
  std::string path;
  uint64_t file_size = 0;
  uint64_t checksum_block_bytes = 0;
  // Sorted by item_file_offset; widened ranges must not overlap.
  std::vector<ItemRead> items;
  MemorySource* destination = nullptr;
};

class ShardReader {
 public:
  ShardReader(StagingPool* pool, IoQueue* queue) : pool_(pool), queue_(queue) {}
  // Returns the number of bytes read from storage.
  absl::StatusOr<uint64_t> Read(const ShardReadRequest& request);

 private:
  StagingPool* const pool_;
  IoQueue* const queue_;
};

}  // namespace ckpt

// ShardReader: reads byte ranges of stored chunks from one data file,
// verifies them against the manifest's block checksums, and copies them
// into peers' memory.
//
// Each stored item is read at most once: its deliveries (byte ranges of the
// item, each to one peer address: the runs of a reshard, and the same bytes
// for several local ranks) are served from that one read. The range an item
// needs is widened to whole checksum blocks (so every byte handed to a peer
// is covered by a verified block), the widened ranges are coalesced and read
// with O_DIRECT in staging-buffer-sized windows, up to the queue depth in
// flight. With an expected header, the file's first bytes are read too and
// must match it. Windows are consumed in file order, so each item's hasher sees its
// bytes in order whatever order the reads complete in. A window is consumed
// in cache-sized slices: a slice's deliveries go out first (one batched write
// per destination), then the slice is hashed while it is still in the
// core's cache, so the bytes cross memory once. A mismatch fails the whole
// read with DataLoss naming file, item and byte range.
//
// Staging buffers: every window borrows one; it stays with the IoPipeline
// while its read is in flight, so when Read returns, on any path, every
// buffer is back in the pool and none went back early (a queue that fails
// for good keeps the buffers of its lost reads out of the pool instead).
//
// Ownership: borrows everything passed to Read. Thread-safety: one call at a
// time per object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"
#include "session/memory_source.h"
#include "storage/storage_dir.h"

namespace ckpt {

// Bytes [begin, end) of an item, to `remote` in `destination`.
struct Delivery {
  uint64_t begin = 0;
  uint64_t end = 0;
  MemorySource* destination = nullptr;
  uint64_t remote = 0;  // peer address for byte `begin`
};

// One stored item to read, and where its bytes go.
struct ItemRead {
  std::string fqn;                 // for error messages
  uint64_t item_file_offset = 0;   // where the item's bytes start in the file
  uint64_t item_length = 0;
  const uint64_t* block_xxh3 = nullptr;  // the item's block checksums
  size_t block_count = 0;
  std::vector<Delivery> deliveries;  // non-empty, within [0, item_length)
};

struct ShardReadRequest {
  // The file: `name` in the open checkpoint directory `dir`, resolved
  // beneath it without following symlinks (storage/storage_dir.h); `path`
  // names it in messages. Without `dir`, `path` is opened as given with
  // O_NOFOLLOW (tests, and files outside a storage root).
  std::string path;
  const StorageDir* dir = nullptr;
  std::string name;
  uint64_t file_size = 0;
  uint64_t checksum_block_bytes = 0;
  // Sorted by item_file_offset, one per item.
  std::vector<ItemRead> items;
  // Optional: the bytes the file must start with (its safetensors header,
  // rebuilt from the manifest: format/data_file_header.h). They are read
  // with the items and compared before any item byte of the same window is
  // delivered; a difference is DataLoss naming the byte.
  std::string expected_header;
  // Optional: the file's bytes already in memory (a MemoryTier image of
  // file_size bytes); read from there instead of the file, verified alike.
  const char* memory_image = nullptr;
};

class ShardReader {
 public:
  ShardReader(StagingPool* pool, IoQueue* queue) : pool_(pool), queue_(queue) {}
  // Returns the number of bytes read from storage for the items (0 from a
  // memory image). The header check's own read, [0, data_start) where no
  // item's range covers it, is not counted: the figure is the read
  // amplification of the data, which dedupe accounting compares with the
  // unique bytes.
  absl::StatusOr<uint64_t> Read(const ShardReadRequest& request);

 private:
  StagingPool* const pool_;
  IoQueue* const queue_;
};

}  // namespace ckpt

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
// must match it before any item byte of the same window goes out.
//
// Verify, then deliver. The storage root is untrusted (invariant 10): no
// byte of a checksum block reaches any destination (a trainer's memory, a
// GPU, anything outside the staging buffer it was read into) before the
// whole block has been hashed and matched. So every block must lie whole in
// one window: each window ends where no block is cut (at a block boundary,
// the end of an item's range, or a byte no item needs), and the next window
// starts at the 4 KiB page holding that point, so at most one page is read
// twice (counted once). A block then needs a window of up to its size plus
// one page: MaxChecksumBlockBytes(buffer_bytes) is the largest block a pool
// can verify, and a read of larger blocks is refused before anything is
// read (FailedPrecondition). Windows are consumed in file order; each is
// handled in cache-sized slices of whole blocks, hashed and then copied out
// while still in the core's cache, so bytes cross memory about once. A
// mismatch fails the whole read with DataLoss naming file, item, block and
// byte range; bytes of that block and of every later one were not
// delivered (earlier, verified blocks may have been).
//
// GPU memory (MemorySource::PrefersLargeWrites) gets one write per window.
// From a staging buffer it ends before the buffer goes back; from a memory
// image, which stays as it is while the read runs, a window's copies run
// on the copy engine while the next window is hashed (at most two
// windows' copies outstanding), and every one has ended when Read returns.
//
// Staging buffers: every window borrows one; it stays with the IoPipeline
// while its read is in flight, so when Read returns, on any path, every
// buffer is back in the pool and none went back early (a queue that fails
// for good keeps the buffers of its lost reads out of the pool instead).
// A window never holds on to another window's buffer, so a reader holds at
// most queue-depth buffers and never waits for a buffer while it holds one.
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

// The largest checksum block that staging buffers of `buffer_bytes` can
// verify whole before delivering it: a block may start anywhere in a 4 KiB
// page, and an O_DIRECT window starts on one. Zero if the buffers are too
// small for any block. The daemon refuses options that save blocks it could
// not restore.
inline uint64_t MaxChecksumBlockBytes(uint64_t buffer_bytes) {
  return buffer_bytes > 4096 ? buffer_bytes - 4096 : 0;
}

// Bytes [begin, end) of an item, to `remote` in `destination`.
struct Delivery {
  uint64_t begin = 0;
  uint64_t end = 0;
  MemorySource* destination = nullptr;
  uint64_t remote = 0;  // peer address for byte `begin`
};

// One stored item to read, and where its bytes go. It may be a part of a
// stored item that starts on one of its checksum blocks
// (restore/read_split.h): then `item_*` and `block_xxh3` describe the part
// and `offset_in_item` says where it starts, for error messages.
struct ItemRead {
  std::string fqn;                 // for error messages
  uint64_t item_file_offset = 0;   // where the item's bytes start in the file
  uint64_t item_length = 0;
  const uint64_t* block_xxh3 = nullptr;  // the item's block checksums
  size_t block_count = 0;
  std::vector<Delivery> deliveries;  // non-empty, within [0, item_length)
  uint64_t offset_in_item = 0;       // a multiple of the checksum block size
};

// File bytes [begin, end).
struct FileRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// The bytes of `item` a read covers: the range its deliveries need, widened
// to whole checksum blocks of `block_bytes` (every delivered byte must lie
// in a verified block), in file offsets.
FileRange WidenedItemRange(const ItemRead& item, uint64_t block_bytes);

// Whether `item` lies in a file of `file_size` bytes and its deliveries in
// the item, each with a destination. The manifest's offsets and lengths are
// untrusted; a read of an item that is not is refused (InternalError).
bool ItemReadInBounds(const ItemRead& item, uint64_t file_size);

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
  // Where memory_image holds only part of the file (a window fetched from
  // the remote tier): the file offset of memory_image[0], and the end of the
  // bytes it holds. The read must lie within them (ShardReader::Extent).
  uint64_t memory_image_offset = 0;
  uint64_t memory_image_end = UINT64_MAX;  // file_size
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
  // The bytes of the file Read(request) touches (whole pages and blocks,
  // the header's bytes included), within [0, file_size): what a partial
  // memory image must hold. Checks the request as Read does.
  absl::StatusOr<FileRange> Extent(const ShardReadRequest& request) const;

 private:
  StagingPool* const pool_;
  IoQueue* const queue_;
};

}  // namespace ckpt

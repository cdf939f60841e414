#include "restore/read_split.h"

#include <algorithm>
#include <utility>

namespace ckpt {
namespace {

// Whether `request` can be split as it is: every item in bounds, with a
// delivery of at least a byte unless it has none, and the items' ranges in
// file order without overlap. One that cannot is read whole, so that
// ShardReader refuses it with the error it always gave.
bool Splittable(const ShardReadRequest& request, const std::vector<FileRange>& ranges) {
  uint64_t previous_end = 0;
  for (size_t i = 0; i < request.items.size(); ++i) {
    const ItemRead& item = request.items[i];
    if (!ItemReadInBounds(item, request.file_size) ||
        (item.item_length > 0 &&
         std::none_of(item.deliveries.begin(), item.deliveries.end(),
                      [](const Delivery& d) { return d.begin < d.end; }))) {
      return false;
    }
    if (ranges[i].begin < previous_end || ranges[i].end < ranges[i].begin) return false;
    previous_end = ranges[i].end;
  }
  return true;
}

// Bytes [begin, end) of `item` (item offsets; `begin` on one of its blocks)
// as an item of its own, appended to `part` unless no delivery falls in it.
void AddPiece(const ItemRead& item, uint64_t begin, uint64_t end, uint64_t block,
              ShardReadRequest* part) {
  ItemRead piece;
  for (const Delivery& d : item.deliveries) {
    const uint64_t from = std::max(d.begin, begin);
    const uint64_t to = std::min(d.end, end);
    if (from < to) {
      piece.deliveries.push_back({.begin = from - begin, .end = to - begin,
                                  .destination = d.destination,
                                  .remote = d.remote + (from - d.begin)});
    }
  }
  if (piece.deliveries.empty()) return;  // nothing needed here: nothing to verify
  piece.fqn = item.fqn;
  piece.item_file_offset = item.item_file_offset + begin;
  piece.item_length = end - begin;
  // A manifest with too few checksums keeps failing the same way: the
  // piece's blocks past the item's checksums have none.
  const uint64_t first = std::min<uint64_t>(begin / block, item.block_count);
  piece.block_xxh3 = item.block_xxh3 + first;
  piece.block_count = item.block_count - first;
  piece.offset_in_item = item.offset_in_item + begin;
  part->items.push_back(std::move(piece));
}

}  // namespace

std::vector<ShardReadRequest> SplitShardRead(ShardReadRequest request, size_t parts,
                                             uint64_t min_part_bytes) {
  const uint64_t block = request.checksum_block_bytes;
  std::vector<ShardReadRequest> out;
  std::vector<FileRange> ranges;
  uint64_t total = 0;
  if (block != 0) {
    ranges.reserve(request.items.size());
    for (const ItemRead& item : request.items) {
      ranges.push_back(WidenedItemRange(item, block));
      // In bounds (checked below before use), so no sum wraps.
      total += ranges.back().end - std::min(ranges.back().begin, ranges.back().end);
    }
  }
  min_part_bytes = std::max(min_part_bytes, block);
  if (parts <= 1 || block == 0 || total / 2 < min_part_bytes ||
      !Splittable(request, ranges)) {
    out.push_back(std::move(request));
    return out;
  }
  // Every part but the last gets at least `target` bytes.
  const uint64_t target = std::max(min_part_bytes, (total + parts - 1) / parts);

  uint64_t filled = 0;  // bytes in out.back()
  auto new_part = [&] {
    ShardReadRequest part;
    part.path = request.path;
    part.dir = request.dir;
    part.name = request.name;
    part.file_size = request.file_size;
    part.checksum_block_bytes = block;
    part.memory_image = request.memory_image;
    out.push_back(std::move(part));
    filled = 0;
  };
  new_part();
  for (size_t i = 0; i < request.items.size(); ++i) {
    ItemRead& item = request.items[i];
    const uint64_t base = item.item_file_offset;
    uint64_t at = ranges[i].begin;
    const uint64_t end = ranges[i].end;
    if (filled >= target && out.size() < parts) new_part();
    if (filled + (end - at) <= target || out.size() == parts) {
      filled += end - at;
      out.back().items.push_back(std::move(item));
      continue;
    }
    // Cut on the item's blocks: `at` is on one (the widened range starts on
    // a block, and so does every cut). A part takes the block that crosses
    // its target whole, so it ends up to a block over it, never under.
    while (at < end) {
      if (filled >= target && out.size() < parts) new_part();
      uint64_t cut = end;
      if (out.size() < parts && end - at > target - filled) {
        const uint64_t room = target - filled;  // > 0 here
        cut = std::min(end, at + (room + block - 1) / block * block);
      }
      AddPiece(item, at - base, cut == end ? item.item_length : cut - base, block,
               &out.back());
      filled += cut - at;
      at = cut;
    }
  }
  // A part whose pieces all had no delivery is dropped. Every item is
  // empty or has a byte to deliver, so some part is left; the first checks
  // the header (any part could: every part reads with its own plan).
  std::erase_if(out, [](const ShardReadRequest& part) { return part.items.empty(); });
  out.front().expected_header = std::move(request.expected_header);
  return out;
}

}  // namespace ckpt

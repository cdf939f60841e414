// SplitShardRead: one data file's read cut into reads of about equal size
// that several I/O workers run at once.
//
// Why: a read verifies every block it delivers (XXH3, about 7 GB/s on one
// core), so one worker reading a file from the memory tier is bound by one
// core, far below what memory or a GPU's copy engine takes (a single 4 GiB
// file of one rank restored at 6.4 GB/s into an H100: docs/BENCHMARKS.md,
// "GPU path"). Parts of one file verify on as many cores as there are
// workers.
//
// Cuts fall on checksum-block boundaries of the stored items, so every block
// is verified whole, by exactly one part, before any of its bytes is
// delivered, as in one read (restore/shard_reader.h). An item cut in two
// becomes two ItemReads, each starting on a block of the item with its own
// checksums and the deliveries clipped to it (offset_in_item keeps error
// messages in the stored item's terms). The file's expected header goes
// with the first part, which holds the file's first bytes. Parts are sized
// by the bytes they verify (each item's widened range), not the file's.
//
// Parts may read the same 4 KiB page at a cut, which costs nothing in
// memory; reads from storage are not split (loader.cc), so a node still
// reads each stored byte once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "restore/shard_reader.h"

namespace ckpt {

// Returns at most `parts` requests whose items and deliveries together are
// exactly those of `request` (the first part first); each holds at least
// `min_part_bytes` of widened range (rounded to whole blocks), except where
// the whole request holds less, which comes back whole. `request.items`
// must be sorted by file offset.
std::vector<ShardReadRequest> SplitShardRead(ShardReadRequest request, size_t parts,
                                             uint64_t min_part_bytes);

}  // namespace ckpt

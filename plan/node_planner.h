// NodePlanner: which replica writes each chunk, computed without any
// communication (invariant 3).
//
// A chunk's replica set is the list of ranks holding byte-identical copies
// (HSDP's replicate dimension, DDP, parameters or scalars every rank holds);
// a chunk that declares none is held by its rank alone. PlanRank turns one
// rank's chunks into the files this rank writes and the chunks it leaves to
// other replicas.
//
// Determinism argument. Every member of a replica set S holds, by
// definition, the same chunks with replica set S (the same fqn, offsets,
// shape and dtype; the commit cross-checks this). Everything PlanRank
// decides about S is a function of that shared list alone:
//   1. S is canonicalized (sorted, unique), and S's chunks are put in a total
//      order: bytes descending, then fqn, then offsets;
//   2. owners are assigned greedily in that order (longest processing time
//      first): each chunk goes to the member with the least bytes assigned
//      so far; ties go to the member that comes first in S rotated by a hash
//      of S, so that small sets do not all load their lowest rank;
//   3. the chunks of S that owner X writes go to one file named after X and
//      S (ReplicaFileName), in (fqn, offsets) order.
// So every member of S computes the same owner for every chunk and the same
// name, content and byte layout for every file of S, whatever the node count
// or the other sets a rank belongs to; planning a node is a pure function of
// its own registrations and costs O(n log n) in its own chunk count.
// Greedy LPT also spreads S's bytes evenly over its members (within one
// chunk of even), so no replica writes everything.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckpt/v1/control.pb.h"
#include "format/safetensors_layout.h"

namespace ckpt {

// A file this rank writes: the chunks of one replica set that it owns.
struct PlannedFile {
  std::string name;
  std::vector<uint32_t> replica_set;  // canonical (sorted, unique)
  std::vector<size_t> items;          // into the rank's items, file order
  SafetensorsLayout layout;
  uint64_t tensor_bytes = 0;
};

// A chunk this rank holds that another replica writes.
struct ForeignChunk {
  size_t item = 0;  // into the rank's items
  uint32_t owner_rank = 0;
  std::string file;  // the owner's file that holds it
};

// What this rank holds with one replica set (owned or not): what every
// member of the set must agree on.
struct ReplicaSetSummary {
  std::vector<uint32_t> ranks;  // canonical
  uint64_t chunk_count = 0;
  uint64_t chunk_list_xxh3 = 0;  // ChunkListDigest of the chunks
};

struct RankPlan {
  std::vector<PlannedFile> files;
  std::vector<ForeignChunk> foreign;
  std::vector<ReplicaSetSummary> sets;  // one per set the rank is in
  uint64_t owned_bytes = 0;
};

// Plans `items` (already validated one by one) of `rank` in a job of
// `world_size` ranks. Fails on a replica set that does not contain `rank`,
// names a rank outside the world, or repeats a rank.
absl::StatusOr<RankPlan> PlanRank(uint32_t rank, uint32_t world_size,
                                  absl::Span<const v1::TensorItem> items);

// The canonical replica set of `item` held by `rank`.
absl::StatusOr<std::vector<uint32_t>> CanonicalReplicaSet(
    const v1::TensorItem& item, uint32_t rank, uint32_t world_size);

// "shard-<owner+1>-model-00001-of-00001.safetensors" for an unreplicated
// set {owner} (DCP's name for a rank's file), else
// "shard-<owner+1>-replicas-<16 hex digits of XXH3(set)>.safetensors".
std::string ReplicaFileName(uint32_t owner, absl::Span<const uint32_t> set);

}  // namespace ckpt

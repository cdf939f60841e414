// ChunkListDigest: one XXH3 over the identities of a list of chunks.
//
// Replicas of a set must hold the same chunks. Rather than have every node
// list every chunk it leaves to another replica (at 4,096 nodes that would
// be gigabytes of manifests to read at commit), each node reports, per
// replica set, the count and this digest of the chunks it holds with that
// set; the commit checks that all nodes agree and that the chunks stored
// for the set hash to the same value.
//
// A chunk's identity is its fqn, dtype, global shape, offsets and local
// shape; the digest sorts by (fqn, offsets) first, so it does not depend on
// the order the chunks come in.
//
// Also here: the compact encoding of a replica set's ranks in manifests.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"

namespace ckpt {

struct ChunkIdentity {
  absl::string_view fqn;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  absl::Span<const uint64_t> global_shape, offsets, local_shape;
};

// Identity of a chunk held in a proto with these fields (TensorItem,
// StoredTensor).
template <typename Chunk>
ChunkIdentity IdentityOf(const Chunk& c) {
  return {c.fqn(), c.dtype(),
          {c.global_shape().data(), static_cast<size_t>(c.global_shape_size())},
          {c.offsets().data(), static_cast<size_t>(c.offsets_size())},
          {c.local_shape().data(), static_cast<size_t>(c.local_shape_size())}};
}

uint64_t ChunkListDigest(std::vector<ChunkIdentity> chunks);

// "{0,8,16} (3 ranks)", shortened past a few ranks, for error messages.
std::string DescribeReplicaSet(absl::Span<const uint32_t> ranks);
// The same for a stored set, decoding only the ranks it shows (a set of
// millions of ranks takes a few bytes stored, megabytes decoded).
std::string DescribeReplicaSet(const v1::ReplicaSet& set);

// Writes sorted `ranks` into `set` compactly (first/stride/count when they
// step evenly, else listed), and reads them back.
void EncodeReplicaRanks(absl::Span<const uint32_t> ranks, v1::ReplicaSet* set);
std::vector<uint32_t> DecodeReplicaRanks(const v1::ReplicaSet& set);

}  // namespace ckpt

// BuildNodeManifest: what one node stored for a checkpoint, once every local
// rank's files are durable.
//
// Lists the data files the node wrote with each stored chunk (block
// checksums included), the replica sets its ranks are in with the count and
// digest of the chunks each holds with them (so the commit can check that
// every replica holds the same chunks and that they were all stored), and
// the byte items. Local ranks must agree: a chunk two of them hold with a
// different dtype or shape, or a set they report different chunks for, is an
// error naming the chunk or set and the ranks.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckpt/v1/manifest.pb.h"
#include "plan/tensor_layout.h"
#include "save/shard_writer.h"

namespace ckpt {

// One local rank's durable part of the checkpoint.
struct WrittenPart {
  uint32_t rank = 0;
  const TensorLayout* tensors = nullptr;
  const std::vector<ShardWriteResult>* results = nullptr;  // per plan file
  const std::vector<v1::ByteItem>* byte_items = nullptr;
};

// `header` carries job, checkpoint, node_id, nodes, world_size,
// checksum_block_bytes and created_unix_micros; parts come in rank order.
absl::StatusOr<v1::Manifest> BuildNodeManifest(const v1::Manifest& header,
                                               absl::Span<const WrittenPart> parts);

}  // namespace ckpt

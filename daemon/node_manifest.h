// BuildNodeManifest: what one node stored for a checkpoint, once every local
// rank's files are durable.
//
// Lists the data files the node wrote with each stored chunk (block
// checksums included), a reference for every chunk a local rank holds that
// another replica writes (so the commit can check the owner stored it), and
// the byte items. Chunks that several local ranks hold must agree (dtype,
// shapes, replica set); otherwise the replicas are inconsistent and this is
// an error naming the chunk and the ranks.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckpt/v1/manifest.pb.h"
#include "daemon/shard_writer.h"
#include "daemon/tensor_layout.h"

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

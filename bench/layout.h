// Synthetic training-state layouts for the load generator and the planner
// benchmark: which chunks each rank of an HSDP job holds.
//
// A job of `world` ranks with replicate degree R shards every tensor along
// dim 0 over F = world / R ranks (FSDP within a replica group, as FSDP2
// does, uneven shards allowed) and replicates each shard over R ranks:
// rank r holds shard r % F, and its replica set is {r % F + i*F}. R = 1 is
// pure FSDP, R = world pure DDP. Every rank also holds a replicated scalar
// ("trainer.step_tensor", replica set = all ranks).
//
// Presets:
//   uniform     `tensors` float32 matrices [F*rows, 1024];
//   llama-8b    Llama-3-8B's 291 tensors (32 layers), bfloat16;
//   llama-70b   Llama-3-70B's 723 tensors (80 layers), bfloat16;
// The Llama presets keep every tensor and its shape's proportions and
// divide the large dimensions so a rank holds about `bytes_per_rank`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/v1/control.pb.h"

namespace ckpt::bench {

struct LayoutSpec {
  std::string preset = "uniform";
  uint32_t world = 1;
  uint32_t replicas = 1;
  uint32_t tensors = 16;           // uniform only
  uint64_t bytes_per_rank = 64ull << 20;
};

struct Tensor {
  std::string fqn;
  v1::DType dtype;
  std::vector<uint64_t> shape;
};

struct Chunk {
  std::string fqn;
  v1::DType dtype;
  std::vector<uint64_t> global_shape, offsets, local_shape;
  std::vector<uint32_t> replicas;  // sorted
  uint64_t bytes = 0;
};

// Checks the spec (known preset, replicas divides world, ...).
absl::Status ValidateLayoutSpec(const LayoutSpec& spec);

// The global tensors of the job.
std::vector<Tensor> GlobalTensors(const LayoutSpec& spec);

// The chunks `rank` holds, in fqn order.
std::vector<Chunk> ChunksOfRank(const LayoutSpec& spec,
                                const std::vector<Tensor>& tensors, uint32_t rank);

// Bytes of each tensor stored once: what a deduplicated checkpoint holds.
uint64_t UniqueBytes(const std::vector<Tensor>& tensors);

// A seed for the chunk's contents at `step`; replicas share it.
uint64_t ChunkSeed(const Chunk& chunk, uint32_t step);

}  // namespace ckpt::bench

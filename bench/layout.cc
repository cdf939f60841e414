#include "bench/layout.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::bench {
namespace {

struct LlamaShape {
  uint64_t hidden, intermediate, vocab, layers, kv;
};
constexpr LlamaShape kLlama8b{4096, 14336, 128256, 32, 1024};
constexpr LlamaShape kLlama70b{8192, 28672, 128256, 80, 1024};

// The three dtypes the presets use.
uint64_t ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_I64:
      return 8;
    default:
      return 4;
  }
}

uint64_t Numel(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::vector<Tensor> LlamaTensors(const LlamaShape& s, double scale) {
  // Dimensions shrink by `scale`; never below 8 (keeps every tensor real).
  auto d = [&](uint64_t n) {
    return std::max<uint64_t>(8, static_cast<uint64_t>(std::llround(n / scale)));
  };
  const uint64_t h = d(s.hidden), i = d(s.intermediate), v = d(s.vocab), kv = d(s.kv);
  const v1::DType bf16 = v1::DTYPE_BF16;
  std::vector<Tensor> out = {{"model.embed_tokens.weight", bf16, {v, h}}};
  for (uint64_t l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    out.push_back({p + "self_attn.q_proj.weight", bf16, {h, h}});
    out.push_back({p + "self_attn.k_proj.weight", bf16, {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", bf16, {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", bf16, {h, h}});
    out.push_back({p + "mlp.gate_proj.weight", bf16, {i, h}});
    out.push_back({p + "mlp.up_proj.weight", bf16, {i, h}});
    out.push_back({p + "mlp.down_proj.weight", bf16, {h, i}});
    out.push_back({p + "input_layernorm.weight", bf16, {h}});
    out.push_back({p + "post_attention_layernorm.weight", bf16, {h}});
  }
  out.push_back({"model.norm.weight", bf16, {h}});
  out.push_back({"lm_head.weight", bf16, {v, h}});
  return out;
}

uint64_t TensorBytes(const std::vector<Tensor>& tensors) {
  uint64_t total = 0;
  for (const Tensor& t : tensors) total += Numel(t.shape) * ElementBytes(t.dtype);
  return total;
}

}  // namespace

absl::Status ValidateLayoutSpec(const LayoutSpec& spec) {
  if (spec.preset != "uniform" && spec.preset != "llama-8b" &&
      spec.preset != "llama-70b") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown layout '", spec.preset, "' (uniform, llama-8b, llama-70b)"));
  }
  if (spec.world == 0 || spec.replicas == 0 || spec.world % spec.replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas ", spec.replicas, " must divide the world size ", spec.world));
  }
  if (spec.tensors == 0 || spec.bytes_per_rank == 0) {
    return absl::InvalidArgumentError("tensors and bytes per rank must be > 0");
  }
  return absl::OkStatus();
}

std::vector<Tensor> GlobalTensors(const LayoutSpec& spec) {
  const uint64_t shards = spec.world / spec.replicas;
  std::vector<Tensor> out;
  if (spec.preset == "uniform") {
    const uint64_t rows = std::max<uint64_t>(1, spec.bytes_per_rank / spec.tensors / 4096);
    for (uint32_t t = 0; t < spec.tensors; ++t) {
      out.push_back({absl::StrCat("layers.", t, ".weight"), v1::DTYPE_F32,
                     {rows * shards, 1024}});
    }
  } else {
    const LlamaShape& shape = spec.preset == "llama-8b" ? kLlama8b : kLlama70b;
    // Bytes scale with the square of the dimension divisor.
    const double full = static_cast<double>(TensorBytes(LlamaTensors(shape, 1.0)));
    const double want = static_cast<double>(spec.bytes_per_rank) * shards;
    out = LlamaTensors(shape, std::max(1.0, std::sqrt(full / want)));
  }
  out.push_back({"trainer.step_tensor", v1::DTYPE_I64, {}});
  return out;
}

std::vector<Chunk> ChunksOfRank(const LayoutSpec& spec,
                                const std::vector<Tensor>& tensors, uint32_t rank) {
  const uint32_t shards = spec.world / spec.replicas;
  const uint32_t shard = rank % shards;
  std::vector<uint32_t> group;
  for (uint32_t i = 0; i < spec.replicas; ++i) group.push_back(shard + i * shards);
  std::vector<uint32_t> everyone(spec.world);
  for (uint32_t r = 0; r < spec.world; ++r) everyone[r] = r;

  std::vector<Chunk> out;
  for (const Tensor& t : tensors) {
    Chunk c;
    c.fqn = t.fqn;
    c.dtype = t.dtype;
    c.global_shape = t.shape;
    if (t.shape.empty()) {  // a scalar every rank holds
      c.replicas = everyone;
      c.bytes = ElementBytes(t.dtype);
    } else {
      // Dim-0 shard `shard` of F, ceil-sized as FSDP2 does; may be empty.
      const uint64_t per = (t.shape[0] + shards - 1) / shards;
      const uint64_t begin = std::min(t.shape[0], per * shard);
      const uint64_t end = std::min(t.shape[0], begin + per);
      if (begin == end) continue;
      c.offsets.assign(t.shape.size(), 0);
      c.offsets[0] = begin;
      c.local_shape = t.shape;
      c.local_shape[0] = end - begin;
      c.replicas = group;
      c.bytes = Numel(c.local_shape) * ElementBytes(t.dtype);
    }
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(),
            [](const Chunk& a, const Chunk& b) { return a.fqn < b.fqn; });
  return out;
}

uint64_t UniqueBytes(const std::vector<Tensor>& tensors) { return TensorBytes(tensors); }

uint64_t ChunkSeed(const Chunk& chunk, uint32_t step) {
  const std::string key = absl::StrCat(chunk.fqn, "@", absl::StrJoin(chunk.offsets, ","));
  return XXH3_64bits(key.data(), key.size()) ^ (uint64_t{step} * 0x9e3779b97f4a7c15ull);
}

}  // namespace ckpt::bench

// make_fuzz_seeds DIR: writes the seed corpora of the fuzz targets into
// DIR/<target>/ (checked in as fuzz/corpus/). The seeds are made by the code
// the daemon saves with, not by hand: two ranks' items are planned
// (PlanRank), their node manifests built (BuildNodeManifest, with the block
// checksums of all-zero data) and merged into a COMMIT
// (MergeNodeManifests), once with both ranks on one node and once on two.
// The requests are the ones those ranks would send to save and to load
// (also resharded onto another world size).
//
//   build-asan/fuzz/make_fuzz_seeds fuzz/corpus
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/block_hasher.h"
#include "format/manifest_file.h"
#include "plan/node_planner.h"
#include "plan/tensor_layout.h"
#include "save/node_manifest.h"
#include "storage/commit_protocol.h"

namespace ckpt {
namespace {

constexpr uint64_t kBlockBytes = 16;

void Fail(const std::string& what) {
  std::fprintf(stderr, "make_fuzz_seeds: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

v1::TensorItem Item(const std::string& fqn, v1::DType dtype, std::vector<uint64_t> global,
                    std::vector<uint64_t> offsets, std::vector<uint64_t> local,
                    uint64_t element_bytes, uint64_t memory_offset,
                    std::vector<uint32_t> replicas = {}) {
  v1::TensorItem item;
  item.set_fqn(fqn);
  item.set_dtype(dtype);
  uint64_t n = element_bytes;
  for (size_t d = 0; d < global.size(); ++d) {
    item.add_global_shape(global[d]);
    item.add_offsets(offsets[d]);
    item.add_local_shape(local[d]);
    n *= local[d];
  }
  item.mutable_memory()->set_region_id(0);
  item.mutable_memory()->set_offset(memory_offset);
  item.mutable_memory()->set_length(n);
  for (uint32_t r : replicas) item.add_replica_ranks(r);
  return item;
}

// Rank `rank` of 2: rows [2r, 2r+2) of an F32 [4,4] weight, a BF16 [4]
// bias both ranks hold, an I64 scalar both hold, an empty F16 [0,3] chunk.
std::vector<v1::TensorItem> RankItems(uint32_t rank) {
  return {Item("model.w", v1::DTYPE_F32, {4, 4}, {2 * rank, 0}, {2, 4}, 4, 0),
          Item("model.b", v1::DTYPE_BF16, {4}, {0}, {4}, 2, 64, {0, 1}),
          Item("step_tensor", v1::DTYPE_I64, {}, {}, {}, 8, 128, {0, 1}),
          Item(absl::StrCat("empty.", rank), v1::DTYPE_F16, {0, 3}, {0, 0}, {0, 3}, 2,
               256)};
}

std::vector<v1::ByteItem> RankBytes(uint32_t rank) {
  v1::ByteItem step;
  step.set_fqn(absl::StrCat("rng.", rank));
  step.set_data("\x01\x02\x03");
  return {step};
}

struct RankPart {
  TensorLayout layout;
  std::vector<ShardWriteResult> results;
  std::vector<v1::ByteItem> bytes;
};

RankPart Plan(uint32_t rank) {
  RankPart part;
  part.layout.items = RankItems(rank);
  part.layout.plan = Must(PlanRank(rank, 2, part.layout.items), "PlanRank");
  for (const PlannedFile& file : part.layout.plan.files) {
    ShardWriteResult result;
    result.file_size = file.layout.file_size;
    for (size_t i : file.items) {
      const std::string zeros(part.layout.items[i].memory().length(), '\0');
      BlockHasher hasher(kBlockBytes);
      hasher.Update(zeros.data(), zeros.size());
      result.block_xxh3.push_back(hasher.Finish());
    }
    part.results.push_back(std::move(result));
  }
  part.bytes = RankBytes(rank);
  return part;
}

v1::Manifest NodeManifest(uint32_t node, uint32_t nodes,
                          const std::vector<const RankPart*>& parts,
                          const std::vector<uint32_t>& ranks) {
  v1::Manifest header;
  header.set_format_version(1);
  header.set_job("job");
  header.set_checkpoint("step-1");
  header.set_node_id(node);
  header.set_nodes(nodes);
  header.set_world_size(2);
  header.set_checksum_block_bytes(kBlockBytes);
  header.set_created_unix_micros(1'700'000'000'000'000);
  std::vector<WrittenPart> written;
  for (size_t i = 0; i < parts.size(); ++i) {
    written.push_back({ranks[i], &parts[i]->layout, &parts[i]->results, &parts[i]->bytes});
  }
  return Must(BuildNodeManifest(header, written), "BuildNodeManifest");
}

std::string WithLength(const std::string& bytes) {
  std::string out(2, '\0');
  absl::little_endian::Store16(out.data(), static_cast<uint16_t>(bytes.size()));
  return out + bytes;
}

void WriteFile(const std::filesystem::path& dir, const std::string& target,
               const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir / target);
  const std::filesystem::path path = dir / target / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) Fail(absl::StrCat("cannot write ", path.string(), ": ", std::strerror(errno)));
}

void Write(const std::filesystem::path& dir, const std::string& target, int n,
           const std::string& bytes) {
  WriteFile(dir, target, absl::StrCat("seed-", n), bytes);
}

v1::LoadRequest LoadOf(const std::vector<v1::TensorItem>& items,
                       std::vector<std::string> bytes, bool allow_missing) {
  v1::LoadRequest request;
  request.set_job("job");
  request.set_checkpoint("step-1");
  for (v1::TensorItem item : items) {
    item.clear_replica_ranks();
    *request.add_tensors() = item;
  }
  for (const std::string& b : bytes) request.add_byte_items(b);
  request.set_allow_missing(allow_missing);
  return request;
}

// The inputs of the findings the targets' checks caught, kept as seeds so
// that every run replays them (named regression-*).
void WriteRegressions(const std::filesystem::path& dir) {
  // A node manifest of 100 replica sets of 2^23 ranks each, ~1 KB: the
  // merge decoded each set into a vector of its ranks (3.2 GB in all).
  v1::Manifest wide;
  wide.set_format_version(1);
  wide.set_job("job");
  wide.set_checkpoint("c");
  wide.set_nodes(1);
  wide.set_world_size(1 << 24);
  wide.set_checksum_block_bytes(16);
  for (uint32_t i = 0; i < 100; ++i) {
    v1::ReplicaSet* set = wide.add_replica_sets();
    set->set_first(i);
    set->set_stride(1);
    set->set_count(1 << 23);
  }
  WriteFile(dir, "commit_record_fuzzer", "regression-merge-wide-sets", "\x03" + WithLength(wide.SerializeAsString()));

  // Chunks of "w" at rows [0, 4) and [2, 6) of 8: their overlaps with a
  // request for all 8 rows add up to 8, and the load left [6, 8) stale.
  // And a chunk of "w" with another rank than the first: the box
  // intersection read past the request's dimensions.
  auto index_of = [](const std::vector<v1::StoredTensor>& chunks) {
    v1::Manifest m;
    m.set_format_version(1);
    m.set_job("job");
    m.set_checkpoint("c");
    m.set_nodes(1);
    m.set_world_size(1);
    m.set_checksum_block_bytes(16);
    m.add_replica_sets()->add_ranks(0);
    v1::DataFile* f = m.add_files();
    f->set_name("a.safetensors");
    f->set_data_start(4096);
    uint64_t end = 4096;
    for (v1::StoredTensor t : chunks) {
      t.set_file_offset(end);
      end += t.length();
      *m.add_tensors() = t;
    }
    f->set_size(end);
    return m;
  };
  auto chunk = [](std::vector<uint64_t> global, std::vector<uint64_t> offsets,
                  std::vector<uint64_t> local) {
    v1::StoredTensor t;
    t.set_fqn("w");
    t.set_dtype(v1::DTYPE_F32);
    uint64_t n = 4;
    for (size_t d = 0; d < global.size(); ++d) {
      t.add_global_shape(global[d]);
      t.add_offsets(offsets[d]);
      t.add_local_shape(local[d]);
      n *= local[d];
    }
    t.set_length(n);
    t.add_block_xxh3(0);  // one 16-byte block each
    return t;
  };
  auto load_all = [](uint64_t rows) {
    v1::LoadRequest r;
    r.set_job("job");
    r.set_checkpoint("c");
    *r.add_tensors() = Item("w", v1::DTYPE_F32, {rows}, {0}, {rows}, 4, 0);
    return std::string(1, '\0') + WithLength(r.SerializeAsString());
  };
  WriteFile(dir, "load_request_fuzzer", "regression-overlap-and-hole",
        load_all(8) + index_of({chunk({8}, {0}, {4}), chunk({8}, {2}, {4})})
                          .SerializeAsString());
  WriteFile(dir, "load_request_fuzzer", "regression-chunk-of-another-rank",
        load_all(4) + index_of({chunk({4}, {0}, {2}), chunk({4, 4, 4, 4, 4, 4, 4, 4},
                                                            {0, 0, 0, 0, 0, 0, 0, 0},
                                                            {1, 1, 1, 1, 1, 1, 1, 1})})
                          .SerializeAsString());
}

int Main(const std::filesystem::path& dir) {
  const RankPart rank0 = Plan(0), rank1 = Plan(1);
  // Both ranks on one node; and one rank on each of two nodes.
  const v1::Manifest one_node = NodeManifest(0, 1, {&rank0, &rank1}, {0, 1});
  const v1::Manifest node0 = NodeManifest(0, 2, {&rank0}, {0});
  const v1::Manifest node1 = NodeManifest(1, 2, {&rank1}, {1});
  const v1::CommitRecord commit = Must(MergeNodeManifests({one_node}), "merge");
  const v1::CommitRecord commit2 = Must(MergeNodeManifests({node0, node1}), "merge");

  const std::string c = "commit_record_fuzzer";
  Write(dir, c, 0, std::string(1, '\0') + FrameMessage(kCommitMagic, commit));
  Write(dir, c, 1, "\x01" + commit.SerializeAsString());
  Write(dir, c, 2, "\x01" + commit2.SerializeAsString());
  Write(dir, c, 3, "\x02" + one_node.SerializeAsString());
  Write(dir, c, 4, "\x03" + WithLength(one_node.SerializeAsString()));
  Write(dir, c, 5, "\x03" + WithLength(node0.SerializeAsString()) +
                       WithLength(node1.SerializeAsString()));

  const std::string h = "safetensors_header_fuzzer";
  Write(dir, h, 0, std::string(1, '\0') + commit.index().SerializeAsString());
  Write(dir, h, 1, std::string(1, '\0') + commit2.index().SerializeAsString());
  // Mode 1 draws entries from any bytes.
  Write(dir, h, 2, "\x01\x02model.w\x01" + std::string(40, '\x03'));

  // The selector byte: world size 1 + (b & 7), rank (b >> 3) % world.
  const std::string s = "save_request_fuzzer";
  for (uint32_t rank : {0u, 1u}) {
    v1::SaveRequest save;
    save.set_job("job");
    save.set_checkpoint("step-1");
    for (const v1::TensorItem& item : RankItems(rank)) *save.add_tensors() = item;
    for (const v1::ByteItem& b : RankBytes(rank)) *save.add_byte_items() = b;
    Write(dir, s, static_cast<int>(rank), std::string(1, static_cast<char>(rank << 3 | 1)) +
                                              save.SerializeAsString());
  }
  v1::SaveRequest alone;  // world size 1: the whole weight
  alone.set_job("job");
  alone.set_checkpoint("step-2");
  *alone.add_tensors() = Item("model.w", v1::DTYPE_F32, {4, 4}, {0, 0}, {4, 4}, 4, 0);
  Write(dir, s, 2, std::string(1, '\0') + alone.SerializeAsString());

  const std::string l = "load_request_fuzzer";
  const std::string index = commit.index().SerializeAsString();
  const std::string index2 = commit2.index().SerializeAsString();
  auto load_seed = [&](uint8_t shape, const v1::LoadRequest& r, const std::string& idx) {
    return std::string(1, static_cast<char>(shape)) + WithLength(r.SerializeAsString()) + idx;
  };
  // As saved: rank 0 of 2.
  Write(dir, l, 0, load_seed(1, LoadOf(RankItems(0), {"rng.0", "rng.1"}, false), index));
  Write(dir, l, 1, load_seed(9, LoadOf(RankItems(1), {"rng.1"}, false), index2));
  // Resharded: one rank loads the whole weight; rank 1 of 4 loads a
  // column block across both stored chunks; something missing is skipped.
  Write(dir, l, 2,
        load_seed(0,
                  LoadOf({Item("model.w", v1::DTYPE_F32, {4, 4}, {0, 0}, {4, 4}, 4, 0)},
                         {}, false),
                  index));
  Write(dir, l, 3,
        load_seed(1 << 3 | 3,
                  LoadOf({Item("model.w", v1::DTYPE_F32, {4, 4}, {1, 2}, {3, 2}, 4, 0),
                          Item("model.b", v1::DTYPE_BF16, {4}, {1}, {2}, 2, 64),
                          Item("absent", v1::DTYPE_U8, {3}, {0}, {3}, 1, 128)},
                         {"absent"}, true),
                  index2));
  WriteRegressions(dir);
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  return ckpt::Main(argv[1]);
}

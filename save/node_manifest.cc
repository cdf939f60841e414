#include "save/node_manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "format/chunk_digest.h"

namespace ckpt {
namespace {

// Index of `ranks` in manifest.replica_sets, adding it if new. A set two
// local ranks report differently means their replicas disagree.
absl::StatusOr<uint32_t> AddReplicaSet(const ReplicaSetSummary& summary,
                                       uint32_t rank,
                                       std::map<std::vector<uint32_t>, uint32_t>* index,
                                       std::map<uint32_t, uint32_t>* reported_by,
                                       v1::Manifest* manifest) {
  auto [it, inserted] = index->emplace(summary.ranks, manifest->replica_sets_size());
  if (inserted) {
    v1::ReplicaSet* set = manifest->add_replica_sets();
    EncodeReplicaRanks(summary.ranks, set);
    set->set_chunk_count(summary.chunk_count);
    set->set_chunk_list_xxh3(summary.chunk_list_xxh3);
    (*reported_by)[it->second] = rank;
    return it->second;
  }
  const v1::ReplicaSet& known = manifest->replica_sets(it->second);
  if (known.chunk_count() != summary.chunk_count ||
      known.chunk_list_xxh3() != summary.chunk_list_xxh3) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replicas disagree: ranks ", (*reported_by)[it->second], " and ", rank,
        " hold different chunks with replica set ",
        DescribeReplicaSet(summary.ranks), " (", known.chunk_count(), " vs ",
        summary.chunk_count, " chunks)"));
  }
  return it->second;
}

bool SameShape(const v1::TensorItem& a, const v1::TensorItem& b) {
  auto eq = [](const auto& x, const auto& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end());
  };
  return a.dtype() == b.dtype() && eq(a.global_shape(), b.global_shape()) &&
         eq(a.local_shape(), b.local_shape());
}

}  // namespace

absl::StatusOr<v1::Manifest> BuildNodeManifest(
    const v1::Manifest& header, absl::Span<const WrittenPart> parts) {
  v1::Manifest manifest = header;
  std::map<std::vector<uint32_t>, uint32_t> set_index;
  std::map<uint32_t, uint32_t> set_reported_by;  // set index -> first rank
  // chunk -> (rank, item) of its first local holder, to name a chunk that
  // local replicas disagree on.
  std::map<std::string, std::pair<uint32_t, const v1::TensorItem*>> held;
  for (const WrittenPart& part : parts) {
    const TensorLayout& layout = *part.tensors;
    const RankPlan& plan = layout.plan;
    // Chunk by chunk first, so a disagreement names the chunk.
    for (const v1::TensorItem& item : layout.items) {
      const std::string key =
          absl::StrCat(item.fqn(), "@[", absl::StrJoin(item.offsets(), ","), "]");
      auto [it, inserted] = held.emplace(key, std::make_pair(part.rank, &item));
      if (!inserted && !SameShape(*it->second.second, item)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replicas disagree: ranks ", it->second.first, " and ", part.rank,
            " both hold chunk ", key, " with different dtype or shapes"));
      }
    }
    for (const ReplicaSetSummary& summary : plan.sets) {
      absl::Status added =
          AddReplicaSet(summary, part.rank, &set_index, &set_reported_by, &manifest)
              .status();
      if (!added.ok()) return added;
    }
    for (size_t f = 0; f < plan.files.size(); ++f) {
      const PlannedFile& file = plan.files[f];
      const ShardWriteResult& result = (*part.results)[f];
      const uint32_t file_index = manifest.files_size();
      v1::DataFile* out = manifest.add_files();
      out->set_name(file.name);
      out->set_size(result.file_size);
      out->set_data_start(file.layout.data_start);
      out->set_rank(part.rank);
      out->set_replica_set(set_index.at(file.replica_set));
      for (size_t k = 0; k < file.items.size(); ++k) {
        const v1::TensorItem& item = layout.items[file.items[k]];
        v1::StoredTensor* t = manifest.add_tensors();
        t->set_fqn(item.fqn());
        t->set_dtype(item.dtype());
        *t->mutable_global_shape() = item.global_shape();
        *t->mutable_offsets() = item.offsets();
        *t->mutable_local_shape() = item.local_shape();
        t->set_file_index(file_index);
        t->set_file_offset(file.layout.data_start + file.layout.data_offsets[k]);
        t->set_length(item.memory().length());
        for (uint64_t h : result.block_xxh3[k]) t->add_block_xxh3(h);
      }
    }
    for (const v1::ByteItem& item : *part.byte_items) {
      v1::StoredBytes* b = manifest.add_byte_items();
      b->set_fqn(item.fqn());
      b->set_data(item.data());
      b->set_xxh3(XXH3_64bits(item.data().data(), item.data().size()));
      b->set_rank(part.rank);
    }
  }
  return manifest;
}

}  // namespace ckpt

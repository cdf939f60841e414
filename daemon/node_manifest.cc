#include "daemon/node_manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <deque>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

struct Holder {
  uint32_t rank;
  const v1::TensorItem* item;
  const std::vector<uint32_t>* set;  // null: the rank alone
};

bool SameChunk(const Holder& a, const Holder& b) {
  auto eq = [](const auto& x, const auto& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end());
  };
  const v1::TensorItem& x = *a.item;
  const v1::TensorItem& y = *b.item;
  return x.dtype() == y.dtype() && eq(x.global_shape(), y.global_shape()) &&
         eq(x.local_shape(), y.local_shape()) && a.set != nullptr &&
         b.set != nullptr && *a.set == *b.set;
}

}  // namespace

absl::StatusOr<v1::Manifest> BuildNodeManifest(
    const v1::Manifest& header, absl::Span<const WrittenPart> parts) {
  v1::Manifest manifest = header;
  std::map<std::string, Holder> held;  // chunk -> first local holder
  // Replica sets of foreign chunks; Holders point into it, so it lives for
  // the whole function (a deque never moves its elements).
  std::deque<std::vector<uint32_t>> foreign_sets;
  for (const WrittenPart& part : parts) {
    const TensorLayout& layout = *part.tensors;
    const RankPlan& plan = layout.plan;
    // Replica set of each item, as planned (null for unreplicated items).
    std::vector<const std::vector<uint32_t>*> set_of(layout.items.size(), nullptr);
    for (size_t f = 0; f < plan.files.size(); ++f) {
      const PlannedFile& file = plan.files[f];
      const ShardWriteResult& result = (*part.results)[f];
      const uint32_t file_index = manifest.files_size();
      v1::DataFile* out = manifest.add_files();
      out->set_name(file.name);
      out->set_size(result.file_size);
      out->set_data_start(file.layout.data_start);
      out->set_rank(part.rank);
      for (size_t k = 0; k < file.items.size(); ++k) {
        const v1::TensorItem& item = layout.items[file.items[k]];
        set_of[file.items[k]] = &file.replica_set;
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
        for (uint32_t r : file.replica_set) t->add_replica_ranks(r);
      }
    }
    for (const ForeignChunk& chunk : plan.foreign) {
      const v1::TensorItem& item = layout.items[chunk.item];
      foreign_sets.emplace_back(item.replica_ranks().begin(), item.replica_ranks().end());
      std::sort(foreign_sets.back().begin(), foreign_sets.back().end());
      set_of[chunk.item] = &foreign_sets.back();
      v1::ChunkRef* ref = manifest.add_references();
      ref->set_fqn(item.fqn());
      *ref->mutable_offsets() = item.offsets();
      ref->set_dtype(item.dtype());
      *ref->mutable_global_shape() = item.global_shape();
      *ref->mutable_local_shape() = item.local_shape();
      ref->set_owner_rank(chunk.owner_rank);
      ref->set_file(chunk.file);
    }
    // Local replicas must agree with each other.
    for (size_t i = 0; i < layout.items.size(); ++i) {
      const v1::TensorItem& item = layout.items[i];
      const std::string key =
          absl::StrCat(item.fqn(), "@[", absl::StrJoin(item.offsets(), ","), "]");
      Holder holder{part.rank, &item, set_of[i]};
      auto [it, inserted] = held.emplace(key, holder);
      if (!inserted && !SameChunk(it->second, holder)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replicas disagree: ranks ", it->second.rank, " and ", part.rank,
            " both hold chunk ", key,
            " but with different dtype, shapes or replica sets"));
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

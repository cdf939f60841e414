#include "format/chunk_digest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

void Feed(XXH3_state_t* state, absl::Span<const uint64_t> dims) {
  const uint64_t n = dims.size();
  XXH3_64bits_update(state, &n, sizeof(n));
  XXH3_64bits_update(state, dims.data(), dims.size() * sizeof(uint64_t));
}

}  // namespace

uint64_t ChunkListDigest(std::vector<ChunkIdentity> chunks) {
  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkIdentity& a, const ChunkIdentity& b) {
              if (a.fqn != b.fqn) return a.fqn < b.fqn;
              return std::lexicographical_compare(a.offsets.begin(), a.offsets.end(),
                                                  b.offsets.begin(), b.offsets.end());
            });
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) std::abort();  // malloc failed
  XXH3_64bits_reset(state);
  for (const ChunkIdentity& c : chunks) {
    // Length-prefixed fields, so no two different lists feed the same bytes.
    const uint64_t fqn_length = c.fqn.size();
    const int32_t dtype = c.dtype;
    XXH3_64bits_update(state, &fqn_length, sizeof(fqn_length));
    XXH3_64bits_update(state, c.fqn.data(), c.fqn.size());
    XXH3_64bits_update(state, &dtype, sizeof(dtype));
    Feed(state, c.global_shape);
    Feed(state, c.offsets);
    Feed(state, c.local_shape);
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

namespace {
constexpr size_t kShownRanks = 6;

std::string Describe(absl::Span<const uint32_t> first, uint64_t size) {
  std::string shown = absl::StrJoin(first.subspan(0, std::min(kShownRanks, first.size())), ",");
  if (size > kShownRanks) absl::StrAppend(&shown, ",...");
  return absl::StrCat("{", shown, "} (", size, " ranks)");
}
}  // namespace

std::string DescribeReplicaSet(absl::Span<const uint32_t> ranks) {
  return Describe(ranks, ranks.size());
}

std::string DescribeReplicaSet(const v1::ReplicaSet& set) {
  if (set.count() == 0) {
    return Describe({set.ranks().data(), static_cast<size_t>(set.ranks_size())},
                    static_cast<uint64_t>(set.ranks_size()));
  }
  std::vector<uint32_t> first;
  for (uint32_t i = 0; i < set.count() && i < kShownRanks; ++i) {
    first.push_back(set.first() + set.stride() * i);
  }
  return Describe(first, set.count());
}

void EncodeReplicaRanks(absl::Span<const uint32_t> ranks, v1::ReplicaSet* set) {
  const uint32_t stride = ranks.size() >= 2 ? ranks[1] - ranks[0] : 1;
  bool even = !ranks.empty() && stride > 0;
  for (size_t i = 1; even && i < ranks.size(); ++i) {
    even = ranks[i] - ranks[i - 1] == stride;
  }
  set->clear_ranks();
  if (even) {
    set->set_first(ranks[0]);
    set->set_stride(stride);
    set->set_count(static_cast<uint32_t>(ranks.size()));
  } else {
    set->set_first(0);
    set->set_stride(0);
    set->set_count(0);
    set->mutable_ranks()->Add(ranks.begin(), ranks.end());
  }
}

std::vector<uint32_t> DecodeReplicaRanks(const v1::ReplicaSet& set) {
  if (set.count() == 0) return {set.ranks().begin(), set.ranks().end()};
  std::vector<uint32_t> ranks(set.count());
  for (uint32_t i = 0; i < set.count(); ++i) ranks[i] = set.first() + set.stride() * i;
  return ranks;
}

}  // namespace ckpt

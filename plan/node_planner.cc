#include "plan/node_planner.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "format/chunk_digest.h"

namespace ckpt {
namespace {

uint64_t SetHash(absl::Span<const uint32_t> set) {
  return XXH3_64bits(set.data(), set.size() * sizeof(uint32_t));
}

// The total order of step 1: bytes descending, then fqn, then offsets.
bool LptBefore(const v1::TensorItem& a, const v1::TensorItem& b) {
  if (a.memory().length() != b.memory().length()) {
    return a.memory().length() > b.memory().length();
  }
  if (a.fqn() != b.fqn()) return a.fqn() < b.fqn();
  return std::lexicographical_compare(a.offsets().begin(), a.offsets().end(),
                                      b.offsets().begin(), b.offsets().end());
}

// File order of step 3: fqn, then offsets.
bool FileBefore(const v1::TensorItem& a, const v1::TensorItem& b) {
  if (a.fqn() != b.fqn()) return a.fqn() < b.fqn();
  return std::lexicographical_compare(a.offsets().begin(), a.offsets().end(),
                                      b.offsets().begin(), b.offsets().end());
}

// Step 2: owner (index into `set`) of each chunk in `order`.
std::vector<size_t> AssignOwners(absl::Span<const uint32_t> set,
                                 absl::Span<const v1::TensorItem> items,
                                 const std::vector<size_t>& order) {
  const size_t m = set.size();
  const size_t rotation = SetHash(set) % m;
  // Min-heap of (bytes assigned, position in the rotated set). All loads
  // start at zero and ties go to the lower position, so only the first
  // min(chunks, m) positions can ever be chosen: the heap needs no more,
  // which keeps a set of every rank in a 32k-rank job cheap.
  using Load = std::pair<uint64_t, size_t>;
  std::vector<Load> initial;
  initial.reserve(std::min(m, order.size()));
  for (size_t p = 0; p < std::min(m, order.size()); ++p) initial.push_back({0, p});
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> loads(
      std::greater<Load>(), std::move(initial));
  std::vector<size_t> owner(order.size());
  for (size_t k = 0; k < order.size() && !loads.empty(); ++k) {
    auto [bytes, position] = loads.top();
    loads.pop();
    owner[k] = (position + rotation) % m;
    loads.push({bytes + items[order[k]].memory().length(), position});
  }
  return owner;
}

}  // namespace

std::string ReplicaFileName(uint32_t owner, absl::Span<const uint32_t> set) {
  if (set.size() == 1) {
    return absl::StrFormat("shard-%05u-model-00001-of-00001.safetensors", owner + 1);
  }
  return absl::StrFormat("shard-%05u-replicas-%016x.safetensors", owner + 1,
                         SetHash(set));
}

absl::StatusOr<std::vector<uint32_t>> CanonicalReplicaSet(
    const v1::TensorItem& item, uint32_t rank, uint32_t world_size) {
  if (item.replica_ranks().empty()) return std::vector<uint32_t>{rank};
  std::vector<uint32_t> set(item.replica_ranks().begin(), item.replica_ranks().end());
  if (!std::is_sorted(set.begin(), set.end())) std::sort(set.begin(), set.end());
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "item ", item.fqn(), ": replica set [", absl::StrJoin(item.replica_ranks(), ","),
        "] ", what));
  };
  if (std::adjacent_find(set.begin(), set.end()) != set.end()) {
    return error("repeats a rank");
  }
  if (set.back() >= world_size) {
    return error(absl::StrCat("names a rank outside world size ", world_size));
  }
  if (!std::binary_search(set.begin(), set.end(), rank)) {
    return error(absl::StrCat("does not contain the caller, rank ", rank));
  }
  return set;
}

absl::StatusOr<RankPlan> PlanRank(uint32_t rank, uint32_t world_size,
                                  absl::Span<const v1::TensorItem> items) {
  std::map<std::vector<uint32_t>, std::vector<size_t>> by_set;
  // Consecutive items usually declare the same set (a whole shard group, or
  // every rank): canonicalize each distinct declaration once, so planning
  // stays linear in the chunk count rather than chunks x set size.
  const google::protobuf::RepeatedField<uint32_t>* last_declared = nullptr;
  std::vector<size_t>* last_members = nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& declared = items[i].replica_ranks();
    if (last_declared != nullptr && !declared.empty() &&
        declared.size() == last_declared->size() &&
        std::equal(declared.begin(), declared.end(), last_declared->begin())) {
      last_members->push_back(i);
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<uint32_t> set,
                     CanonicalReplicaSet(items[i], rank, world_size));
    last_members = &by_set[std::move(set)];
    last_members->push_back(i);
    last_declared = &declared;
  }
  RankPlan plan;
  for (auto& [set, members] : by_set) {
    std::sort(members.begin(), members.end(), [&](size_t a, size_t b) {
      return LptBefore(items[a], items[b]);
    });
    const std::vector<size_t> owner = AssignOwners(set, items, members);
    std::vector<ChunkIdentity> identities;
    identities.reserve(members.size());
    for (size_t i : members) identities.push_back(IdentityOf(items[i]));
    plan.sets.push_back({set, members.size(), ChunkListDigest(std::move(identities))});
    PlannedFile file;
    file.name = ReplicaFileName(rank, set);
    file.replica_set = set;
    for (size_t k = 0; k < members.size(); ++k) {
      const uint32_t owner_rank = set[owner[k]];
      if (owner_rank == rank) {
        file.items.push_back(members[k]);
        file.tensor_bytes += items[members[k]].memory().length();
      } else {
        plan.foreign.push_back(
            {members[k], owner_rank, ReplicaFileName(owner_rank, set)});
      }
    }
    if (file.items.empty()) continue;
    std::sort(file.items.begin(), file.items.end(), [&](size_t a, size_t b) {
      return FileBefore(items[a], items[b]);
    });
    std::vector<SafetensorsEntry> entries;
    entries.reserve(file.items.size());
    for (size_t i : file.items) {
      const v1::TensorItem& item = items[i];
      entries.push_back({item.fqn(), item.dtype(),
                         {item.local_shape().begin(), item.local_shape().end()},
                         {item.offsets().begin(), item.offsets().end()},
                         item.memory().length()});
    }
    ASSIGN_OR_RETURN(file.layout, BuildSafetensorsLayout(entries));
    plan.owned_bytes += file.tensor_bytes;
    plan.files.push_back(std::move(file));
  }
  return plan;
}

}  // namespace ckpt

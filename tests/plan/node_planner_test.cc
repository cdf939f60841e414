// Tests of PlanRank: every chunk of a job is written exactly once, by an
// owner every replica computes alike without communication (invariant 3),
// with bytes spread over the replicas and DCP-compatible file names.
//
// The layouts are synthetic HSDP jobs: world W, replicate degree R, shard
// degree F = W / R. Rank r holds shard r % F of every tensor, replicated on
// {r % F + i * F : i < R}, plus a scalar every rank holds.
#include "plan/node_planner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckpt/v1/control.pb.h"

namespace ckpt {
namespace {

constexpr uint64_t kCols = 16;
constexpr uint64_t kF32Bytes = 4;

// An HSDP job shape; every rank's items are a function of it.
struct Hsdp {
  uint32_t world = 0;
  uint32_t replicate = 0;  // R
  uint32_t tensors = 0;    // T

  uint32_t shards() const { return world / replicate; }  // F

  // Rows of tensor t's chunk: a fixed pseudo-random sequence in [1, 64], so
  // chunk sizes vary (with some ties) and are the same on every rank.
  std::vector<uint64_t> ChunkRows() const {
    std::vector<uint64_t> rows;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint32_t t = 0; t < tensors; ++t) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      rows.push_back(1 + (x >> 33) % 64);
    }
    return rows;
  }

  // Bytes of every distinct chunk of the job, each counted once.
  uint64_t UniqueBytes() const {
    uint64_t total = kF32Bytes;  // the scalar
    for (uint64_t rows : ChunkRows()) total += shards() * rows * kCols * kF32Bytes;
    return total;
  }

  std::vector<v1::TensorItem> Items(uint32_t rank) const {
    const uint32_t f = shards();
    const uint32_t shard = rank % f;
    std::vector<v1::TensorItem> items;
    uint64_t region_offset = 0;
    const std::vector<uint64_t> rows = ChunkRows();
    for (uint32_t t = 0; t < tensors; ++t) {
      v1::TensorItem item;
      item.set_fqn(absl::StrCat("layers.", t, ".weight"));
      item.set_dtype(v1::DTYPE_F32);
      item.add_global_shape(f * rows[t]);
      item.add_global_shape(kCols);
      item.add_offsets(shard * rows[t]);
      item.add_offsets(0);
      item.add_local_shape(rows[t]);
      item.add_local_shape(kCols);
      const uint64_t length = rows[t] * kCols * kF32Bytes;
      item.mutable_memory()->set_region_id(1);
      item.mutable_memory()->set_offset(region_offset);
      item.mutable_memory()->set_length(length);
      region_offset += length;
      for (uint32_t i = 0; i < replicate; ++i) item.add_replica_ranks(shard + i * f);
      items.push_back(std::move(item));
    }
    v1::TensorItem scalar;
    scalar.set_fqn("step");
    scalar.set_dtype(v1::DTYPE_F32);
    scalar.mutable_memory()->set_region_id(2);
    scalar.mutable_memory()->set_length(kF32Bytes);
    for (uint32_t r = 0; r < world; ++r) scalar.add_replica_ranks(r);
    items.push_back(std::move(scalar));
    return items;
  }
};

using ChunkKey = std::pair<std::string, std::vector<uint64_t>>;

ChunkKey KeyOf(const v1::TensorItem& item) {
  return {item.fqn(), {item.offsets().begin(), item.offsets().end()}};
}

v1::TensorItem Chunk(absl::string_view fqn, uint64_t rows,
                     const std::vector<uint32_t>& replicas) {
  v1::TensorItem item;
  item.set_fqn(std::string(fqn));
  item.set_dtype(v1::DTYPE_F32);
  item.add_global_shape(rows);
  item.add_global_shape(kCols);
  item.add_offsets(0);
  item.add_offsets(0);
  item.add_local_shape(rows);
  item.add_local_shape(kCols);
  item.mutable_memory()->set_region_id(1);
  item.mutable_memory()->set_length(rows * kCols * kF32Bytes);
  for (uint32_t r : replicas) item.add_replica_ranks(r);
  return item;
}

RankPlan PlanOrFail(uint32_t rank, uint32_t world,
                    absl::Span<const v1::TensorItem> items) {
  absl::StatusOr<RankPlan> plan = PlanRank(rank, world, items);
  INFO("rank " << rank << ": " << plan.status().ToString());
  REQUIRE(plan.ok());
  return *std::move(plan);
}

// Every rank's items and plan for one job.
struct PlannedJob {
  explicit PlannedJob(const Hsdp& job) {
    for (uint32_t r = 0; r < job.world; ++r) {
      items.push_back(job.Items(r));
      plans.push_back(PlanOrFail(r, job.world, items.back()));
    }
  }
  std::vector<std::vector<v1::TensorItem>> items;
  std::vector<RankPlan> plans;
};

const std::vector<Hsdp> kJobs = {
    {8, 1, 12}, {8, 2, 12}, {8, 4, 12}, {8, 8, 12}, {6, 3, 20}, {2, 2, 40}};

// ---------------------------------------------------------------------------

TEST_CASE("Every chunk of a job has exactly one writer", "[node_planner]") {
  for (const Hsdp& job : kJobs) {
    INFO("W=" << job.world << " R=" << job.replicate << " T=" << job.tensors);
    const PlannedJob planned(job);
    std::map<ChunkKey, int> writers;
    uint64_t owned_bytes = 0;
    for (uint32_t r = 0; r < job.world; ++r) {
      const RankPlan& plan = planned.plans[r];
      uint64_t file_bytes = 0;
      for (const PlannedFile& file : plan.files) {
        for (size_t i : file.items) ++writers[KeyOf(planned.items[r][i])];
        file_bytes += file.tensor_bytes;
      }
      CHECK(plan.owned_bytes == file_bytes);
      owned_bytes += plan.owned_bytes;
      // What a rank does not write, it names as foreign: nothing is dropped.
      size_t accounted = plan.foreign.size();
      for (const PlannedFile& file : plan.files) accounted += file.items.size();
      CHECK(accounted == planned.items[r].size());
    }
    // T tensors of F shards each, plus the scalar.
    CHECK(writers.size() == size_t{job.tensors} * job.shards() + 1);
    for (const auto& [key, count] : writers) {
      INFO("chunk " << key.first);
      CHECK(count == 1);
    }
    CHECK(owned_bytes == job.UniqueBytes());
  }
}

TEST_CASE("Every replica computes the same owner and file for each chunk",
          "[node_planner]") {
  for (const Hsdp& job : kJobs) {
    INFO("W=" << job.world << " R=" << job.replicate << " T=" << job.tensors);
    const PlannedJob planned(job);
    size_t foreign_seen = 0;
    for (uint32_t r = 0; r < job.world; ++r) {
      for (const ForeignChunk& foreign : planned.plans[r].foreign) {
        ++foreign_seen;
        const v1::TensorItem& item = planned.items[r][foreign.item];
        INFO("rank " << r << " chunk " << item.fqn() << " owner "
                     << foreign.owner_rank << " file " << foreign.file);
        CHECK(foreign.owner_rank != r);
        REQUIRE(foreign.owner_rank < job.world);
        const RankPlan& owner = planned.plans[foreign.owner_rank];
        const auto file = std::find_if(
            owner.files.begin(), owner.files.end(),
            [&](const PlannedFile& f) { return f.name == foreign.file; });
        REQUIRE(file != owner.files.end());
        const bool owner_writes_it = std::any_of(
            file->items.begin(), file->items.end(), [&](size_t i) {
              return KeyOf(planned.items[foreign.owner_rank][i]) == KeyOf(item);
            });
        CHECK(owner_writes_it);
      }
    }
    // Unreplicated jobs have no foreign chunks but the scalar's.
    if (job.replicate > 1) CHECK(foreign_seen > 0);
  }
}

TEST_CASE("A rank's plan does not depend on the order of its items",
          "[node_planner]") {
  const Hsdp job{8, 2, 30};
  std::mt19937 rng(12345);
  for (uint32_t r = 0; r < job.world; ++r) {
    INFO("rank " << r);
    const std::vector<v1::TensorItem> items = job.Items(r);
    std::vector<v1::TensorItem> shuffled = items;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const RankPlan a = PlanOrFail(r, job.world, items);
    const RankPlan b = PlanOrFail(r, job.world, shuffled);

    REQUIRE(a.files.size() == b.files.size());
    CHECK(a.owned_bytes == b.owned_bytes);
    for (size_t f = 0; f < a.files.size(); ++f) {
      const PlannedFile& fa = a.files[f];
      const PlannedFile& fb = b.files[f];
      INFO("file " << fa.name);
      CHECK(fa.name == fb.name);
      CHECK(fa.replica_set == fb.replica_set);
      CHECK(fa.tensor_bytes == fb.tensor_bytes);
      REQUIRE(fa.items.size() == fb.items.size());
      for (size_t k = 0; k < fa.items.size(); ++k) {
        CHECK(KeyOf(items[fa.items[k]]) == KeyOf(shuffled[fb.items[k]]));
      }
      CHECK(fa.layout.header == fb.layout.header);
      CHECK(fa.layout.data_start == fb.layout.data_start);
      CHECK(fa.layout.data_offsets == fb.layout.data_offsets);
      CHECK(fa.layout.file_size == fb.layout.file_size);
    }
    std::set<std::tuple<ChunkKey, uint32_t, std::string>> foreign_a, foreign_b;
    for (const ForeignChunk& c : a.foreign) {
      foreign_a.insert({KeyOf(items[c.item]), c.owner_rank, c.file});
    }
    for (const ForeignChunk& c : b.foreign) {
      foreign_b.insert({KeyOf(shuffled[c.item]), c.owner_rank, c.file});
    }
    CHECK(foreign_a.size() == a.foreign.size());
    CHECK(foreign_a == foreign_b);
  }
}

TEST_CASE("A replica set's file does not depend on the rank's other sets",
          "[node_planner]") {
  // Rank 1 belongs to set {1, 5}; adding chunks of other sets it is in must
  // not change what it writes for {1, 5}.
  const std::vector<v1::TensorItem> alone = {Chunk("a", 7, {1, 5}),
                                             Chunk("b", 3, {1, 5}),
                                             Chunk("c", 9, {1, 5})};
  std::vector<v1::TensorItem> mixed = {Chunk("x", 50, {1, 2}),
                                       Chunk("y", 40, {0, 1, 2, 3})};
  mixed.insert(mixed.begin() + 1, alone.begin(), alone.end());
  mixed.push_back(Chunk("z", 5, {}));
  const RankPlan a = PlanOrFail(1, 8, alone);
  const RankPlan b = PlanOrFail(1, 8, mixed);
  const std::vector<uint32_t> set = {1, 5};
  const auto find = [&](const RankPlan& plan) {
    return std::find_if(plan.files.begin(), plan.files.end(),
                        [&](const PlannedFile& f) { return f.replica_set == set; });
  };
  const auto fa = find(a);
  const auto fb = find(b);
  REQUIRE(fa != a.files.end());
  REQUIRE(fb != b.files.end());
  CHECK(fa->name == fb->name);
  CHECK(fa->layout.header == fb->layout.header);
  CHECK(fa->tensor_bytes == fb->tensor_bytes);
  REQUIRE(fa->items.size() == fb->items.size());
  for (size_t k = 0; k < fa->items.size(); ++k) {
    CHECK(alone[fa->items[k]].fqn() == mixed[fb->items[k]].fqn());
  }
}

TEST_CASE("Write bytes are spread evenly over the members of a replica set",
          "[node_planner]") {
  SECTION("two replicas each write within one chunk of half") {
    const Hsdp job{2, 2, 64};  // one set {0, 1}; the scalar is in it too
    const PlannedJob planned(job);
    uint64_t max_chunk = 0;
    for (const v1::TensorItem& item : planned.items[0]) {
      max_chunk = std::max<uint64_t>(max_chunk, item.memory().length());
    }
    const uint64_t total = job.UniqueBytes();
    for (uint32_t r = 0; r < 2; ++r) {
      const uint64_t owned = planned.plans[r].owned_bytes;
      INFO("rank " << r << " owns " << owned << " of " << total
                   << ", max chunk " << max_chunk);
      const uint64_t deviation =
          owned * 2 > total ? owned * 2 - total : total - owned * 2;
      CHECK(deviation <= 2 * max_chunk);  // |owned - total/2| <= max_chunk
    }
    CHECK(planned.plans[0].owned_bytes + planned.plans[1].owned_bytes == total);
  }
  SECTION("bytes, not chunk counts, are balanced") {
    // One chunk of 60 rows and twelve of 5: the least-loaded member takes
    // each next chunk, so one replica writes the big chunk and the other
    // the twelve small ones.
    std::vector<v1::TensorItem> items = {Chunk("big", 60, {0, 1})};
    for (int i = 0; i < 12; ++i) {
      items.push_back(Chunk(absl::StrCat("small.", i), 5, {0, 1}));
    }
    const uint64_t half = 60 * kCols * kF32Bytes;
    for (uint32_t r = 0; r < 2; ++r) {
      const RankPlan plan = PlanOrFail(r, 2, items);
      INFO("rank " << r);
      CHECK(plan.owned_bytes == half);
      REQUIRE(plan.files.size() == 1);
      CHECK((plan.files[0].items.size() == 1 || plan.files[0].items.size() == 12));
    }
  }
  SECTION("four replicas each write something") {
    const Hsdp job{4, 4, 16};
    const PlannedJob planned(job);
    for (uint32_t r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(planned.plans[r].owned_bytes > 0);
      CHECK_FALSE(planned.plans[r].files.empty());
    }
  }
}

TEST_CASE("Small replica sets do not all load their lowest rank",
          "[node_planner]") {
  constexpr uint32_t kWorld = 32;
  int lower_owns = 0;
  int higher_owns = 0;
  for (uint32_t lo = 0; lo < 16; ++lo) {
    for (uint32_t hi = lo + 1; hi < 16; ++hi) {
      INFO("set {" << lo << ", " << hi << "}");
      const std::vector<v1::TensorItem> items = {Chunk("w", 8, {lo, hi})};
      const RankPlan plan_lo = PlanOrFail(lo, kWorld, items);
      const RankPlan plan_hi = PlanOrFail(hi, kWorld, items);
      // Exactly one of the two writes it, and both agree which.
      REQUIRE(plan_lo.files.size() + plan_hi.files.size() == 1);
      REQUIRE(plan_lo.foreign.size() + plan_hi.foreign.size() == 1);
      if (!plan_lo.files.empty()) {
        CHECK(plan_hi.foreign[0].owner_rank == lo);
        ++lower_owns;
      } else {
        CHECK(plan_lo.foreign[0].owner_rank == hi);
        ++higher_owns;
      }
    }
  }
  INFO("lower rank owns " << lower_owns << ", higher " << higher_owns);
  CHECK(lower_owns > 0);
  CHECK(higher_owns > 0);
}

TEST_CASE("Unreplicated chunks go to DCP's file name for the rank",
          "[node_planner]") {
  // No replica set and a set of just the caller mean the same thing.
  const std::vector<v1::TensorItem> items = {Chunk("a", 4, {}),
                                             Chunk("b", 2, {6})};
  const RankPlan plan = PlanOrFail(6, 8, items);
  REQUIRE(plan.files.size() == 1);
  CHECK(plan.files[0].name == "shard-00007-model-00001-of-00001.safetensors");
  CHECK(plan.files[0].replica_set == std::vector<uint32_t>{6});
  CHECK(plan.files[0].items.size() == 2);
  CHECK(plan.foreign.empty());
  CHECK(ReplicaFileName(0, std::vector<uint32_t>{0}) ==
        "shard-00001-model-00001-of-00001.safetensors");
}

TEST_CASE("Replicated chunks go to a file named after the owner and the set",
          "[node_planner]") {
  const std::regex pattern("shard-([0-9]{5})-replicas-([0-9a-f]{16})\\.safetensors");
  const Hsdp job{8, 2, 12};
  const PlannedJob planned(job);
  std::map<std::vector<uint32_t>, std::set<std::string>> hex_of_set;
  for (uint32_t r = 0; r < job.world; ++r) {
    for (const PlannedFile& file : planned.plans[r].files) {
      INFO("rank " << r << " file " << file.name);
      std::smatch match;
      REQUIRE(std::regex_match(file.name, match, pattern));
      CHECK(std::stoul(match[1].str()) == r + 1);
      hex_of_set[file.replica_set].insert(match[2].str());
      CHECK(file.name == ReplicaFileName(r, file.replica_set));
    }
    for (const ForeignChunk& foreign : planned.plans[r].foreign) {
      INFO("rank " << r << " foreign file " << foreign.file);
      std::smatch match;
      REQUIRE(std::regex_match(foreign.file, match, pattern));
      CHECK(std::stoul(match[1].str()) == foreign.owner_rank + 1);
    }
  }
  // One hash per set, whoever owns the file; distinct sets, distinct hashes.
  std::set<std::string> all_hex;
  for (const auto& [set, hexes] : hex_of_set) {
    CHECK(hexes.size() == 1);
    all_hex.insert(hexes.begin(), hexes.end());
  }
  CHECK(hex_of_set.size() == job.shards() + 1);  // 4 pairs + the scalar's set
  CHECK(all_hex.size() == hex_of_set.size());
}

// Expects PlanRank to fail with InvalidArgument naming the item's fqn.
void CheckRejected(uint32_t rank, uint32_t world, const v1::TensorItem& bad) {
  const std::vector<v1::TensorItem> items = {Chunk("fine", 2, {rank}), bad};
  const absl::StatusOr<RankPlan> plan = PlanRank(rank, world, items);
  INFO(plan.status().ToString());
  CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::string_view(plan.status().message()).find(bad.fqn()) !=
        absl::string_view::npos);
}

TEST_CASE("A replica set that does not contain the caller is rejected",
          "[node_planner]") {
  CheckRejected(2, 8, Chunk("model.not_mine", 4, {3, 4}));
}

TEST_CASE("A replica set naming a rank outside the world is rejected",
          "[node_planner]") {
  CheckRejected(2, 8, Chunk("model.too_far", 4, {2, 8}));
  CheckRejected(0, 1, Chunk("model.too_far", 4, {0, 4000000000u}));
}

TEST_CASE("A replica set that repeats a rank is rejected", "[node_planner]") {
  CheckRejected(2, 8, Chunk("model.twice", 4, {2, 5, 2}));
  CheckRejected(2, 8, Chunk("model.twice", 4, {5, 2, 5}));
}

TEST_CASE("A rank whose replicas own all its chunks writes no file",
          "[node_planner]") {
  // Two chunks over four replicas: LPT gives two members one chunk each and
  // leaves the other two with nothing to write.
  const std::vector<v1::TensorItem> items = {Chunk("a", 8, {0, 1, 2, 3}),
                                             Chunk("b", 6, {0, 1, 2, 3})};
  int idle = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    const RankPlan plan = PlanOrFail(r, 4, items);
    INFO("rank " << r);
    if (!plan.files.empty()) {
      CHECK(plan.files.size() == 1);
      CHECK(plan.files[0].items.size() == 1);
      continue;
    }
    ++idle;
    CHECK(plan.owned_bytes == 0);
    REQUIRE(plan.foreign.size() == 2);
    std::set<size_t> held;
    for (const ForeignChunk& c : plan.foreign) {
      CHECK(c.owner_rank != r);
      held.insert(c.item);
    }
    CHECK(held == std::set<size_t>{0, 1});
  }
  CHECK(idle == 2);
}

}  // namespace
}  // namespace ckpt

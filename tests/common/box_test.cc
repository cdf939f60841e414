// The resharding arithmetic: which bytes of a stored chunk land where in a
// destination box. Checked against a brute-force walk over every element.
#include "common/box.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

namespace ckpt {
namespace {

// Row-major linear index of global element `index` inside box (offsets,
// shape), or -1 if the element is outside the box.
int64_t LinearIn(const std::vector<uint64_t>& index,
                 const std::vector<uint64_t>& offsets,
                 const std::vector<uint64_t>& shape) {
  int64_t linear = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    if (index[d] < offsets[d] || index[d] >= offsets[d] + shape[d]) return -1;
    linear = linear * static_cast<int64_t>(shape[d]) +
             static_cast<int64_t>(index[d] - offsets[d]);
  }
  return linear;
}

// Every element of the global tensor in both boxes: source linear index ->
// destination linear index, found by visiting every global element.
std::map<uint64_t, uint64_t> BruteForceOverlap(
    const std::vector<uint64_t>& global, const std::vector<uint64_t>& so,
    const std::vector<uint64_t>& ss, const std::vector<uint64_t>& dof,
    const std::vector<uint64_t>& ds) {
  std::map<uint64_t, uint64_t> mapping;
  std::vector<uint64_t> index(global.size(), 0);
  while (true) {
    const int64_t s = LinearIn(index, so, ss), t = LinearIn(index, dof, ds);
    if (s >= 0 && t >= 0) mapping[s] = t;
    size_t d = global.size();
    while (d > 0) {
      --d;
      if (++index[d] < global[d]) break;
      index[d] = 0;
      if (d == 0) return mapping;
    }
    if (global.empty()) return mapping;
  }
}

// The element mapping the runs describe; fails the test if two runs write
// the same destination element or a run is not element-aligned.
std::map<uint64_t, uint64_t> Expand(const std::vector<CopyRun>& runs,
                                    uint64_t element_bytes) {
  std::map<uint64_t, uint64_t> mapping;
  std::map<uint64_t, int> written;
  for (const CopyRun& run : runs) {
    REQUIRE(run.src % element_bytes == 0);
    REQUIRE(run.dst % element_bytes == 0);
    REQUIRE(run.length % element_bytes == 0);
    REQUIRE(run.length > 0);
    for (uint64_t e = 0; e < run.length / element_bytes; ++e) {
      mapping[run.src / element_bytes + e] = run.dst / element_bytes + e;
      REQUIRE(++written[run.dst / element_bytes + e] == 1);
    }
  }
  return mapping;
}

Box BoxOf(const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& shape) {
  return Box{offsets, shape};
}

TEST_CASE("A dim-0 reshard of a matrix copies one run per chunk pair") {
  const std::vector<uint64_t> so{0, 0}, ss{4, 8}, dof{2, 0}, ds{4, 8};
  auto runs = IntersectBoxes(BoxOf(so, ss), BoxOf(dof, ds), 2);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].src == 2 * 8 * 2);  // rows 2..3 of the source chunk
  CHECK(runs[0].dst == 0);
  CHECK(runs[0].length == 2 * 8 * 2);
}

TEST_CASE("A column split copies one run per row of the overlap") {
  const std::vector<uint64_t> so{0, 0}, ss{3, 8}, dof{0, 4}, ds{3, 4};
  auto runs = IntersectBoxes(BoxOf(so, ss), BoxOf(dof, ds), 4);
  REQUIRE(runs.size() == 3);
  for (uint64_t row = 0; row < 3; ++row) {
    CHECK(runs[row].src == (row * 8 + 4) * 4);
    CHECK(runs[row].dst == row * 4 * 4);
    CHECK(runs[row].length == 4 * 4);
  }
}

TEST_CASE("Boxes that only touch at an edge do not overlap") {
  const std::vector<uint64_t> so{0, 0}, ss{2, 4}, dof{2, 0}, ds{2, 4};
  CHECK(IntersectBoxes(BoxOf(so, ss), BoxOf(dof, ds), 1).empty());
  CHECK(OverlapElements(BoxOf(so, ss), BoxOf(dof, ds)) == 0);
}

TEST_CASE("A scalar box copies its one element") {
  const std::vector<uint64_t> none;
  auto runs = IntersectBoxes(BoxOf(none, none), BoxOf(none, none), 8);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].src == 0);
  CHECK(runs[0].dst == 0);
  CHECK(runs[0].length == 8);
  CHECK(BoxElements(BoxOf(none, none)) == 1);
}

TEST_CASE("An empty box holds no elements and overlaps nothing") {
  const std::vector<uint64_t> so{0, 0}, ss{0, 4}, dof{0, 0}, ds{4, 4};
  CHECK(BoxElements(BoxOf(so, ss)) == 0);
  CHECK(OverlapElements(BoxOf(so, ss), BoxOf(dof, ds)) == 0);
  CHECK(IntersectBoxes(BoxOf(so, ss), BoxOf(dof, ds), 4).empty());
}

TEST_CASE("Intersections of random boxes copy exactly the shared elements") {
  std::mt19937_64 rng(20261122);
  auto uniform = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t rank = uniform(1, 4);
    std::vector<uint64_t> global(rank), so(rank), ss(rank), dof(rank), ds(rank);
    for (size_t d = 0; d < rank; ++d) {
      global[d] = uniform(1, 6);
      so[d] = uniform(0, global[d] - 1);
      ss[d] = uniform(1, global[d] - so[d]);
      dof[d] = uniform(0, global[d] - 1);
      ds[d] = uniform(1, global[d] - dof[d]);
    }
    const uint64_t element_bytes = uint64_t{1} << uniform(0, 3);
    const auto expected = BruteForceOverlap(global, so, ss, dof, ds);
    const auto runs = IntersectBoxes(BoxOf(so, ss), BoxOf(dof, ds), element_bytes);
    INFO("trial " << trial << " rank " << rank);
    CHECK(Expand(runs, element_bytes) == expected);
    CHECK(OverlapElements(BoxOf(so, ss), BoxOf(dof, ds)) == expected.size());
    CHECK(CountCopyRuns(BoxOf(so, ss), BoxOf(dof, ds)) == runs.size());
    // Runs are maximal: two consecutive runs never continue each other in
    // both the source and the destination.
    for (size_t i = 1; i < runs.size(); ++i) {
      CHECK_FALSE((runs[i - 1].src + runs[i - 1].length == runs[i].src &&
                   runs[i - 1].dst + runs[i - 1].length == runs[i].dst));
    }
  }
}

TEST_CASE("CountCopyRuns counts a narrow slice's rows without making them, and saturates",
          "[box]") {
  // Column 3 of a [2^40, 8] tensor: one run per row, 2^40 of them, which
  // IntersectBoxes would need 32 TiB to list.
  const std::vector<uint64_t> so = {0, 0}, ss = {uint64_t{1} << 40, 8};
  const std::vector<uint64_t> dof = {0, 3}, ds = {uint64_t{1} << 40, 1};
  CHECK(CountCopyRuns(BoxOf(so, ss), BoxOf(dof, ds)) == (uint64_t{1} << 40));
  // Whole rows merge: one run.
  const std::vector<uint64_t> rows = {uint64_t{1} << 40, 8};
  CHECK(CountCopyRuns(BoxOf(so, ss), BoxOf(so, rows)) == 1);
  // 2^40 * 2^40 rows of a 3-d slice saturate rather than wrap.
  const std::vector<uint64_t> s3 = {0, 0, 0}, e3 = {uint64_t{1} << 40, uint64_t{1} << 40, 8};
  const std::vector<uint64_t> d3 = {0, 0, 3}, f3 = {uint64_t{1} << 40, uint64_t{1} << 40, 1};
  CHECK(CountCopyRuns(BoxOf(s3, e3), BoxOf(d3, f3)) == UINT64_MAX);
}

}  // namespace
}  // namespace ckpt

// AddressRanges: overlapping and adjacent ranges merge, so a trainer that
// frees and allocates again at the addresses its allocator reuses leaves a
// set that stops growing; queries see exactly the union of what was added.
#include "session/address_ranges.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

namespace ckpt {
namespace {

TEST_CASE("AddressRanges merges overlapping and adjacent ranges and keeps "
          "apart ones separate",
          "[session]") {
  AddressRanges set;
  set.Add(100, 200);
  set.Add(300, 400);
  CHECK(set.size() == 2);
  set.Add(200, 250);  // adjacent to the first
  CHECK(set.size() == 2);
  set.Add(240, 310);  // bridges the two
  CHECK(set.size() == 1);
  set.Add(0, 0);      // empty: nothing
  set.Add(500, 400);  // reversed: nothing
  CHECK(set.size() == 1);
  CHECK(set.Overlaps(399, 400));
  CHECK_FALSE(set.Overlaps(400, 500));
  CHECK_FALSE(set.Overlaps(0, 100));
  CHECK(set.Overlaps(0, 101));
  CHECK_FALSE(set.Overlaps(150, 150));  // empty query
}

TEST_CASE("AddressRanges released and registered again at the same addresses "
          "does not grow",
          "[session]") {
  AddressRanges set;
  // A caching allocator's segments, freed and allocated again each step.
  for (int step = 0; step < 10000; ++step) {
    for (uint64_t segment = 0; segment < 8; ++segment) {
      const uint64_t base = (segment + 1) << 30;
      set.Add(base, base + (64 << 20));
      set.Add(base + (64 << 20) + 4096 * (step % 3), base + (128 << 20));
    }
  }
  CHECK(set.size() <= 16);
}

TEST_CASE("AddressRanges answers Overlaps as a list of every added range would",
          "[session]") {
  std::mt19937_64 random(7);
  AddressRanges set;
  std::vector<std::pair<uint64_t, uint64_t>> added;
  for (int i = 0; i < 300; ++i) {
    const uint64_t begin = random() % 10000;
    const uint64_t end = begin + random() % 200;
    set.Add(begin, end);
    added.emplace_back(begin, end);
    for (int q = 0; q < 20; ++q) {
      const uint64_t qb = random() % 10300;
      const uint64_t qe = qb + random() % 300;
      bool expected = false;
      for (const auto& [b, e] : added) expected = expected || (qb < e && b < qe && qb < qe);
      INFO("after " << i + 1 << " ranges, query [" << qb << ", " << qe << ")");
      REQUIRE(set.Overlaps(qb, qe) == expected);
    }
  }
}

}  // namespace
}  // namespace ckpt

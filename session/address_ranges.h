// AddressRanges: a set of addresses kept as disjoint half-open ranges,
// overlapping and adjacent ranges merged as they are added.
//
// GpuRegions remembers the ranges of released regions so that a later
// reference to one fails clearly. A trainer frees and allocates memory
// again for as long as it runs, mostly at addresses its allocator reuses,
// so a list with one entry per release would grow without end (and be
// searched once per host span of every save); merged, the set stays the
// size of the address space the trainer ever registered, in pieces, and a
// query is a map lookup.
//
// Thread-safety: none (GpuRegions holds it under its lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace ckpt {

class AddressRanges {
 public:
  // Adds [begin, end); an empty range adds nothing.
  void Add(uint64_t begin, uint64_t end);
  // Whether [begin, end) shares an address with the set (false if empty).
  bool Overlaps(uint64_t begin, uint64_t end) const;
  // Disjoint, non-adjacent ranges the set is made of.
  size_t size() const { return ranges_.size(); }

 private:
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end
};

}  // namespace ckpt

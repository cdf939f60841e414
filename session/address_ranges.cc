#include "session/address_ranges.h"

#include <algorithm>
#include <iterator>

namespace ckpt {

void AddressRanges::Add(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  // The first range that could touch [begin, end): the last one starting at
  // or before `begin`, if it reaches it, else the first after.
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin() && std::prev(it)->second >= begin) --it;
  // Swallow every range that overlaps or abuts [begin, end).
  while (it != ranges_.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_.emplace(begin, end);
}

bool AddressRanges::Overlaps(uint64_t begin, uint64_t end) const {
  if (begin >= end) return false;
  // The last range starting before `end` is the only one that can overlap
  // (the ranges are disjoint and sorted): it does if it ends after `begin`.
  auto it = ranges_.lower_bound(end);
  if (it == ranges_.begin()) return false;
  return std::prev(it)->second > begin;
}

}  // namespace ckpt

#include "common/box.h"

#include <algorithm>

namespace ckpt {

uint64_t BoxElements(const Box& box) {
  uint64_t n = 1;
  for (uint64_t d : box.shape) n *= d;
  return n;
}

uint64_t OverlapElements(const Box& a, const Box& b) {
  uint64_t n = 1;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const uint64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const uint64_t hi = std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d]);
    if (lo >= hi) return 0;
    n *= hi - lo;
  }
  return n;
}

std::vector<CopyRun> IntersectBoxes(const Box& src, const Box& dst,
                                    uint64_t element_bytes) {
  const size_t rank = src.shape.size();
  std::vector<uint64_t> lo(rank), extent(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(src.offsets[d], dst.offsets[d]);
    const uint64_t hi =
        std::min(src.offsets[d] + src.shape[d], dst.offsets[d] + dst.shape[d]);
    if (lo[d] >= hi) return {};
    extent[d] = hi - lo[d];
  }
  if (rank == 0) return {{0, 0, element_bytes}};
  // Row-major strides, in elements.
  std::vector<uint64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src.shape[d];
    dst_stride[d - 1] = dst_stride[d] * dst.shape[d];
  }
  // The run spans dims [first, rank): the last dim, plus every dim before
  // it as long as all later dims are covered whole by both boxes.
  size_t first = rank - 1;
  uint64_t run = extent[rank - 1];
  while (first > 0 && extent[first] == src.shape[first] &&
         extent[first] == dst.shape[first]) {
    --first;
    run *= extent[first];
  }
  // Iterate over the index space of dims [0, first).
  std::vector<uint64_t> index(first, 0);
  std::vector<CopyRun> runs;
  while (true) {
    uint64_t s = 0, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      const uint64_t i = lo[d] + (d < first ? index[d] : 0);
      s += (i - src.offsets[d]) * src_stride[d];
      t += (i - dst.offsets[d]) * dst_stride[d];
    }
    runs.push_back({s * element_bytes, t * element_bytes, run * element_bytes});
    size_t d = first;
    while (d > 0) {
      --d;
      if (++index[d] < extent[d]) break;
      index[d] = 0;
      if (d == 0) return runs;
    }
    if (first == 0) return runs;
  }
}

}  // namespace ckpt

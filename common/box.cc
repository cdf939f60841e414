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

namespace {

// The overlap of `src` and `dst` (same rank): where it starts and its
// extent per dim, and `first`, the outermost dim that one run spans: a run
// spans the last dim, plus every dim before it as long as all later dims
// are covered whole by both boxes. False if they do not overlap.
struct Overlap {
  std::vector<uint64_t> lo, extent;
  size_t first = 0;
};

bool OverlapOf(const Box& src, const Box& dst, Overlap* out) {
  const size_t rank = src.shape.size();
  out->lo.resize(rank);
  out->extent.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    out->lo[d] = std::max(src.offsets[d], dst.offsets[d]);
    const uint64_t hi =
        std::min(src.offsets[d] + src.shape[d], dst.offsets[d] + dst.shape[d]);
    if (out->lo[d] >= hi) return false;
    out->extent[d] = hi - out->lo[d];
  }
  if (rank == 0) return true;
  out->first = rank - 1;
  while (out->first > 0 && out->extent[out->first] == src.shape[out->first] &&
         out->extent[out->first] == dst.shape[out->first]) {
    --out->first;
  }
  return true;
}

}  // namespace

uint64_t CountCopyRuns(const Box& src, const Box& dst) {
  Overlap o;
  if (!OverlapOf(src, dst, &o)) return 0;
  uint64_t runs = 1;
  for (size_t d = 0; d < o.first; ++d) {
    if (o.extent[d] != 0 && runs > UINT64_MAX / o.extent[d]) return UINT64_MAX;
    runs *= o.extent[d];
  }
  return runs;
}

void ForEachCopyRun(const Box& src, const Box& dst, uint64_t element_bytes,
                    absl::FunctionRef<void(const CopyRun&)> visit) {
  const size_t rank = src.shape.size();
  Overlap o;
  if (!OverlapOf(src, dst, &o)) return;
  if (rank == 0) {
    visit({0, 0, element_bytes});
    return;
  }
  const std::vector<uint64_t>& lo = o.lo;
  const std::vector<uint64_t>& extent = o.extent;
  const size_t first = o.first;
  // Row-major strides, in elements.
  std::vector<uint64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src.shape[d];
    dst_stride[d - 1] = dst_stride[d] * dst.shape[d];
  }
  uint64_t run = 1;
  for (size_t d = first; d < rank; ++d) run *= extent[d];
  // Iterate over the index space of dims [0, first).
  std::vector<uint64_t> index(first, 0);
  while (true) {
    uint64_t s = 0, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      const uint64_t i = lo[d] + (d < first ? index[d] : 0);
      s += (i - src.offsets[d]) * src_stride[d];
      t += (i - dst.offsets[d]) * dst_stride[d];
    }
    visit({s * element_bytes, t * element_bytes, run * element_bytes});
    size_t d = first;
    while (d > 0) {
      --d;
      if (++index[d] < extent[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (first == 0) return;
  }
}

std::vector<CopyRun> IntersectBoxes(const Box& src, const Box& dst,
                                    uint64_t element_bytes) {
  std::vector<CopyRun> runs;
  ForEachCopyRun(src, dst, element_bytes, [&](const CopyRun& r) { runs.push_back(r); });
  return runs;
}

}  // namespace ckpt

// Row-major boxes of a global tensor and their intersections.
//
// A chunk is the box [offsets, offsets + shape) of a global tensor, stored
// row-major and contiguous. Restoring into a different sharding copies, for
// every stored chunk that overlaps a destination box, the overlap: a set of
// contiguous byte runs, each contiguous in both the source chunk and the
// destination box. Runs are as long as both layouts allow (trailing
// dimensions that both boxes cover completely merge into one run), so a
// dim-0 reshard is a single run per chunk pair.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace ckpt {

struct Box {
  absl::Span<const uint64_t> offsets;
  absl::Span<const uint64_t> shape;
};

struct CopyRun {
  uint64_t src = 0;  // byte offset in the source chunk
  uint64_t dst = 0;  // byte offset in the destination box
  uint64_t length = 0;
};

// Elements in the box (1 for a 0-d box).
uint64_t BoxElements(const Box& box);

// Elements of the intersection of two boxes of the same rank (0 if they do
// not overlap).
uint64_t OverlapElements(const Box& a, const Box& b);

// How many runs IntersectBoxes(src, dst, ·) returns, without making them:
// a load plans one per row of a narrow slice of a wide tensor, so a caller
// bounding its memory counts first. Saturates at UINT64_MAX.
uint64_t CountCopyRuns(const Box& src, const Box& dst);

// Calls `visit` with each run that copies the overlap of `src` and `dst`
// (same rank), in row-major order of the overlap (so with increasing `src`
// and `dst`); never if they do not overlap. Holds no run list: a load plan
// that must stay within its budget makes each run where it keeps it.
void ForEachCopyRun(const Box& src, const Box& dst, uint64_t element_bytes,
                    absl::FunctionRef<void(const CopyRun&)> visit);

// The runs of ForEachCopyRun as a list.
std::vector<CopyRun> IntersectBoxes(const Box& src, const Box& dst,
                                    uint64_t element_bytes);

}  // namespace ckpt

// What a layout holds in the daemon's memory: measured once it is built
// (LayoutBytes), and bounded from the request before anything is built
// (LayoutBytesBound).
//
// The layout budget (session/layout_budget.h) charges LayoutBytes. A
// DefineLayout reserves LayoutBytesBound first, so that a layout that could
// not fit is refused before the daemon builds it (before, every request
// under --max_request_bytes was built and only then refused: four refused
// 29.5 MB requests at once took ckptd from 84 MB to a 1.51 GB peak), and so
// that builds in flight count against the budget while they run.
//
// The bound follows the data structures PlanTensorLayout builds, piece by
// piece (see layout_bytes.cc); tests/session/layout_bytes_test.cc checks
// LayoutBytesBound >= LayoutBytes over varied requests.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "ckpt/v1/control.pb.h"
#include "plan/tensor_layout.h"

namespace ckpt {

// The memory `layout` holds: its items (TensorItem::SpaceUsedLong), their
// addresses and its plan (file names, headers, offsets, replica sets).
uint64_t LayoutBytes(const TensorLayout& layout);

// An upper bound of LayoutBytes of any layout that PlanTensorLayout can
// build from `tensors`, whatever rank and world size plan it. One pass over
// the items; allocates nothing.
uint64_t LayoutBytesBound(
    const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors);

}  // namespace ckpt

// Validation of one tensor item on its own: the checks save and load share.
//
// A tensor item names an fqn, a dtype, a global shape and the box of it this
// rank holds. Both a save request and a load request carry such items, and
// both must refuse the same malformed ones before planning anything, so the
// check lives here, below both.
//
// Thread-safety: a pure function of its argument.
#pragma once

#include "absl/status/status.h"
#include "ckpt/v1/control.pb.h"

namespace ckpt {

// Checks one tensor item's own consistency: a valid fqn, a known dtype,
// shapes of equal rank, the box inside the global shape, and a byte length
// equal to the box's element count times the dtype's size.
absl::Status ValidateTensorItem(const v1::TensorItem& item);

}  // namespace ckpt

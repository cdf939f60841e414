// Validation of what a rank asks to save.
//
// Everything a request can get wrong is caught here, before anything is
// queued or touches storage, so bad input changes nothing: unknown dtypes,
// shapes that disagree with each other or with the byte length, boxes
// outside the global shape, duplicate fqns, memory outside the caller's
// registered regions, too many items.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/v1/control.pb.h"
#include "plan/tensor_layout.h"
#include "session/session.h"

namespace ckpt {

// OK if a request of `count` tensor items is within `max_items`
// (--max_items_per_save), else ResourceExhausted saying both.
absl::Status CheckTensorItemCount(size_t count, uint32_t max_items);

// Validates `tensors` against the session's regions and builds the layout.
absl::StatusOr<std::shared_ptr<const TensorLayout>> PlanTensorLayout(
    const Session& session,
    const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors,
    uint32_t max_items);

// Checks byte items: valid fqns, unique among themselves and the layout's
// tensors.
absl::Status ValidateByteItems(
    const TensorLayout& layout,
    const google::protobuf::RepeatedPtrField<v1::ByteItem>& byte_items);

}  // namespace ckpt

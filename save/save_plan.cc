#include "save/save_plan.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "plan/tensor_item.h"

namespace ckpt {

absl::Status CheckTensorItemCount(size_t count, uint32_t max_items) {
  if (count > max_items) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request has ", count, " tensor items; the limit is ",
                     max_items, " (--max_items_per_save)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const TensorLayout>> PlanTensorLayout(
    const Session& session,
    const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors,
    uint32_t max_items) {
  if (!session.opened()) {
    return absl::FailedPreconditionError("call OpenSession first");
  }
  RETURN_IF_ERROR(CheckTensorItemCount(static_cast<size_t>(tensors.size()), max_items));
  auto layout = std::make_shared<TensorLayout>();
  layout->items.reserve(tensors.size());
  layout->remote.reserve(tensors.size());
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(tensors.size());
  for (const v1::TensorItem& item : tensors) {
    RETURN_IF_ERROR(ValidateTensorItem(item));
    if (!seen.insert(item.fqn()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate fqn ", item.fqn(), " in request"));
    }
    auto remote = session.Resolve(item.memory());
    if (!remote.ok()) {
      return Annotate(remote.status(), absl::StrCat("item ", item.fqn()));
    }
    layout->items.push_back(item);
    layout->remote.push_back(*remote);
  }
  ASSIGN_OR_RETURN(layout->plan, PlanRank(session.rank(), session.world_size(),
                                          layout->items));
  return std::shared_ptr<const TensorLayout>(std::move(layout));
}

absl::Status ValidateByteItems(
    const TensorLayout& layout,
    const google::protobuf::RepeatedPtrField<v1::ByteItem>& byte_items) {
  absl::flat_hash_set<absl::string_view> seen;
  for (const v1::ByteItem& item : byte_items) {
    RETURN_IF_ERROR(ValidateFqn(item.fqn()));
    if (!seen.insert(item.fqn()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate byte item fqn ", item.fqn()));
    }
  }
  for (const v1::TensorItem& item : layout.items) {
    if (seen.contains(item.fqn())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fqn ", item.fqn(), " names both a tensor and a byte item"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt

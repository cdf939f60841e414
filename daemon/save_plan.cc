#include "daemon/save_plan.h"

#include "absl/container/flat_hash_set.h"

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "daemon/dtype.h"

namespace ckpt {

absl::Status ValidateTensorItem(const v1::TensorItem& item) {
  RETURN_IF_ERROR(ValidateFqn(item.fqn()));
  auto context = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("item ", item.fqn(), ": ", what));
  };
  auto size = DTypeSize(item.dtype());
  if (!size.ok()) return context(size.status().message());
  const int rank = item.global_shape_size();
  if (item.offsets_size() != rank || item.local_shape_size() != rank) {
    return context(absl::StrCat("global shape has ", rank, " dims but offsets ",
                                item.offsets_size(), " and local shape ",
                                item.local_shape_size()));
  }
  unsigned __int128 numel = 1;
  for (int d = 0; d < rank; ++d) {
    const uint64_t g = item.global_shape(d), o = item.offsets(d),
                   l = item.local_shape(d);
    if (o > g || l > g - o) {
      return context(absl::StrCat("box [", o, ", +", l, ") of dim ", d,
                                  " is outside global size ", g));
    }
    numel *= l;
    if (numel > (unsigned __int128){1} << 62) return context("tensor too large");
  }
  const unsigned __int128 bytes = numel * *size;
  if (bytes != item.memory().length()) {
    return context(absl::StrCat("local shape and dtype make ",
                                static_cast<uint64_t>(bytes),
                                " bytes but memory length is ",
                                item.memory().length()));
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
  if (static_cast<uint64_t>(tensors.size()) > max_items) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request has ", tensors.size(), " tensor items; the limit is ", max_items));
  }
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

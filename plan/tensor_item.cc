#include "plan/tensor_item.h"

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "format/dtype.h"

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

}  // namespace ckpt

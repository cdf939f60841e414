#include "format/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

// One row per DType; the names are the safetensors dtype strings (the Rust
// crate's `Dtype` enum), which is what readers match on.
struct DTypeInfo {
  uint64_t size;
  absl::string_view safetensors_name;
};

absl::StatusOr<DTypeInfo> Lookup(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BOOL:
      return DTypeInfo{1, "BOOL"};
    case v1::DTYPE_U8:
      return DTypeInfo{1, "U8"};
    case v1::DTYPE_I8:
      return DTypeInfo{1, "I8"};
    case v1::DTYPE_I16:
      return DTypeInfo{2, "I16"};
    case v1::DTYPE_U16:
      return DTypeInfo{2, "U16"};
    case v1::DTYPE_F16:
      return DTypeInfo{2, "F16"};
    case v1::DTYPE_BF16:
      return DTypeInfo{2, "BF16"};
    case v1::DTYPE_I32:
      return DTypeInfo{4, "I32"};
    case v1::DTYPE_U32:
      return DTypeInfo{4, "U32"};
    case v1::DTYPE_F32:
      return DTypeInfo{4, "F32"};
    case v1::DTYPE_F64:
      return DTypeInfo{8, "F64"};
    case v1::DTYPE_I64:
      return DTypeInfo{8, "I64"};
    case v1::DTYPE_U64:
      return DTypeInfo{8, "U64"};
    case v1::DTYPE_F8_E4M3:
      return DTypeInfo{1, "F8_E4M3"};
    case v1::DTYPE_F8_E5M2:
      return DTypeInfo{1, "F8_E5M2"};
    case v1::DTYPE_C64:
      return DTypeInfo{8, "C64"};
    case v1::DTYPE_F8_E4M3FNUZ:
      return DTypeInfo{1, "F8_E4M3FNUZ"};
    case v1::DTYPE_F8_E5M2FNUZ:
      return DTypeInfo{1, "F8_E5M2FNUZ"};
    default:
      // DTYPE_UNSPECIFIED, and values a newer peer may send that this build
      // does not know (proto3 enums are open).
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported dtype ", static_cast<int>(dtype)));
  }
}

}  // namespace

absl::StatusOr<uint64_t> DTypeSize(v1::DType dtype) {
  absl::StatusOr<DTypeInfo> info = Lookup(dtype);
  if (!info.ok()) return info.status();
  return info->size;
}

absl::StatusOr<absl::string_view> DTypeSafetensorsName(v1::DType dtype) {
  absl::StatusOr<DTypeInfo> info = Lookup(dtype);
  if (!info.ok()) return info.status();
  return info->safetensors_name;
}

}  // namespace ckpt

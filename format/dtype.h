// Element types: sizes and safetensors names of ckpt.v1.DType.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "ckpt/v1/control.pb.h"

namespace ckpt {

// Bytes per element; InvalidArgument for DTYPE_UNSPECIFIED or unknown values.
absl::StatusOr<uint64_t> DTypeSize(v1::DType dtype);

// The safetensors dtype string ("F32", "BF16", "F8_E4M3", ...).
absl::StatusOr<absl::string_view> DTypeSafetensorsName(v1::DType dtype);

}  // namespace ckpt

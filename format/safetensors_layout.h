// The safetensors layout of one ckptd data file (format v1, docs/FORMAT.md).
//
// A data file is: an 8-byte little-endian header length N, then N bytes of
// JSON header starting with '{' and padded with spaces so that tensor data
// begins at a multiple of 4096 (O_DIRECT writes the data in place), then the
// tensors packed back to back from data offset 0 with no holes. The file
// size is exactly header + data. The JSON header has one entry per tensor
// ({"dtype","shape","data_offsets"} with offsets relative to the data start)
// and a "__metadata__" object with the keys PyTorch DCP's HuggingFace
// storage reads: "DCP_SHARDING_INFO" (a JSON string {fqn: {"saved_offsets":
// [...]}}), "DCP_VERSION" ("1.0") and "format" ("pt").
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckpt/v1/control.pb.h"

namespace ckpt {

inline constexpr uint64_t kSafetensorsAlignment = 4096;

// One tensor chunk of the file, in file order.
struct SafetensorsEntry {
  std::string fqn;                    // unique within the file
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<uint64_t> local_shape;  // the safetensors "shape"
  std::vector<uint64_t> offsets;      // saved_offsets in the global tensor
  uint64_t length = 0;                // bytes; numel(local_shape) * size
};

struct SafetensorsLayout {
  // The first data_start bytes of the file: length prefix, JSON, padding.
  std::string header;
  uint64_t data_start = 0;             // multiple of kSafetensorsAlignment
  std::vector<uint64_t> data_offsets;  // per entry, from data_start
  uint64_t file_size = 0;              // data_start + total data bytes
};

// Builds the header for `entries`. Fails (InvalidArgument) on duplicate
// fqns, an unknown dtype, a length that disagrees with shape and dtype, or
// offsets whose rank differs from the shape's.
absl::StatusOr<SafetensorsLayout> BuildSafetensorsLayout(
    absl::Span<const SafetensorsEntry> entries);


}  // namespace ckpt

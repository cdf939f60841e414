// The safetensors header a data file must have, rebuilt from the manifest.
//
// A data file's first data_start bytes (length prefix, JSON, padding) are a
// pure function of its chunks in file order (format/safetensors_layout.h):
// fqn, dtype, local shape and offsets, all of which the manifest stores for
// each chunk. So the header needs no checksum of its own: the manifest,
// covered by its frame's XXH3, determines it byte for byte. Verify and
// restore rebuild it here and compare it with the file's bytes; a flipped
// header byte (a shape, an offset, a dtype a stock safetensors reader would
// trust) is reported as damage. This holds for every checkpoint written in
// format 1, old ones included.
//
// Thread-safety: pure function.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/v1/manifest.pb.h"

namespace ckpt {

// The header of `file` whose chunks are `tensors` (any order; they are put
// in file order). DataLoss if the manifest's offsets, data start or size
// disagree with the layout the chunks make (then no header can match).
absl::StatusOr<std::string> ExpectedDataFileHeader(
    const v1::DataFile& file, std::vector<const v1::StoredTensor*> tensors);

}  // namespace ckpt

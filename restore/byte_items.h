// FindByteItem: which stored copy of a byte item a rank gets back, checked.
//
// Byte items (step counters, RNG and dataloader state) live in the COMMIT
// record's index, one copy per rank that saved one. A rank gets its own
// copy if it saved one, else any rank's (state every rank holds alike),
// and only after the copy's XXH3 matched the manifest (invariant 10: bytes
// reach a trainer only verified). Load (restore/load_plan.h) and the
// follow-up pages of a load's byte items (LoadByteItems) both go through
// here, so they cannot disagree on which copy a rank gets.
//
// Thread-safety: a function of its arguments.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/manifest.pb.h"

namespace ckpt {

// The copy of byte item `fqn` in `index` that rank `rank` loads. NotFound
// naming the checkpoint if the index has none; DataLoss naming the item
// if the copy does not match its checksum.
absl::StatusOr<const v1::StoredBytes*> FindByteItem(const v1::Manifest& index,
                                                    absl::string_view fqn,
                                                    uint32_t rank);

}  // namespace ckpt

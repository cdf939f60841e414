// Helpers that more than one of RemoteTier's source files use
// (storage/remote_tier.cc, remote_tier_reads.cc, remote_tier_resume.cc);
// not part of its interface, which is storage/remote_tier.h.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt::remote_tier_internal {

// "<job>/<checkpoint>/": where a checkpoint's objects lie in the remote
// store (the layout in remote_tier.h).
inline std::string CheckpointPrefix(const std::string& job, const std::string& checkpoint) {
  return absl::StrCat(job, "/", checkpoint, "/");
}

}  // namespace ckpt::remote_tier_internal

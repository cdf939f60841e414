// KeepImagesForever: file images (memory-tier images, remote fetch windows)
// that copies into GPU memory may still read after a read failed with an
// error HostMemoryInUse (common/status.h) says is one: they are kept for the
// daemon's life, never unmapped or reused. Used by the loader's reads from
// the memory tier (restore/loader.cc) and from the remote tier
// (restore/remote_read.cc).
//
// Thread-safety: safe from any thread.
#pragma once

#include <memory>
#include <vector>

#include "storage/memory_tier.h"

namespace ckpt {

void KeepImagesForever(const std::vector<std::shared_ptr<const FileImage>>& images);

}  // namespace ckpt

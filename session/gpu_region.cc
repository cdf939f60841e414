#include "session/gpu_region.h"

#include <utility>

#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace ckpt {

void QuarantineRegions(std::vector<std::shared_ptr<const GpuRegion>> regions) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* kept = new std::vector<std::shared_ptr<const GpuRegion>>();
  absl::MutexLock lock(&mu);
  LogError("keeping ", regions.size(), " GPU mappings whose copies did not end "
           "mapped for the daemon's life");
  for (auto& r : regions) kept->push_back(std::move(r));
}

}  // namespace ckpt

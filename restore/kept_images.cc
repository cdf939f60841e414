// KeepImagesForever (restore/kept_images.h): the images copies into GPU
// memory did not stop reading, kept for the daemon's life.
#include "restore/kept_images.h"

#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace ckpt {

void KeepImagesForever(const std::vector<std::shared_ptr<const FileImage>>& images) {
  if (images.empty()) return;
  static absl::Mutex mu(absl::kConstInit);
  static auto* kept = new std::vector<std::shared_ptr<const FileImage>>();
  absl::MutexLock lock(&mu);
  LogError("keeping ", images.size(), " memory tier images for the daemon's life: "
           "copies from them into GPU memory did not end");
  kept->insert(kept->end(), images.begin(), images.end());
}

}  // namespace ckpt

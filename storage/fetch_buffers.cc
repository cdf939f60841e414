#include "storage/fetch_buffers.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

void Unmap(const std::vector<std::pair<char*, uint64_t>>& mappings) {
  for (const auto& [mapping, capacity] : mappings) ::munmap(mapping, capacity);
}

}  // namespace

FetchBuffers::~FetchBuffers() {
  absl::MutexLock lock(&mu_);
  for (const Spare& s : spares_) ::munmap(s.mapping, s.capacity);
}

absl::StatusOr<std::shared_ptr<FileImage>> FetchBuffers::Take(uint64_t size, bool wait,
                                                              absl::Time deadline) {
  if (size == 0 || size > budget_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(size, " bytes, and fetches take 1 to ", budget_, " bytes"));
  }
  std::optional<Spare> reused;
  std::vector<std::pair<char*, uint64_t>> dropped;  // unmapped outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ + size <= budget_; };
    if (!wait && !fits()) return std::shared_ptr<FileImage>();
    if (!mu_.AwaitWithDeadline(absl::Condition(&fits), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "other fetches held the ", budget_, " bytes until the deadline"));
    }
    // The smallest spare that holds `size` within the budget, else the
    // largest smaller one, to be grown to `size` (the windows of one
    // restore differ by a few pages: a spare a page too small is still
    // worth its pages).
    auto holds = [&](const Spare& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return s.capacity >= size && held_ + s.capacity <= budget_;
    };
    auto best = spares_.end();
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      if (holds(*it) && (best == spares_.end() || it->capacity < best->capacity)) best = it;
    }
    if (best == spares_.end()) {
      for (auto it = spares_.begin(); it != spares_.end(); ++it) {
        if (it->capacity < size && (best == spares_.end() || it->capacity > best->capacity)) {
          best = it;
        }
      }
    }
    if (best != spares_.end()) {
      reused = *best;
      spares_.erase(best);
      spare_bytes_ -= reused->capacity;
    }
    const uint64_t capacity = reused.has_value() ? std::max(reused->capacity, size) : size;
    held_ += capacity;
    // Spares go, largest first, until the images and they fit the budget.
    std::sort(spares_.begin(), spares_.end(),
              [](const Spare& a, const Spare& b) { return a.capacity < b.capacity; });
    while (held_ + spare_bytes_ > budget_ && !spares_.empty()) {
      dropped.emplace_back(spares_.back().mapping, spares_.back().capacity);
      spare_bytes_ -= spares_.back().capacity;
      spares_.pop_back();
    }
  }
  Unmap(dropped);
  std::unique_ptr<FileImage> image;
  if (reused.has_value() && reused->capacity < size) {
    // Grown in place or moved, its pages kept; only the new tail is fresh.
    void* grown = ::mremap(reused->mapping, reused->capacity, size, MREMAP_MAYMOVE);
    if (grown == MAP_FAILED) {
      ::munmap(reused->mapping, reused->capacity);
      reused.reset();
    } else {
      reused->mapping = static_cast<char*>(grown);
      reused->capacity = size;
    }
  }
  image = reused.has_value()
              ? std::make_unique<FileImage>(reused->mapping, reused->capacity, size)
              : std::make_unique<FileImage>(size);
  if (image->data() == nullptr) {
    absl::MutexLock lock(&mu_);
    held_ -= size;
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes"));
  }
  if (!reused.has_value()) image->AdviseHugePages();
  return std::shared_ptr<FileImage>(
      image.release(), [self = shared_from_this()](FileImage* done) { self->Return(done); });
}

void FetchBuffers::Return(FileImage* image) {
  const uint64_t capacity = image->capacity();
  char* mapping = image->ReleaseMapping();
  delete image;
  absl::MutexLock lock(&mu_);
  held_ -= capacity;
  if (mapping != nullptr) {
    spares_.push_back({mapping, capacity});
    spare_bytes_ += capacity;
  }
}

void FetchBuffers::Trim() {
  std::vector<std::pair<char*, uint64_t>> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (held_ > 0) return;
    for (const Spare& s : spares_) dropped.emplace_back(s.mapping, s.capacity);
    spares_.clear();
    spare_bytes_ = 0;
  }
  Unmap(dropped);
}

std::pair<uint64_t, uint64_t> FetchBuffers::HeldAndSpare() const {
  absl::MutexLock lock(&mu_);
  return {held_, spare_bytes_};
}

}  // namespace ckpt

#include "storage/fetch_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace ckpt {
namespace {

void Unmap(const std::vector<std::pair<char*, uint64_t>>& mappings) {
  for (const auto& [mapping, capacity] : mappings) ::munmap(mapping, capacity);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

// A resident spare: huge pages advised (as Take's fresh windows are), then
// every page faulted in writable now. MADV_POPULATE_WRITE where the kernel
// has it (EINVAL before 5.14), else one write per page. Null if it cannot
// be mapped or populated (memory short, a memcg limit: ENOMEM).
char* MapResident(uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  char* mapping = static_cast<char*>(p);
  ::madvise(mapping, bytes, MADV_HUGEPAGE);  // advice only: small pages work too
  if (::madvise(mapping, bytes, MADV_POPULATE_WRITE) == 0) return mapping;
  if (errno != EINVAL) {
    ::munmap(mapping, bytes);
    return nullptr;
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (uint64_t offset = 0; offset < bytes; offset += page) mapping[offset] = 0;
  return mapping;
}

}  // namespace

uint64_t FetchBuffers::MakeResident(uint64_t bytes, uint64_t piece,
                                    const std::atomic<bool>& stop) {
  if (piece == 0) return 0;
  const uint64_t pieces = std::min(bytes, budget_) / piece;
  uint64_t added = 0;
  for (uint64_t i = 0; i < pieces && !stop.load(); ++i) {
    // Faulted in before any fetch can see it: nothing else touches it.
    char* mapping = MapResident(piece);
    if (mapping == nullptr) {
      LogWarning("remote fetches: ", added, " of the ", pieces * piece,
                 " resident bytes asked for could be mapped and faulted in (",
                 std::strerror(errno), "); restores zero the rest of their windows' pages");
      break;
    }
    absl::MutexLock lock(&mu_);
    if (held_ + spare_bytes_ + piece > budget_) {
      ::munmap(mapping, piece);
      break;
    }
    spares_.push_back({mapping, piece});
    spare_bytes_ += piece;
    resident_ += piece;
    added += piece;
  }
  return added;
}

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
    // The largest go first; what is left within the resident bytes stays.
    std::sort(spares_.begin(), spares_.end(),
              [](const Spare& a, const Spare& b) { return a.capacity < b.capacity; });
    while (spare_bytes_ > resident_ && !spares_.empty()) {
      dropped.emplace_back(spares_.back().mapping, spares_.back().capacity);
      spare_bytes_ -= spares_.back().capacity;
      spares_.pop_back();
    }
  }
  Unmap(dropped);
}

std::pair<uint64_t, uint64_t> FetchBuffers::HeldAndSpare() const {
  absl::MutexLock lock(&mu_);
  return {held_, spare_bytes_};
}

}  // namespace ckpt

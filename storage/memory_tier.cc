#include "storage/memory_tier.h"

#include <sys/mman.h>

#include <vector>

#include "common/log.h"

namespace ckpt {

FileImage::FileImage(uint64_t size) : size_(size) {
  void* p = mmap(nullptr, std::max<uint64_t>(size, 1), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) data_ = static_cast<char*>(p);
}

FileImage::~FileImage() {
  if (pinned_by_ != nullptr) pinned_by_->Unpin(data_, size_);
  if (data_ != nullptr) munmap(data_, std::max<uint64_t>(size_, 1));
}

void FileImage::PinWith(ImagePinner* pinner) {
  if (pinned_by_ != nullptr || data_ == nullptr || size_ == 0) return;
  absl::StatusOr<bool> pinned = pinner->Pin(data_, size_);
  if (!pinned.ok()) {
    LogWarning("memory tier image of ", size_, " bytes stays unpinned: ",
               pinned.status().ToString());
  } else if (*pinned) {
    pinned_by_ = pinner;
  }
}

void MemoryTier::SetPinner(ImagePinner* pinner) { pinner_ = pinner; }

bool MemoryTier::EvictLocked(uint64_t room, const std::string& keep,
                             uint64_t reuse_size,
                             std::shared_ptr<FileImage>* reused,
                             std::vector<std::shared_ptr<FileImage>>* evicted) {
  // Evict other checkpoints, oldest first, skipping images a load holds.
  while (used_ + room > budget_) {
    Checkpoint* oldest = nullptr;
    std::string oldest_key;
    for (auto& [k, cp] : checkpoints_) {
      if (k == keep) continue;
      bool busy = false;
      for (const auto& [name, image] : cp.files) busy = busy || image.use_count() > 1;
      if (busy) continue;
      if (oldest == nullptr || cp.sequence < oldest->sequence) {
        oldest = &cp;
        oldest_key = k;
      }
    }
    if (oldest == nullptr) return false;
    for (const auto& [name, image] : oldest->files) {
      used_ -= image->size();
      if (reused != nullptr && *reused == nullptr && image->size() == reuse_size) {
        *reused = image;
      } else {
        evicted->push_back(image);
      }
    }
    checkpoints_.erase(oldest_key);
  }
  return true;
}

std::shared_ptr<FileImage> MemoryTier::Reserve(const std::string& job,
                                               const std::string& checkpoint,
                                               const std::string& file, uint64_t size) {
  // Evicted images are unpinned and unmapped after the lock is released.
  std::vector<std::shared_ptr<FileImage>> evicted;
  absl::MutexLock lock(&mu_);
  if (size > budget_) return nullptr;
  const std::string key = Key(job, checkpoint);
  std::shared_ptr<FileImage> reused;
  if (!EvictLocked(size, key, size, &reused, &evicted)) return nullptr;
  std::shared_ptr<FileImage> image =
      reused != nullptr ? std::move(reused) : std::make_shared<FileImage>(size);
  if (image->data() == nullptr) return nullptr;
  Checkpoint& cp = checkpoints_[key];
  if (cp.files.empty()) cp.sequence = next_sequence_++;
  auto& slot = cp.files[file];
  if (slot != nullptr) used_ -= slot->size();
  slot = image;
  used_ += size;
  return image;
}

uint64_t MemoryTier::SetBudget(uint64_t budget) {
  std::vector<std::shared_ptr<FileImage>> evicted;  // unmapped after unlocking
  uint64_t freed = 0;
  absl::MutexLock lock(&mu_);
  budget_ = budget;
  const uint64_t before = used_;
  // What cannot go now (held by a load or a save) goes at a later Reserve.
  EvictLocked(0, /*keep=*/"", 0, nullptr, &evicted);
  freed = before - used_;
  return freed;
}

uint64_t MemoryTier::budget() const {
  absl::MutexLock lock(&mu_);
  return budget_;
}

void MemoryTier::MarkCommitted(const std::string& job, const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  auto it = checkpoints_.find(Key(job, checkpoint));
  if (it != checkpoints_.end()) it->second.committed = true;
}

void MemoryTier::Pin(const std::string& job, const std::string& checkpoint) {
  ImagePinner* pinner = pinner_.load();
  if (pinner == nullptr) return;
  std::vector<std::shared_ptr<FileImage>> images;
  {
    absl::MutexLock lock(&mu_);
    auto it = checkpoints_.find(Key(job, checkpoint));
    if (it == checkpoints_.end()) return;
    for (const auto& [name, image] : it->second.files) images.push_back(image);
  }
  // Pinning takes a while for gigabytes; no lock is held, and a reused
  // image is pinned already.
  for (const auto& image : images) image->PinWith(pinner);
}

void MemoryTier::Drop(const std::string& job, const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  auto it = checkpoints_.find(Key(job, checkpoint));
  if (it == checkpoints_.end()) return;
  for (const auto& [name, image] : it->second.files) used_ -= image->size();
  checkpoints_.erase(it);
}

std::shared_ptr<const FileImage> MemoryTier::Find(const std::string& job,
                                                  const std::string& checkpoint,
                                                  const std::string& file,
                                                  uint64_t size) const {
  absl::MutexLock lock(&mu_);
  auto it = checkpoints_.find(Key(job, checkpoint));
  if (it == checkpoints_.end() || !it->second.committed) return nullptr;
  auto f = it->second.files.find(file);
  if (f == it->second.files.end() || f->second->size() != size) return nullptr;
  return f->second;
}

uint64_t MemoryTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace ckpt

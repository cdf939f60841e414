#include "storage/memory_tier.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "common/log.h"

namespace ckpt {

FileImage::FileImage(uint64_t size) : size_(size), capacity_(std::max<uint64_t>(size, 1)) {
  void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) data_ = static_cast<char*>(p);
}

FileImage::FileImage(char* mapping, uint64_t capacity, uint64_t size)
    : data_(mapping), size_(size), capacity_(capacity) {}

char* FileImage::ReleaseMapping() {
  absl::MutexLock lock(&pin_mu_);
  if (pinned_by_ != nullptr) pinned_by_->Unpin(data_, size_);
  pinned_by_ = nullptr;
  return std::exchange(data_, nullptr);
}

void FileImage::AdviseHugePages() {
  if (data_ == nullptr || size_ == 0) return;
  if (::madvise(data_, size_, MADV_HUGEPAGE) == 0) return;
  // EINVAL: a kernel built without THP. Either way the image works with
  // small pages; other errors are said once.
  const int error = errno;
  static std::atomic<bool> said{false};
  if (error != EINVAL && !said.exchange(true)) {
    LogWarning("madvise(MADV_HUGEPAGE) of a ", size_, " byte image failed (",
               std::strerror(error), "); fetched images use small pages");
  }
}

FileImage::~FileImage() {
  // The last holder is gone: no PinWith can run now.
  absl::MutexLock lock(&pin_mu_);
  if (pinned_by_ != nullptr) pinned_by_->Unpin(data_, size_);
  if (data_ != nullptr) munmap(data_, capacity_);
}

void FileImage::PinWith(ImagePinner* pinner) {
  absl::MutexLock lock(&pin_mu_);
  if (pinned_by_ != nullptr || pin_failed_ || data_ == nullptr || size_ == 0) return;
  absl::StatusOr<bool> pinned = pinner->Pin(data_, size_);
  if (!pinned.ok()) {
    pin_failed_ = true;
    LogWarning("memory tier image of ", size_, " bytes stays unpinned: ",
               pinned.status().ToString());
  } else if (*pinned) {
    pinned_by_ = pinner;
  }
}

void MemoryTier::SetPinner(ImagePinner* pinner) { pinner_ = pinner; }

std::map<std::string, MemoryTier::Checkpoint>::iterator MemoryTier::OldestIdleLocked(
    const std::string& keep) {
  auto oldest = checkpoints_.end();
  for (auto it = checkpoints_.begin(); it != checkpoints_.end(); ++it) {
    if (it->first == keep) continue;
    bool busy = false;  // a load (or a save) holds one of its images
    for (const auto& [name, image] : it->second.files) busy = busy || image.use_count() > 1;
    if (busy) continue;
    if (oldest == checkpoints_.end() || it->second.sequence < oldest->second.sequence) {
      oldest = it;
    }
  }
  return oldest;
}

std::shared_ptr<FileImage> MemoryTier::MakeRoomLocked(
    uint64_t room, const std::string& keep, uint64_t reuse_size, bool* fits,
    std::vector<std::shared_ptr<FileImage>>* unmap) {
  *fits = false;
  while (true) {
    if (reuse_size != 0) {
      for (auto it = spares_.begin(); it != spares_.end(); ++it) {
        if ((*it)->size() != reuse_size) continue;
        std::shared_ptr<FileImage> image = std::move(*it);
        spares_.erase(it);
        used_ -= image->size();  // the caller counts it again
        *fits = true;
        return image;
      }
    }
    if (used_ + room <= budget_) {
      *fits = true;
      return nullptr;
    }
    if (!spares_.empty()) {  // of other sizes: unmapped, oldest first
      used_ -= spares_.front()->size();
      unmap->push_back(std::move(spares_.front()));
      spares_.erase(spares_.begin());
      continue;
    }
    auto oldest = OldestIdleLocked(keep);
    if (oldest == checkpoints_.end()) return nullptr;
    for (auto& [name, image] : oldest->second.files) spares_.push_back(std::move(image));
    checkpoints_.erase(oldest);  // its bytes stay in used_, as spares
  }
}

std::shared_ptr<FileImage> MemoryTier::Reserve(const std::string& job,
                                               const std::string& checkpoint,
                                               const std::string& file, uint64_t size) {
  // Spares given up are unpinned and unmapped after the lock is released.
  std::vector<std::shared_ptr<FileImage>> unmap;
  absl::MutexLock lock(&mu_);
  if (size > budget_) return nullptr;
  const std::string key = Key(job, checkpoint);
  bool fits = false;
  std::shared_ptr<FileImage> image = MakeRoomLocked(size, key, size, &fits, &unmap);
  if (!fits) return nullptr;
  if (image == nullptr) image = std::make_shared<FileImage>(size);
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
  std::vector<std::shared_ptr<FileImage>> unmap;  // unmapped after unlocking
  absl::MutexLock lock(&mu_);
  budget_ = budget;
  const uint64_t before = used_;
  // What cannot go now (held by a load or a save) goes at a later Reserve.
  bool fits = false;
  MakeRoomLocked(0, /*keep=*/"", 0, &fits, &unmap);
  // Spares beyond the budget went above; those within it stay for reuse.
  return before - used_;
}

uint64_t MemoryTier::budget() const {
  absl::MutexLock lock(&mu_);
  return budget_;
}

void MemoryTier::MarkComplete(const std::string& job, const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  auto it = checkpoints_.find(Key(job, checkpoint));
  if (it != checkpoints_.end()) it->second.complete = true;
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
  for (auto& [name, image] : it->second.files) {
    // Unreachable once erased, so a count of one stays one: nobody reads
    // or writes it, and the next save's file of its size takes it as it is
    // (mapped, faulted in, pinned). One a load or a writer still holds
    // goes when they let it go, outside the budget from now on.
    if (image.use_count() == 1) {
      spares_.push_back(std::move(image));  // its bytes stay in used_
    } else {
      used_ -= image->size();
    }
  }
  checkpoints_.erase(it);
}

bool MemoryTier::HoldsComplete(const std::string& job, const std::string& checkpoint) const {
  absl::MutexLock lock(&mu_);
  auto it = checkpoints_.find(Key(job, checkpoint));
  return it != checkpoints_.end() && it->second.complete;
}

std::shared_ptr<const FileImage> MemoryTier::Find(const std::string& job,
                                                  const std::string& checkpoint,
                                                  const std::string& file,
                                                  uint64_t size) const {
  absl::ReleasableMutexLock lock(&mu_);
  auto it = checkpoints_.find(Key(job, checkpoint));
  if (it == checkpoints_.end() || !it->second.complete) return nullptr;
  auto f = it->second.files.find(file);
  if (f == it->second.files.end() || f->second->size() != size) return nullptr;
  std::shared_ptr<FileImage> image = f->second;
  lock.Release();
  // The load may copy from it into GPU memory at once, before the pin
  // after the commit (Pin) came to it; the tier's lock is not held while
  // gigabytes are page-locked.
  if (ImagePinner* pinner = pinner_.load(); pinner != nullptr) image->PinWith(pinner);
  return image;
}

uint64_t MemoryTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace ckpt

#include "storage/s3/part_slots.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::s3 {

PartSlots::Slot::Slot(Slot&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), buffer_(std::move(other.buffer_)) {}

PartSlots::Slot& PartSlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->Release(std::move(buffer_));
    owner_ = std::exchange(other.owner_, nullptr);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

PartSlots::Slot::~Slot() {
  if (owner_ != nullptr) owner_->Release(std::move(buffer_));
}

PartSlots::PartSlots(int slots, size_t part_size)
    : slots_(std::max(slots, 1)), part_size_(part_size) {}

absl::StatusOr<PartSlots::Slot> PartSlots::Acquire(bool with_buffer, absl::Time deadline,
                                                   const std::atomic<bool>* give_up) {
  Slot slot;
  {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return taken_ < slots_; };
    while (!free()) {
      if (give_up != nullptr && give_up->load()) {
        --waiting_;
        return absl::CancelledError("gave up waiting for a part slot");
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        --waiting_;
        return absl::DeadlineExceededError(absl::StrCat(
            "all ", slots_, " parts in flight were still being sent at the deadline"));
      }
      mu_.AwaitWithDeadline(absl::Condition(&free),
                            std::min(deadline, now + absl::Milliseconds(100)));
    }
    --waiting_;
    ++taken_;
    slot.owner_ = this;
    if (with_buffer && !free_buffers_.empty()) {
      slot.buffer_ = std::move(free_buffers_.back());
      free_buffers_.pop_back();
    }
  }
  if (with_buffer && slot.buffer_.data() == nullptr) {
    // Allocated outside the lock: slots_ bounds the buffers in existence.
    if (absl::Status allocated = slot.buffer_.Allocate(part_size_); !allocated.ok()) {
      return allocated;  // the slot goes back as it is dropped
    }
    absl::MutexLock lock(&mu_);
    ++buffers_;
  }
  return slot;
}

void PartSlots::Release(AlignedBuffer buffer) {
  absl::MutexLock lock(&mu_);
  --taken_;
  if (buffer.data() != nullptr) free_buffers_.push_back(std::move(buffer));
  if (taken_ == 0 && waiting_ == 0) {
    // Idle: the buffers go (an idle daemon holds no part memory).
    buffers_ -= free_buffers_.size();
    free_buffers_.clear();
  }
}

int PartSlots::taken() const {
  absl::MutexLock lock(&mu_);
  return taken_;
}

size_t PartSlots::buffers() const {
  absl::MutexLock lock(&mu_);
  return buffers_;
}

}  // namespace ckpt::s3

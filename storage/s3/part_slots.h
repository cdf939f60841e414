// PartSlots: the bound on parts in flight that several multipart uploads
// running side by side share (a node's checkpoint files uploaded two at a
// time by the remote tier, issue 30). Without it each upload would send
// parts_in_flight parts of its own, so two files would double the requests
// and the part buffers the configuration allows; with it the next file's
// parts take the slots the previous file's last parts free, and the
// pipeline does not drain between files.
//
// A slot carries a part buffer (part_size bytes, 4096-aligned, allocated
// the first time a slot that needs one is taken and reused after): memory
// is at most `slots` part buffers, and all of them are freed when the last
// slot is given back with no upload waiting, so an idle daemon holds none.
//
// Waits: Acquire waits while every slot is taken. A slot is held for one
// part, whose read and request each end within their own deadlines (the
// local file's read, the S3 client's retry.overall_deadline), so a wait
// ends within those of the parts ahead of it; the caller's `deadline`
// bounds it as well.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/aligned_buffer.h"

namespace ckpt::s3 {

class PartSlots {
 public:
  // A taken slot; gives it back when dropped.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&& other) noexcept;
    ~Slot();
    // The slot's part buffer (empty when the slot was taken without one).
    absl::Span<char> scratch() const { return buffer_.span(); }

   private:
    friend class PartSlots;
    PartSlots* owner_ = nullptr;
    AlignedBuffer buffer_;
  };

  // `slots` 1.., `part_size` the bytes of each slot's buffer.
  PartSlots(int slots, size_t part_size);
  PartSlots(const PartSlots&) = delete;
  PartSlots& operator=(const PartSlots&) = delete;

  // Takes a free slot, with its part buffer when `with_buffer`; waits
  // while none is free, up to `deadline` (DeadlineExceeded), or until
  // `give_up` is true (Cancelled; checked as slots are given back and
  // every 100 ms).
  absl::StatusOr<Slot> Acquire(bool with_buffer, absl::Time deadline,
                               const std::atomic<bool>* give_up = nullptr);

  int slots() const { return slots_; }
  size_t part_size() const { return part_size_; }
  // Slots taken now, and part buffers allocated now (for tests and status).
  int taken() const;
  size_t buffers() const;

 private:
  void Release(AlignedBuffer buffer);

  const int slots_;
  const size_t part_size_;
  mutable absl::Mutex mu_;
  int taken_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<AlignedBuffer> free_buffers_ ABSL_GUARDED_BY(mu_);
  size_t buffers_ ABSL_GUARDED_BY(mu_) = 0;  // held by slots or free
};

}  // namespace ckpt::s3

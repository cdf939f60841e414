// IoQueue on io_uring (liburing 2.3).
//
// The ring is the production I/O path: buffers are registered once, at
// creation, so READ_FIXED/WRITE_FIXED skip the per-request page pinning that
// dominates large O_DIRECT transfers. Completions are reported raw; retrying
// short transfers and -EAGAIN is IoPipeline's job.
#include <liburing.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "io/io_queue.h"

namespace ckpt {
namespace {

// Ring: owns one io_uring instance and tears it down when destroyed.
// `struct io_uring` holds pointers into the kernel's mmapped rings, so the
// object is neither copyable nor movable; it lives behind a unique_ptr.
class Ring {
 public:
  static absl::StatusOr<std::unique_ptr<Ring>> Create(uint32_t entries) {
    auto ring = std::unique_ptr<Ring>(new Ring());
    const int ret = io_uring_queue_init(entries, &ring->ring_, 0);
    if (ret < 0) {
      return ErrnoToStatus(-ret,
                           absl::StrCat("io_uring_queue_init(", entries, ")"));
    }
    ring->initialized_ = true;
    return ring;
  }

  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  // Unregisters the buffers too: the kernel drops them with the ring.
  ~Ring() {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  io_uring* get() { return &ring_; }

 private:
  Ring() = default;

  io_uring ring_{};
  bool initialized_ = false;
};

// The io_uring IoQueue. Owns its Ring; borrows the registered buffers, which
// the caller keeps mapped for the queue's lifetime.
//
// Failure model: once io_uring_submit has failed, SQEs may be left in the
// submission ring where a later submit would send them, so the queue stops
// accepting work: every later Submit returns the same error ("poisoned").
// Reap keeps working (it never submits), so the requests the kernel did take
// are still waited for before their buffers are reused.
class UringIoQueue final : public IoQueue {
 public:
  UringIoQueue(std::unique_ptr<Ring> ring, uint32_t depth,
               uint32_t registered_count)
      : ring_(std::move(ring)),
        depth_(depth),
        registered_count_(registered_count) {}

  absl::string_view name() const override {
    return registered_count_ > 0 ? "io_uring" : "io_uring (unregistered buffers)";
  }
  uint32_t depth() const override { return depth_; }

  absl::Status Submit(absl::Span<const IoRequest> requests,
                      size_t* submitted_out) override {
    *submitted_out = 0;
    RETURN_IF_ERROR(poisoned_);
    RETURN_IF_ERROR(Validate(requests));
    io_uring* ring = ring_->get();
    // Everything is checked before the first SQE is taken, so a rejected
    // batch leaves nothing behind in the submission ring.
    for (const IoRequest& r : requests) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);  // non-null: checked above
      const bool fixed = registered_count_ > 0 && r.registered_index >= 0;
      if (r.kind == IoRequest::Kind::kRead) {
        if (fixed) {
          io_uring_prep_read_fixed(sqe, r.fd, r.buffer, r.length, r.offset,
                                   r.registered_index);
        } else {
          io_uring_prep_read(sqe, r.fd, r.buffer, r.length, r.offset);
        }
      } else {
        if (fixed) {
          io_uring_prep_write_fixed(sqe, r.fd, r.buffer, r.length, r.offset,
                                    r.registered_index);
        } else {
          io_uring_prep_write(sqe, r.fd, r.buffer, r.length, r.offset);
        }
      }
      io_uring_sqe_set_data64(sqe, r.tag);
    }
    // The kernel may take fewer SQEs than offered (e.g. a transient
    // allocation failure); the rest stay in the ring and go with the next
    // io_uring_submit. It takes them in order, so what it took is a prefix.
    size_t submitted = 0;
    while (submitted < requests.size()) {
      const int ret = io_uring_submit(ring);
      if (ret == -EINTR) continue;
      if (ret <= 0) {
        poisoned_ = ret < 0 ? ErrnoToStatus(-ret, "io_uring_submit")
                            : absl::InternalError(
                                  "io_uring_submit: kernel took no entries");
        break;
      }
      submitted += static_cast<size_t>(ret);
    }
    in_flight_ += static_cast<uint32_t>(submitted);
    *submitted_out = submitted;
    return poisoned_;
  }

  absl::Status Reap(uint32_t min_completions,
                    std::vector<IoCompletion>* out) override {
    if (min_completions > in_flight_) {
      // Waiting would never return.
      return absl::FailedPreconditionError(
          absl::StrCat("io_uring Reap: waiting for ", min_completions,
                       " completions with only ", in_flight_, " in flight"));
    }
    io_uring* ring = ring_->get();
    if (min_completions > 0) {
      io_uring_cqe* cqe = nullptr;
      int ret;
      do {
        ret = io_uring_wait_cqe_nr(ring, &cqe, min_completions);
      } while (ret == -EINTR);  // a signal cut the wait short
      if (ret < 0) return ErrnoToStatus(-ret, "io_uring_wait_cqe_nr");
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring, head, cqe) {
      out->push_back(IoCompletion{.tag = cqe->user_data, .result = cqe->res});
      ++seen;
    }
    io_uring_cq_advance(ring, seen);
    in_flight_ -= seen;
    return absl::OkStatus();
  }

 private:
  absl::Status Validate(absl::Span<const IoRequest> requests) const {
    if (in_flight_ + requests.size() > depth_) {
      return absl::FailedPreconditionError(
          absl::StrCat("io_uring Submit: ", in_flight_, " in flight + ",
                       requests.size(), " new exceeds depth ", depth_));
    }
    // Cannot fail after the depth check while we keep in_flight <= depth
    // (the SQ has at least `depth` entries); checked anyway because a null
    // SQE would be a crash, not an error.
    if (io_uring_sq_space_left(ring_->get()) < requests.size()) {
      return absl::ResourceExhaustedError(
          "io_uring Submit: submission ring full");
    }
    for (const IoRequest& r : requests) {
      if (registered_count_ > 0 && r.registered_index >= 0 &&
          static_cast<uint32_t>(r.registered_index) >= registered_count_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "io_uring Submit: registered buffer index ", r.registered_index,
            " but only ", registered_count_, " buffers are registered"));
      }
    }
    return absl::OkStatus();
  }

  // Constant after construction.
  const std::unique_ptr<Ring> ring_;
  const uint32_t depth_;
  const uint32_t registered_count_;

  uint32_t in_flight_ = 0;  // submitted and not yet reaped
  absl::Status poisoned_;   // first io_uring_submit failure, sticky
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoQueue>> CreateUringQueue(
    uint32_t depth, absl::Span<const iovec> registered) {
  if (depth == 0) return absl::InvalidArgumentError("io_uring depth 0");
  // The kernel sizes the CQ at twice the SQ, so with at most `depth` in
  // flight completions can never overflow.
  ASSIGN_OR_RETURN(std::unique_ptr<Ring> ring, Ring::Create(depth));
  if (!registered.empty()) {
    // Pins the pages and counts them against RLIMIT_MEMLOCK (ENOMEM when
    // over it, unless the process has CAP_IPC_LOCK).
    const int ret =
        io_uring_register_buffers(ring->get(), registered.data(),
                                  static_cast<unsigned>(registered.size()));
    if (ret < 0) {
      return ErrnoToStatus(-ret, absl::StrCat("io_uring_register_buffers(",
                                              registered.size(), " buffers)"));
    }
  }
  return std::make_unique<UringIoQueue>(
      std::move(ring), depth, static_cast<uint32_t>(registered.size()));
}

}  // namespace ckpt

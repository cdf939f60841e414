// FaultInjectingQueue: an IoQueue test double that wraps the pwrite queue
// and breaks it on purpose, for testing code that must cope with what a
// real queue may report (short transfers, -EAGAIN, -EIO, zero-byte writes).
//
// Faults are public fields that the test sets before use; observations are
// public fields it reads afterwards:
//
//   FaultInjectingQueue queue(4);
//   queue.eio_tag = 2;          // tag 2 always completes with -EIO
//   queue.max_transfer = 1000;  // everything else moves 1000 bytes a time
//   IoPipeline pipeline(&queue);
//   ...
//   CHECK(queue.max_in_flight <= 4);
//
// Injected completions are reported by the next Reap before those of the
// wrapped queue. Submitting beyond the depth fails with FailedPrecondition,
// so callers that overfill the queue are caught.
//
// Thread-safety: none; one test owns it.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "io/io_queue.h"

namespace ckpt::testing {

class FaultInjectingQueue final : public IoQueue {
 public:
  explicit FaultInjectingQueue(uint32_t depth)
      : inner_(CreatePwriteQueue(depth)) {}

  // Faults.
  bool halve = false;                      // cut transfers of > 1 byte to half
  uint32_t max_transfer = UINT32_MAX;      // cut transfers to at most this
  int eagain_left = 0;                     // the next N submissions get -EAGAIN
  std::optional<uint64_t> eio_tag;         // this tag always gets -EIO
  std::optional<uint64_t> zero_write_tag;  // writes of this tag return 0

  // Observations.
  uint32_t in_flight = 0;      // submitted and not yet reaped
  uint32_t max_in_flight = 0;  // the most in_flight has been
  uint32_t submissions = 0;    // requests submitted, faulted ones included

  absl::string_view name() const override { return "fault-injecting"; }
  uint32_t depth() const override { return inner_->depth(); }

  absl::Status Submit(absl::Span<const IoRequest> requests) override {
    if (in_flight + requests.size() > depth()) {
      return absl::FailedPreconditionError("submitted beyond depth");
    }
    for (const IoRequest& r : requests) {
      ++submissions;
      if (eagain_left > 0) {
        --eagain_left;
        injected_.push_back({r.tag, -EAGAIN});
      } else if (eio_tag == r.tag) {
        injected_.push_back({r.tag, -EIO});
      } else if (zero_write_tag == r.tag && r.kind == IoRequest::Kind::kWrite) {
        injected_.push_back({r.tag, 0});
      } else {
        IoRequest cut = r;
        if (halve && cut.length > 1) cut.length /= 2;
        cut.length = std::min(cut.length, max_transfer);
        if (absl::Status s = inner_->Submit({&cut, 1}); !s.ok()) return s;
      }
    }
    in_flight += static_cast<uint32_t>(requests.size());
    max_in_flight = std::max(max_in_flight, in_flight);
    return absl::OkStatus();
  }

  absl::Status Reap(uint32_t min_completions,
                    std::vector<IoCompletion>* out) override {
    const size_t before = out->size();
    out->insert(out->end(), injected_.begin(), injected_.end());
    injected_.clear();
    const auto got = static_cast<uint32_t>(out->size() - before);
    absl::Status s =
        inner_->Reap(min_completions > got ? min_completions - got : 0, out);
    in_flight -= static_cast<uint32_t>(out->size() - before);
    return s;
  }

 private:
  std::unique_ptr<IoQueue> inner_;
  std::deque<IoCompletion> injected_;
};

}  // namespace ckpt::testing

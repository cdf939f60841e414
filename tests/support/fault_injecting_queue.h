// FaultInjectingQueue: an IoQueue test double that wraps the pwrite queue
// and breaks it on purpose, for testing code that must cope with what a
// real queue may report (short transfers, -EAGAIN, -EIO, zero-byte writes,
// a batch taken only in part, a Reap that fails).
//
// Faults are public fields that the test sets before use; observations are
// public fields it reads afterwards:
//
//   FaultInjectingQueue queue(4);
//   queue.eio_tag = 2;          // tag 2 always completes with -EIO
//   queue.max_transfer = 1000;  // everything else moves 1000 bytes a time
//   queue.WatchPool(pool);      // count buffers returned while outstanding
//   IoPipeline pipeline(&queue);
//   ...
//   CHECK(queue.max_in_flight <= 4);
//   CHECK(queue.returned_while_outstanding == 0);
//
// Injected completions are reported by the next Reap before those of the
// wrapped queue. Submitting beyond the depth fails with FailedPrecondition,
// so callers that overfill the queue are caught.
//
// Thread-safety: none; one test (or one I/O worker) owns it. WatchPool's
// observer runs on whichever thread returns a buffer, so a watched queue
// and the pool's borrowers must share one thread.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"

namespace ckpt::testing {

class FaultInjectingQueue final : public IoQueue {
 public:
  explicit FaultInjectingQueue(uint32_t depth)
      : inner_(CreatePwriteQueue(depth)) {}
  ~FaultInjectingQueue() override {
    if (watched_ != nullptr) watched_->SetReturnObserver(nullptr);
  }
  FaultInjectingQueue(const FaultInjectingQueue&) = delete;
  FaultInjectingQueue& operator=(const FaultInjectingQueue&) = delete;

  // Faults.
  bool halve = false;                      // cut transfers of > 1 byte to half
  uint32_t max_transfer = UINT32_MAX;      // cut transfers to at most this
  int eagain_left = 0;                     // the next N submissions get -EAGAIN
  std::optional<uint64_t> eio_tag;         // this tag always gets -EIO
  std::optional<uint32_t> eio_nth;         // the Nth request (1-based) gets -EIO
  std::optional<uint64_t> zero_write_tag;  // writes of this tag return 0
  // The Nth request submitted (1-based) is refused: its Submit call fails
  // there, the requests before it in the batch stay submitted.
  std::optional<uint32_t> refuse_nth;
  // Reap call number `failing_reap` (1-based) and the `failing_reaps` - 1
  // after it fail as a broken queue would, reaping nothing.
  std::optional<uint32_t> failing_reap;
  uint32_t failing_reaps = 1;
  // A Reap that need not wait (min_completions 0: a poll) reports nothing,
  // as on a slow disk: completions stay outstanding until someone waits.
  bool lazy = false;

  // Observations.
  uint32_t in_flight = 0;      // submitted and not yet reaped
  uint32_t max_in_flight = 0;  // the most in_flight has been
  uint32_t submissions = 0;    // requests submitted, faulted ones included
  uint32_t reaps = 0;          // Reap calls
  // in_flight when the first injected -EIO was reaped or Reap first failed:
  // how much was still outstanding when the fault hit.
  std::optional<uint32_t> in_flight_at_fault;
  // Buffers of the watched pool that went back while a request on them was
  // submitted and not yet reaped: a transfer the kernel could still be
  // running on memory lent to someone else.
  uint32_t returned_while_outstanding = 0;

  // Watches `pool` (which must outlive the queue, or be watched until the
  // queue is destroyed) for buffers returned while outstanding here.
  void WatchPool(StagingPool* pool) {
    watched_ = pool;
    pool->SetReturnObserver([this](int index) {
      for (const auto& [tag, outstanding] : outstanding_) {
        if (outstanding == index) ++returned_while_outstanding;
      }
    });
  }

  absl::string_view name() const override { return "fault-injecting"; }
  uint32_t depth() const override { return inner_->depth(); }

  absl::Status Submit(absl::Span<const IoRequest> requests,
                      size_t* submitted) override {
    *submitted = 0;
    if (in_flight + requests.size() > depth()) {
      return absl::FailedPreconditionError("submitted beyond depth");
    }
    for (const IoRequest& r : requests) {
      if (refuse_nth == submissions + 1) {
        refuse_nth.reset();
        return absl::UnavailableError(
            absl::StrCat("injected refusal of request ", submissions + 1));
      }
      ++submissions;
      if (eagain_left > 0) {
        --eagain_left;
        injected_.push_back({r.tag, -EAGAIN});
      } else if (eio_tag == r.tag || eio_nth == submissions) {
        injected_.push_back({r.tag, -EIO});
        eio_pending_ = true;
      } else if (zero_write_tag == r.tag && r.kind == IoRequest::Kind::kWrite) {
        injected_.push_back({r.tag, 0});
      } else {
        IoRequest cut = r;
        if (halve && cut.length > 1) cut.length /= 2;
        cut.length = std::min(cut.length, max_transfer);
        size_t taken = 0;
        if (absl::Status s = inner_->Submit({&cut, 1}, &taken); !s.ok()) {
          return s;
        }
      }
      outstanding_[r.tag] = r.registered_index;
      ++*submitted;
      ++in_flight;
      max_in_flight = std::max(max_in_flight, in_flight);
    }
    return absl::OkStatus();
  }

  absl::Status Reap(uint32_t min_completions,
                    std::vector<IoCompletion>* out) override {
    ++reaps;
    if (failing_reap.has_value() && reaps >= *failing_reap &&
        reaps < *failing_reap + failing_reaps) {
      if (!in_flight_at_fault) in_flight_at_fault = in_flight;
      return absl::InternalError(absl::StrCat("injected failure of Reap ", reaps));
    }
    if (lazy && min_completions == 0) return absl::OkStatus();
    if (eio_pending_ && !in_flight_at_fault) in_flight_at_fault = in_flight;
    eio_pending_ = false;
    const size_t before = out->size();
    out->insert(out->end(), injected_.begin(), injected_.end());
    injected_.clear();
    const auto got = static_cast<uint32_t>(out->size() - before);
    absl::Status s =
        inner_->Reap(min_completions > got ? min_completions - got : 0, out);
    for (size_t i = before; i < out->size(); ++i) outstanding_.erase((*out)[i].tag);
    in_flight -= static_cast<uint32_t>(out->size() - before);
    return s;
  }

 private:
  std::unique_ptr<IoQueue> inner_;
  std::deque<IoCompletion> injected_;
  bool eio_pending_ = false;  // an injected -EIO waits to be reaped
  std::map<uint64_t, int> outstanding_;  // registered index, by tag
  StagingPool* watched_ = nullptr;
};

}  // namespace ckpt::testing

// IoPipeline: the io_uring-cp loop (liburing examples/io_uring-cp.c).
//
// Every unfinished transfer is in exactly one of two places: in flight in the
// queue, or waiting in held_ for a free slot. A completion either finishes
// its transfer (done, end of file, or error) or puts the rest of it back at
// the front of held_, and the freed slots are refilled from held_ at once, so
// the queue stays at depth() for as long as there is work.
#include "io/io_pipeline.h"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

// "write 4096 bytes at offset 8192": what failed, for the error message.
std::string Describe(const IoRequest& r) {
  return absl::StrCat(r.kind == IoRequest::Kind::kRead ? "read " : "write ",
                      r.length, " bytes at offset ", r.offset);
}

}  // namespace

IoPipeline::IoPipeline(IoQueue* queue) : queue_(queue) {}

IoPipeline::~IoPipeline() {
  if (transfers_.empty()) return;
  // The owner gave up early (an error path): the leases must still not go
  // back before the kernel is done with their buffers.
  const absl::Status status = Abort();
  if (!status.ok()) LogError("IoPipeline: ", status.ToString());
}

absl::Status IoPipeline::Start(IoRequest request, StagingLease buffer) {
  if (transfers_.contains(request.tag)) {
    return absl::InvalidArgumentError(
        absl::StrCat("IoPipeline: tag ", request.tag, " is already in use"));
  }
  const auto begin = reinterpret_cast<uintptr_t>(buffer.data());
  const auto at = reinterpret_cast<uintptr_t>(request.buffer);
  if (!buffer || at < begin || at - begin > buffer.size() ||
      request.length > buffer.size() - (at - begin)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IoPipeline: ", Describe(request), " is not inside its staging buffer"));
  }
  request.registered_index = buffer.index();
  const uint64_t tag = request.tag;
  transfers_.emplace(tag, Transfer{request, request, std::move(buffer)});
  held_.push_back(tag);
  absl::Status status = SubmitHeld();
  if (!status.ok() && !held_.empty() && held_.back() == tag) {
    // The queue did not take this transfer, so nothing is in flight on its
    // buffer: undo it (the lease goes back), so that a failed Start means
    // "not started". Earlier held transfers stay held and are retried by
    // the next call.
    held_.pop_back();
    transfers_.erase(tag);
  }
  return status;
}

absl::Status IoPipeline::WaitSome(std::vector<Finished>* done) {
  const size_t before = done->size();
  RETURN_IF_ERROR(SubmitHeld());
  // A completion may only requeue the rest of a short transfer, so wait
  // until something has actually finished.
  while (!transfers_.empty() && done->size() == before) {
    if (in_flight_ == 0) {
      return absl::FailedPreconditionError(
          "IoPipeline: transfers are held but the queue has no free slot");
    }
    RETURN_IF_ERROR(Drain(1, done));
  }
  return absl::OkStatus();
}

absl::Status IoPipeline::Poll(std::vector<Finished>* done) {
  RETURN_IF_ERROR(SubmitHeld());
  return Drain(0, done);
}

absl::Status IoPipeline::SubmitHeld() {
  const uint32_t depth = queue_->depth();
  const size_t n = std::min<size_t>(
      held_.size(), depth > in_flight_ ? depth - in_flight_ : 0);
  if (n == 0) return absl::OkStatus();
  batch_.clear();
  for (size_t i = 0; i < n; ++i) {
    batch_.push_back(transfers_.at(held_[i]).remaining);
  }
  // On error the queue may still have taken a prefix of the batch: those
  // are in flight, the rest stay held.
  size_t submitted = 0;
  absl::Status status = queue_->Submit(batch_, &submitted);
  if (submitted > n) {
    return absl::InternalError(absl::StrCat("IoPipeline: queue reports ",
                                            submitted, " of ", n,
                                            " requests submitted"));
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<ptrdiff_t>(submitted));
  in_flight_ += static_cast<uint32_t>(submitted);
  DaemonMetrics::Get().io_queue_depth.Add(static_cast<double>(submitted));
  return status;
}

absl::Status IoPipeline::Drain(uint32_t min_completions,
                               std::vector<Finished>* done) {
  completions_.clear();
  // Completions reaped before a queue error are still handled, so that no
  // transfer (and no buffer) is lost over it. A completion the pipeline
  // cannot match is a queue bug, handled alike.
  absl::Status queue_status = queue_->Reap(min_completions, &completions_);
  for (const IoCompletion& c : completions_) {
    auto it = transfers_.find(c.tag);
    if (it == transfers_.end()) {
      queue_status.Update(absl::InternalError(
          absl::StrCat("IoPipeline: completion for unknown tag ", c.tag)));
      continue;
    }
    --in_flight_;
    DaemonMetrics::Get().io_queue_depth.Add(-1);
    Transfer& t = it->second;
    const int32_t res = c.result;
    absl::Status status;
    bool finished = false;
    if (res == -EAGAIN || res == -EINTR) {
      // Nothing was transferred; try the same request again.
    } else if (res < 0) {
      status = ErrnoToStatus(-res, Describe(t.remaining));
      finished = true;
    } else if (static_cast<uint32_t>(res) > t.remaining.length) {
      status = absl::InternalError(absl::StrCat(
          Describe(t.remaining), ": queue reported ", res, " bytes"));
      finished = true;
    } else if (res == 0 && t.remaining.kind == IoRequest::Kind::kWrite &&
               t.remaining.length > 0) {
      // A write that makes no progress would be requeued forever.
      status = absl::InternalError(
          absl::StrCat(Describe(t.remaining), ": wrote 0 bytes"));
      finished = true;
    } else {
      // Short or complete; a read of 0 bytes is end of file.
      t.remaining.buffer += res;
      t.remaining.length -= static_cast<uint32_t>(res);
      t.remaining.offset += static_cast<uint64_t>(res);
      finished = res == 0 || t.remaining.length == 0;
    }
    if (!finished) {
      held_.push_front(c.tag);
      continue;
    }
    done->push_back(Finished{.tag = c.tag,
                             .status = std::move(status),
                             .bytes = t.original.length - t.remaining.length,
                             .buffer = std::move(t.buffer)});
    transfers_.erase(it);
  }
  RETURN_IF_ERROR(queue_status);
  return SubmitHeld();
}

absl::Status IoPipeline::Abort() {
  // Held transfers never reached the queue: nothing touches their buffers.
  for (uint64_t tag : held_) transfers_.erase(tag);
  held_.clear();
  // A failed Reap may be transient; a queue that keeps failing will never
  // report the rest, and waiting for it would hang the worker.
  constexpr int kReapAttempts = 3;
  absl::Status status;
  int failures = 0;
  while (in_flight_ > 0 && failures < kReapAttempts) {
    completions_.clear();
    const absl::Status reaped = queue_->Reap(1, &completions_);
    for (const IoCompletion& c : completions_) {
      // With the held ones gone, each transfer left has exactly one request
      // in flight (the rest of a short one is requeued into held_, never
      // submitted twice): its completion, whatever the result, ends it,
      // and its lease goes back here.
      if (transfers_.erase(c.tag) == 0) {
        status.Update(absl::InternalError(
            absl::StrCat("IoPipeline: completion for unknown tag ", c.tag)));
        continue;
      }
      --in_flight_;
      DaemonMetrics::Get().io_queue_depth.Add(-1);
    }
    if (reaped.ok()) {
      failures = 0;
    } else {
      status.Update(reaped);
      ++failures;
    }
  }
  if (in_flight_ > 0) {
    for (auto& [tag, t] : transfers_) {
      LogError("IoPipeline: ", Describe(t.remaining),
               " may still be in flight after the queue failed (",
               status.ToString(), "); its buffer stays out of the pool");
      t.buffer.Withhold();
    }
  }
  transfers_.clear();
  // Withheld transfers leave the gauge with the pipeline that forgets them.
  DaemonMetrics::Get().io_queue_depth.Add(-static_cast<double>(in_flight_));
  in_flight_ = 0;
  return status;
}

}  // namespace ckpt

// IoQueue on synchronous pread/pwrite: the fallback for kernels without
// io_uring (or where it is disabled by sysctl/seccomp) and the base of the
// fault-injecting test queue.
//
// Each request is one pread/pwrite call inside Submit, not a loop: the
// queue must behave like the ring (short transfers and -errno reported raw)
// so that IoPipeline's retry logic is exercised the same way on both paths.
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "io/io_queue.h"

namespace ckpt {
namespace {

// Runs requests at submission time and holds their completions until Reap.
// Owns nothing but the completion deque; the fds and buffers are the
// caller's. Registered buffer indexes are ignored (there is nothing to
// register with).
class PwriteIoQueue final : public IoQueue {
 public:
  explicit PwriteIoQueue(uint32_t depth) : depth_(depth) {}

  absl::string_view name() const override { return "pwrite"; }
  uint32_t depth() const override { return depth_; }

  absl::Status Submit(absl::Span<const IoRequest> requests,
                      size_t* submitted) override {
    *submitted = 0;
    // Same contract as the ring: a caller exceeding the depth has a
    // bookkeeping bug that the ring would turn into a full SQ.
    if (done_.size() + requests.size() > depth_) {
      return absl::FailedPreconditionError(
          absl::StrCat("pwrite Submit: ", done_.size(), " in flight + ",
                       requests.size(), " new exceeds depth ", depth_));
    }
    for (const IoRequest& r : requests) {
      const off_t offset = static_cast<off_t>(r.offset);
      const ssize_t n = r.kind == IoRequest::Kind::kRead
                            ? ::pread(r.fd, r.buffer, r.length, offset)
                            : ::pwrite(r.fd, r.buffer, r.length, offset);
      // Linux caps one read/write at MAX_RW_COUNT (< 2 GiB), so a byte
      // count always fits the int32 result, as it does for io_uring.
      done_.push_back(IoCompletion{
          .tag = r.tag, .result = n < 0 ? -errno : static_cast<int32_t>(n)});
    }
    *submitted = requests.size();
    return absl::OkStatus();
  }

  absl::Status Reap(uint32_t min_completions,
                    std::vector<IoCompletion>* out) override {
    if (min_completions > done_.size()) {
      // Everything submitted has already completed; waiting for more would
      // never return.
      return absl::FailedPreconditionError(
          absl::StrCat("pwrite Reap: waiting for ", min_completions,
                       " completions with only ", done_.size(), " in flight"));
    }
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return absl::OkStatus();
  }

 private:
  const uint32_t depth_;
  std::deque<IoCompletion> done_;  // completed, not yet reaped
};

}  // namespace

std::unique_ptr<IoQueue> CreatePwriteQueue(uint32_t depth) {
  return std::make_unique<PwriteIoQueue>(depth);
}

}  // namespace ckpt

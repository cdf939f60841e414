// RelayOrder: the relay operations of a device reach its relay stream in
// record order (TrainerGpu::Relay).
//
// One relay stream per device carries every relay record's "wait for the
// daemon's staged record, then write the relay record after the one
// before". Enqueued out of order (record R + 1 passed on, from another
// thread, before R), R + 1's write would wait on the stream for R, which is
// queued behind it: the stream, and every trainer stream waiting for a
// relay record, would hang for good. So a Relay call first waits, on the
// CPU, until every earlier record of the device was relayed (its Relay
// call made, whatever its outcome: a record whose enqueue failed is
// completed from the CPU by its owner, and the GPU waits for that). A
// caller that passes on in reservation order never waits; one whose
// predecessor is never passed on gets DeadlineExceeded after kTimeout.
//
// Records are counted from 1 per device (the relay event is this process's
// own and new); `mask` is the width they wrap at (CUDA's event pages count
// in 32 bits).
//
// Thread-safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt {

class RelayOrder {
 public:
  static constexpr absl::Duration kTimeout = absl::Seconds(10);

  explicit RelayOrder(uint64_t mask) : mask_(mask) {}

  // Runs `enqueue` for `record` of `device` once the records before it
  // were relayed, with no other relay of the device in between; its status.
  absl::Status InOrder(const std::string& device, uint64_t record,
                       absl::FunctionRef<absl::Status()> enqueue) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t mask_;
  absl::Mutex mu_;
  // The next record to relay, per device (absent: 1).
  std::map<std::string, uint64_t> next_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

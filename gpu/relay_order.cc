#include "gpu/relay_order.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status RelayOrder::InOrder(const std::string& device, uint64_t record,
                                 absl::FunctionRef<absl::Status()> enqueue) {
  record &= mask_;
  absl::MutexLock lock(&mu_);
  uint64_t& next = next_.try_emplace(device, 1).first->second;
  const auto turn = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next == record; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&turn), kTimeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "relay record ", record, " on device ", absl::BytesToHexString(device),
        " waited ", absl::FormatDuration(kTimeout), " for relay record ", next,
        " to be passed on first (relays are passed on in the order they were reserved)"));
  }
  // Held across the enqueue: the next record's operations go after these.
  const absl::Status status = enqueue();
  next = (record + 1) & mask_;
  return status;
}

}  // namespace ckpt

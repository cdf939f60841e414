#include "restore/load_plan_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "restore/shard_reader.h"

namespace ckpt {

// The plan's Delivery, and room for the one transient copy of a run: a
// merged Delivery, or the tiling check's range, which is smaller.
static_assert(sizeof(std::pair<uint64_t, uint64_t>) <= sizeof(Delivery));
const uint64_t LoadPlanBudget::kBytesPerRun = 2 * sizeof(Delivery);

std::shared_ptr<LoadPlanBudget> LoadPlanBudget::Create(uint64_t max_bytes) {
  return std::shared_ptr<LoadPlanBudget>(new LoadPlanBudget(max_bytes));
}

LoadPlanBudget::Reservation LoadPlanBudget::Open() {
  return Reservation(shared_from_this());
}

LoadPlanBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::move(other.budget_)), bytes_(std::exchange(other.bytes_, 0)) {}

LoadPlanBudget::Reservation& LoadPlanBudget::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::move(other.budget_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

LoadPlanBudget::Reservation::~Reservation() { Release(); }

void LoadPlanBudget::Reservation::Release() {
  if (budget_ != nullptr && bytes_ > 0) {
    budget_->used_.fetch_sub(bytes_, std::memory_order_relaxed);
  }
  bytes_ = 0;
}

absl::Status LoadPlanBudget::Reservation::Add(uint64_t runs, absl::string_view fqn) {
  const uint64_t max = budget_->max_bytes_;
  // Saturating: runs * kBytesPerRun must not wrap into a small number.
  const uint64_t bytes =
      runs > UINT64_MAX / kBytesPerRun ? UINT64_MAX : runs * kBytesPerRun;
  uint64_t used = budget_->used_.load(std::memory_order_relaxed);
  while (true) {
    if (bytes > max - used) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "item ", fqn, ": the load needs ", runs,
          " more copy runs (one per row of a slice narrower than the stored rows), ",
          bytes, " bytes of plan, and loads in flight hold ", used,
          " of the daemon's --load_plan_bytes ", max,
          "; load wider slices or fewer items at once, or raise --load_plan_bytes"));
    }
    if (budget_->used_.compare_exchange_weak(used, used + bytes,
                                             std::memory_order_relaxed)) {
      bytes_ += bytes;
      return absl::OkStatus();
    }
  }
}

}  // namespace ckpt

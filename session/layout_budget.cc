#include "session/layout_budget.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

// Heap bytes of a std::string (none while it fits the inline buffer).
uint64_t HeapBytes(const std::string& s) {
  return s.capacity() > 15 ? s.capacity() + 1 : 0;
}

template <typename T>
uint64_t HeapBytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

// What malloc adds to an item's heap blocks, which SpaceUsedLong does not
// count: about six blocks per TensorItem (fqn, three shapes, the memory
// reference, the replica ranks) at ~16 bytes each. With it the estimate
// matches the measured growth: ~600 bytes per item of a 1,000,000-item
// layout (LayoutBytes 596 MB; RSS +570 to +600 MB per further layout).
constexpr uint64_t kMallocBytesPerItem = 96;

}  // namespace

uint64_t LayoutBytes(const TensorLayout& layout) {
  uint64_t bytes =
      sizeof(TensorLayout) + HeapBytes(layout.items) + HeapBytes(layout.remote);
  // SpaceUsedLong counts the message itself too: HeapBytes(items) has it.
  for (const v1::TensorItem& item : layout.items) {
    bytes +=
        item.SpaceUsedLong() - sizeof(v1::TensorItem) + kMallocBytesPerItem;
  }
  const RankPlan& plan = layout.plan;
  bytes +=
      HeapBytes(plan.files) + HeapBytes(plan.foreign) + HeapBytes(plan.sets);
  for (const PlannedFile& f : plan.files) {
    bytes += HeapBytes(f.name) + HeapBytes(f.replica_set) + HeapBytes(f.items) +
             HeapBytes(f.layout.header) + HeapBytes(f.layout.data_offsets);
  }
  for (const ForeignChunk& c : plan.foreign) bytes += HeapBytes(c.file);
  for (const ReplicaSetSummary& s : plan.sets) bytes += HeapBytes(s.ranks);
  return bytes;
}

LayoutBudget::Charge::Charge(Charge&& other) noexcept
    : budget_(std::move(other.budget_)),
      session_id_(other.session_id_),
      bytes_(other.bytes_) {
  other.bytes_ = 0;
}

LayoutBudget::Charge& LayoutBudget::Charge::operator=(Charge&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::move(other.budget_);
    session_id_ = other.session_id_;
    bytes_ = other.bytes_;
    other.bytes_ = 0;
  }
  return *this;
}

LayoutBudget::Charge::~Charge() { Release(); }

void LayoutBudget::Charge::Release() {
  if (budget_ != nullptr) budget_->Give(session_id_, bytes_);
  budget_.reset();
  bytes_ = 0;
}

std::shared_ptr<LayoutBudget> LayoutBudget::Create(LayoutLimits limits) {
  return std::shared_ptr<LayoutBudget>(new LayoutBudget(limits));
}

absl::Status LayoutBudget::CheckRoomLocked(uint64_t session_id,
                                           uint64_t bytes) const {
  auto it = by_session_.find(session_id);
  const uint64_t session_used = it == by_session_.end() ? 0 : it->second;
  // Compared without adding, so that no sum can wrap.
  if (bytes > limits_.per_session ||
      session_used > limits_.per_session - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a layout of ", bytes,
        " bytes does not fit the per-session layout budget "
        "(--layout_bytes_per_session ",
        limits_.per_session, "): session ", session_id, "'s layouts hold ",
        session_used,
        " bytes; define fewer or smaller layouts, or raise the budget"));
  }
  if (bytes > limits_.total || used_ > limits_.total - bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a layout of ", bytes,
                     " bytes does not fit the daemon's layout budget "
                     "(--layout_bytes_total ",
                     limits_.total,
                     "): the layouts of all sessions "
                     "hold ",
                     used_,
                     " bytes; try again once other sessions have ended, or "
                     "raise the budget"));
  }
  return absl::OkStatus();
}

absl::Status LayoutBudget::CheckRoom(uint64_t session_id,
                                     uint64_t bytes) const {
  absl::MutexLock lock(&mu_);
  return CheckRoomLocked(session_id, bytes);
}

absl::StatusOr<LayoutBudget::Charge> LayoutBudget::Reserve(uint64_t session_id,
                                                           uint64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status room = CheckRoomLocked(session_id, bytes); !room.ok()) {
      return room;
    }
    used_ += bytes;
    by_session_[session_id] += bytes;
  }
  return Charge(shared_from_this(), session_id, bytes);
}

void LayoutBudget::Give(uint64_t session_id, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
  auto it = by_session_.find(session_id);
  if (it == by_session_.end()) return;  // cannot happen: charged first
  it->second -= bytes;
  if (it->second == 0) by_session_.erase(it);
}

uint64_t LayoutBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t LayoutBudget::used_by(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_session_.find(session_id);
  return it == by_session_.end() ? 0 : it->second;
}

}  // namespace ckpt

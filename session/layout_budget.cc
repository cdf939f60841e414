#include "session/layout_budget.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt {

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

absl::Status LayoutBudget::Charge::Resize(uint64_t bytes) {
  if (budget_ == nullptr) {
    return absl::FailedPreconditionError(
        "resizing a layout charge that holds no budget");
  }
  if (bytes < bytes_) {
    budget_->Give(session_id_, bytes_ - bytes);
  } else if (bytes > bytes_) {
    RETURN_IF_ERROR(budget_->Take(session_id_, bytes - bytes_));
  }
  bytes_ = bytes;
  return absl::OkStatus();
}

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
        "a layout of up to ", bytes,
        " bytes does not fit the per-session layout budget "
        "(--layout_bytes_per_session ",
        limits_.per_session, "): session ", session_id, "'s layouts (with those being built) hold ",
        session_used,
        " bytes; define fewer or smaller layouts, or raise the budget"));
  }
  if (bytes > limits_.total || used_ > limits_.total - bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a layout of up to ", bytes,
                     " bytes does not fit the daemon's layout budget "
                     "(--layout_bytes_total ",
                     limits_.total,
                     "): the layouts of all sessions (with those being "
                     "built) hold ",
                     used_,
                     " bytes; try again once other sessions have ended, or "
                     "raise the budget"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayoutBudget::Charge> LayoutBudget::Reserve(uint64_t session_id,
                                                           uint64_t bytes) {
  RETURN_IF_ERROR(Take(session_id, bytes));
  return Charge(shared_from_this(), session_id, bytes);
}

absl::Status LayoutBudget::Take(uint64_t session_id, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRoomLocked(session_id, bytes));
  used_ += bytes;
  by_session_[session_id] += bytes;
  return absl::OkStatus();
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

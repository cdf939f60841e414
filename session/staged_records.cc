#include "session/staged_records.h"

#include <utility>

namespace ckpt {

StagedRecords::StagedRecords(StagedRecords&& other) noexcept
    : records_(std::move(other.records_)), completer_(other.completer_) {
  other.records_.clear();
}

StagedRecords& StagedRecords::operator=(StagedRecords&& other) noexcept {
  if (this != &other) {
    CompleteRest();
    records_ = std::move(other.records_);
    completer_ = other.completer_;
    other.records_.clear();
  }
  return *this;
}

std::optional<uint64_t> StagedRecords::Take(const GpuEvent* event) {
  for (Record& r : records_) {
    if (r.event.get() == event && !r.made) {
      r.made = true;
      return r.number;
    }
  }
  return std::nullopt;
}

void StagedRecords::Untake(const GpuEvent* event) {
  for (Record& r : records_) {
    if (r.event.get() == event) r.made = false;
  }
}

void StagedRecords::CompleteRest() {
  for (Record& r : records_) {
    if (r.made) continue;
    r.made = true;
    completer_->Complete(r.event, r.number);
  }
}

}  // namespace ckpt

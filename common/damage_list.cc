#include "common/damage_list.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ckpt {
namespace {

constexpr absl::string_view kSummaryPrefix = "and ";
constexpr absl::string_view kSummaryMiddle = " more problems not listed: ";
constexpr absl::string_view kSummarySuffix = " in all";

}  // namespace

void DamageList::Add(std::string line) {
  ++total_;
  if (line.size() > kMaxDamageLineBytes) {
    // The start names the file and the item; the rest is detail.
    line.resize(kMaxDamageLineBytes);
    line.append("...");
  }
  if (listed_.size() >= kMaxListedDamage ||
      listed_bytes_ + line.size() > kMaxListedDamageBytes) {
    return;
  }
  listed_bytes_ += line.size();
  listed_.push_back(std::move(line));
}

std::vector<std::string> DamageList::Lines() const {
  std::vector<std::string> lines = listed_;
  if (total_ > listed_.size()) {
    lines.push_back(absl::StrCat(kSummaryPrefix, total_ - listed_.size(),
                                 kSummaryMiddle, total_, kSummarySuffix));
  }
  return lines;
}

uint64_t DamageTotal(size_t listed, absl::string_view last) {
  absl::string_view rest = last;
  uint64_t total = 0;
  if (listed > 0 && absl::ConsumePrefix(&rest, kSummaryPrefix) &&
      absl::ConsumeSuffix(&rest, kSummarySuffix)) {
    const size_t middle = rest.find(kSummaryMiddle);
    if (middle != absl::string_view::npos &&
        absl::SimpleAtoi(rest.substr(middle + kSummaryMiddle.size()), &total) &&
        total >= listed) {
      return total;
    }
  }
  return listed;
}

}  // namespace ckpt

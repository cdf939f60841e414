#include "common/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace crash_point_internal {

struct Armed {
  std::string point;  // "<where>.<step>"
  uint64_t nth = 1;   // the hit that kills
  mutable std::atomic<uint64_t> hits{0};  // calls of the point so far
};

namespace {

constexpr char kVariable[] = "CKPTD_CRASH_AT";

// Static initialization may run before main sets anything up, the logger's
// level included: a plain write(2) of one line, dropped if it fails (there
// is nowhere else to say it).
void SayAtStart(const std::string& line) {
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

const Armed* ArmFromEnvironment() {
  const char* value = std::getenv(kVariable);
  if (value == nullptr || *value == '\0') return nullptr;
  const absl::string_view text = value;
  absl::string_view point = text;
  uint64_t nth = 1;
  if (const size_t at = text.rfind('@'); at != absl::string_view::npos) {
    point = text.substr(0, at);
    if (!absl::SimpleAtoi(text.substr(at + 1), &nth) || nth == 0) point = "";
  }
  // "<where>.<step>", both non-empty.
  const size_t dot = point.rfind('.');
  if (dot == absl::string_view::npos || dot == 0 || dot + 1 == point.size()) {
    SayAtStart(absl::StrCat(kVariable, "=", text,
                            " is not <where>.<step>[@<n>] with n >= 1: no crash "
                            "point armed (a test facility; unset it)\n"));
    return nullptr;
  }
  auto* result = new Armed;  // lives as long as the process
  result->point = std::string(point);
  result->nth = nth;
  SayAtStart(absl::StrCat(kVariable, "=", text, ": this process kills itself with "
                          "SIGKILL at hit ", nth, " of crash point ", result->point,
                          " (a test facility; unset it outside tests)\n"));
  return result;
}

}  // namespace

const Armed* const armed = ArmFromEnvironment();

void Reached(const Armed& spec, absl::string_view where,
             absl::string_view step) {
  // "<where>.<step>" == spec.point, without building the string.
  const absl::string_view point = spec.point;
  if (point.size() != where.size() + 1 + step.size() ||
      point.substr(0, where.size()) != where || point[where.size()] != '.' ||
      point.substr(where.size() + 1) != step) {
    return;
  }
  if (spec.hits.fetch_add(1) + 1 != spec.nth) return;
  LogError("crash point ", point, " reached (hit ", spec.nth, ", ", kVariable,
           "): raising SIGKILL");
  // SIGKILL to the process ends every thread before this one runs another
  // instruction of ours; if the kernel refused it, die anyway, since the
  // test asked for this process not to go past the point.
  if (::kill(::getpid(), SIGKILL) != 0) {
    LogError("crash point ", point, ": ",
             ErrnoToStatus(errno, "kill(SIGKILL) of this process").ToString(),
             "; aborting");
  }
  std::abort();
}

}  // namespace crash_point_internal
}  // namespace ckpt

#include "daemon/save_drain.h"

#include <time.h>

#include <cerrno>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace ckpt {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(100);

// The checkpoints ("job/name") of the saves not yet in a final phase.
std::set<std::string> CheckpointsInFlight(const SaveCoordinator& saves) {
  std::set<std::string> names;
  for (const v1::SaveProgress& p : saves.InFlight()) {
    names.insert(absl::StrCat(p.job(), "/", p.checkpoint()));
  }
  return names;
}

// Waits up to `timeout` for one of `signals`; its number, or 0.
int WaitForSignal(const sigset_t& signals, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  const int signal = sigtimedwait(&signals, nullptr, &ts);
  // EAGAIN: the timeout; EINTR: another signal (none is handled here).
  return signal > 0 ? signal : 0;
}

}  // namespace

std::string DrainCancelReason(absl::Duration deadline) {
  return absl::StrCat("ckptd stopped before this checkpoint committed; drain deadline ",
                      absl::ToInt64Milliseconds(deadline), " ms");
}

DrainOutcome DrainSaves(SaveCoordinator& saves, absl::Duration deadline,
                        const sigset_t& signals, const std::function<void()>& tick) {
  DrainOutcome outcome;
  saves.StopAccepting();
  const std::set<std::string> at_start = CheckpointsInFlight(saves);
  if (!at_start.empty()) {
    LogInfo("drain: refusing new saves; waiting up to ", absl::FormatDuration(deadline),
            " for ", at_start.size(), " checkpoint(s) in flight: ",
            absl::StrJoin(at_start, ", "));
  }
  const absl::Time end = absl::Now() + deadline;
  std::set<std::string> left = at_start;
  while (!left.empty()) {
    const absl::Duration remaining = end - absl::Now();
    if (remaining <= absl::ZeroDuration()) break;
    const int signal = WaitForSignal(signals, std::min(remaining, kPoll));
    if (signal == SIGHUP) {
      LogInfo("drain: ignoring SIGHUP, ckptd is stopping");
    } else if (signal != 0) {
      LogWarning("drain: signal ", signal, " again; cancelling what is left now");
      outcome.cut_short = true;
      break;
    }
    tick();
    left = CheckpointsInFlight(saves);
  }
  for (const std::string& name : at_start) {
    if (left.count(name) == 0) outcome.ended.push_back(name);
  }
  if (!left.empty()) outcome.cancelled = saves.CancelAll(DrainCancelReason(deadline));
  if (!at_start.empty()) {
    LogInfo("drain: ", outcome.ended.size(), " checkpoint(s) ended while draining",
            outcome.ended.empty() ? "" : ": ", absl::StrJoin(outcome.ended, ", "),
            "; ", outcome.cancelled.size(), " cancelled",
            outcome.cut_short ? " on the second signal" : " at the deadline",
            outcome.cancelled.empty() ? "" : ": ",
            absl::StrJoin(outcome.cancelled, ", "));
  }
  return outcome;
}

}  // namespace ckpt

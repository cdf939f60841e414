#include "storage/s3/retry_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"

namespace ckpt::s3 {

bool IsRetryableHttpError(int http_status, absl::string_view s3_code) {
  if (s3_code == "SlowDown" || s3_code == "RequestTimeout" ||
      s3_code == "InternalError" || s3_code == "ServiceUnavailable" ||
      s3_code == "Throttling" || s3_code == "ThrottlingException") {
    return true;
  }
  if (http_status == 408 || http_status == 429) return true;
  // 501 Not Implemented is a permanent answer about the request itself.
  return http_status >= 500 && http_status <= 599 && http_status != 501;
}

bool IsRetryableTransportError(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

RetryClock RetryClock::Real() {
  struct SharedBitGen {
    absl::Mutex mutex;
    absl::BitGen bits ABSL_GUARDED_BY(mutex);
  };
  auto random = std::make_shared<SharedBitGen>();
  return RetryClock{
      .now = [] { return absl::Now(); },
      .sleep = [](absl::Duration wait) { absl::SleepFor(wait); },
      .uniform =
          [random] {
            absl::MutexLock lock(&random->mutex);
            return absl::Uniform<double>(random->bits, 0.0, 1.0);
          },
  };
}

RetryPolicy::RetryPolicy(RetryOptions options, RetryClock clock)
    : options_(options), clock_(std::move(clock)) {
  options_.max_attempts = std::max(options_.max_attempts, 1);
}

absl::Duration RetryPolicy::Backoff(int next_attempt) const {
  // initial * 2^(n-2) for attempt n >= 2, capped; the exponent is capped
  // too so that the shift cannot overflow.
  const int doublings = std::clamp(next_attempt - 2, 0, 30);
  const absl::Duration ceiling =
      std::min(options_.max_backoff, options_.initial_backoff * (int64_t{1} << doublings));
  return ceiling * std::clamp(clock_.uniform(), 0.0, 1.0);
}

absl::Status RetryPolicy::Run(
    absl::FunctionRef<AttemptResult(int attempt, absl::Duration time_left)> attempt,
    int* attempts) const {
  const absl::Time deadline = clock_.now() + options_.overall_deadline;
  absl::Status last;
  int made = 0;
  auto finish = [&](absl::string_view why) {
    if (attempts != nullptr) *attempts = made;
    if (made <= 1 && why.empty()) return last;
    return Annotate(last, absl::StrCat(why, made, made == 1 ? " attempt" : " attempts"));
  };
  while (true) {
    ++made;
    AttemptResult result = attempt(made, deadline - clock_.now());
    last = std::move(result.status);
    if (last.ok()) {
      if (attempts != nullptr) *attempts = made;
      return last;
    }
    if (!result.retryable) return finish(made > 1 ? "failed for good after " : "");
    if (made >= options_.max_attempts) return finish("gave up after ");
    const absl::Duration wait = Backoff(made + 1);
    if (clock_.now() + wait >= deadline) {
      return finish(absl::StrCat("overall deadline of ",
                                 absl::FormatDuration(options_.overall_deadline),
                                 " reached after "));
    }
    if (options_.on_retry) options_.on_retry();
    clock_.sleep(wait);
  }
}

}  // namespace ckpt::s3

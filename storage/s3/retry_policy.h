// When an S3 request is tried again, and how long to wait before it.
//
// Retried: 5xx (503 SlowDown included), 429, 408, S3's RequestTimeout and
// the other throttling/internal codes, and the transport's transient
// failures (connect refused or reset, a deadline or a stalled transfer:
// absl::StatusCode::kUnavailable / kDeadlineExceeded from HttpTransport).
// Never retried: authentication and authorization (403
// InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied), a missing
// bucket or key (404), and every other 4xx: trying again cannot change
// the answer, and a retried 403 only delays the operator's fix.
//
// Backoff is "full jitter" (AWS Architecture Blog, "Exponential Backoff
// And Jitter"): before attempt n+1 a uniform wait in
// [0, min(max_backoff, initial_backoff * 2^(n-1))], so many nodes throttled
// at once spread out instead of returning together. Attempts stop at
// max_attempts, or when the next wait would end past the overall deadline:
// an operation ends within that bound whatever the server does.
//
// The clock, the sleep and the random source are injected (tests run the
// policy without waiting).
//
// Thread-safety: a RetryPolicy is immutable; Run may be called from many
// threads at once if the injected functions may (the defaults may).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::s3 {

struct RetryOptions {
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // From the first attempt's start to the last attempt's end.
  absl::Duration overall_deadline = absl::Minutes(2);
  // Called once per attempt tried again, before its backoff (the daemon
  // counts them: ckptd_remote_retries_total); may be empty. Must be
  // thread-safe when the policy is run from several threads.
  std::function<void()> on_retry = nullptr;
};

// Whether an HTTP answer is worth another attempt (`s3_code` is the error
// XML's <Code>, empty if there was none).
bool IsRetryableHttpError(int http_status, absl::string_view s3_code);
// Whether a transport failure is (HttpTransport's codes, above).
bool IsRetryableTransportError(const absl::Status& status);

// What one attempt came to.
struct AttemptResult {
  absl::Status status;
  bool retryable = false;
};

struct RetryClock {
  std::function<absl::Time()> now;
  std::function<void(absl::Duration)> sleep;
  // Uniform in [0, 1).
  std::function<double()> uniform;
  static RetryClock Real();
};

class RetryPolicy {
 public:
  explicit RetryPolicy(RetryOptions options, RetryClock clock = RetryClock::Real());

  // The wait before attempt `next_attempt` (2, 3, ...): full jitter.
  absl::Duration Backoff(int next_attempt) const;

  // Runs `attempt` (given its 1-based number and the time left before the
  // overall deadline, which bounds that attempt's own deadline) until it
  // succeeds, fails for good, or the attempts or the deadline run out.
  // The last error comes back, with how many attempts were made when more
  // than one; `attempts` (if not null) receives that number.
  absl::Status Run(absl::FunctionRef<AttemptResult(int attempt, absl::Duration time_left)> attempt,
                   int* attempts = nullptr) const;

  const RetryOptions& options() const { return options_; }

 private:
  RetryOptions options_;
  RetryClock clock_;
};

}  // namespace ckpt::s3

// Retry classification and full-jitter backoff, on a fake clock.
#include <catch2/catch.hpp>

#include <vector>

#include "storage/s3/retry_policy.h"

namespace ckpt::s3 {
namespace {

// A clock that only moves when slept on, and a "random" source that
// returns what the test says.
struct FakeTime {
  absl::Time now = absl::UnixEpoch();
  double uniform = 1.0;
  std::vector<absl::Duration> sleeps;
  RetryClock Clock() {
    return RetryClock{.now = [this] { return now; },
                      .sleep = [this](absl::Duration d) { sleeps.push_back(d); now += d; },
                      .uniform = [this] { return uniform; }};
  }
};

TEST_CASE("retry: what is retried and what is not", "[retry]") {
  CHECK(IsRetryableHttpError(500, "InternalError"));
  CHECK(IsRetryableHttpError(503, "SlowDown"));
  CHECK(IsRetryableHttpError(503, ""));
  CHECK(IsRetryableHttpError(502, ""));
  CHECK(IsRetryableHttpError(429, ""));
  CHECK(IsRetryableHttpError(408, ""));
  CHECK(IsRetryableHttpError(400, "RequestTimeout"));
  CHECK_FALSE(IsRetryableHttpError(501, "NotImplemented"));
  CHECK_FALSE(IsRetryableHttpError(403, "InvalidAccessKeyId"));
  CHECK_FALSE(IsRetryableHttpError(403, "SignatureDoesNotMatch"));
  CHECK_FALSE(IsRetryableHttpError(403, "AccessDenied"));
  CHECK_FALSE(IsRetryableHttpError(404, "NoSuchBucket"));
  CHECK_FALSE(IsRetryableHttpError(404, "NoSuchKey"));
  CHECK_FALSE(IsRetryableHttpError(400, "InvalidArgument"));
  CHECK(IsRetryableTransportError(absl::UnavailableError("connection refused")));
  CHECK(IsRetryableTransportError(absl::DeadlineExceededError("timeout")));
  CHECK_FALSE(IsRetryableTransportError(absl::InternalError("TLS certificate")));
  CHECK_FALSE(IsRetryableTransportError(absl::ResourceExhaustedError("too large")));
}

TEST_CASE("retry: full jitter stays within [0, min(max, initial * 2^(n-2))]", "[retry]") {
  FakeTime time;
  RetryPolicy policy(RetryOptions{.max_attempts = 10,
                                  .initial_backoff = absl::Milliseconds(100),
                                  .max_backoff = absl::Seconds(1)},
                     time.Clock());
  time.uniform = 1.0;  // the ceiling
  CHECK(policy.Backoff(2) == absl::Milliseconds(100));
  CHECK(policy.Backoff(3) == absl::Milliseconds(200));
  CHECK(policy.Backoff(4) == absl::Milliseconds(400));
  CHECK(policy.Backoff(5) == absl::Milliseconds(800));
  CHECK(policy.Backoff(6) == absl::Seconds(1));
  CHECK(policy.Backoff(60) == absl::Seconds(1));  // no overflow far out
  time.uniform = 0.25;
  CHECK(policy.Backoff(4) == absl::Milliseconds(100));
  time.uniform = 0.0;
  CHECK(policy.Backoff(4) == absl::ZeroDuration());
}

TEST_CASE("retry: retryable failures are tried until max_attempts, then named", "[retry]") {
  FakeTime time;
  RetryPolicy policy(RetryOptions{.max_attempts = 4,
                                  .initial_backoff = absl::Milliseconds(10),
                                  .max_backoff = absl::Seconds(1),
                                  .overall_deadline = absl::Minutes(1)},
                     time.Clock());
  int calls = 0;
  int attempts = 0;
  absl::Status status = policy.Run(
      [&](int attempt, absl::Duration) {
        ++calls;
        CHECK(attempt == calls);
        return AttemptResult{absl::UnavailableError("HTTP 503 SlowDown"), true};
      },
      &attempts);
  CHECK(calls == 4);
  CHECK(attempts == 4);
  CHECK(absl::IsUnavailable(status));
  CHECK(std::string(status.message()) == "gave up after 4 attempts: HTTP 503 SlowDown");
  REQUIRE(time.sleeps.size() == 3);
  CHECK(time.sleeps[2] == absl::Milliseconds(40));
}

TEST_CASE("retry: on_retry is called once per attempt tried again, never for a permanent "
          "failure or the last attempt",
          "[retry]") {
  FakeTime time;
  int retries = 0;
  RetryOptions options{.max_attempts = 3,
                       .initial_backoff = absl::Milliseconds(10),
                       .max_backoff = absl::Seconds(1),
                       .overall_deadline = absl::Minutes(1)};
  options.on_retry = [&retries] { ++retries; };
  RetryPolicy policy(options, time.Clock());
  // Two 503s, then success: two retries.
  int calls = 0;
  CHECK(policy
            .Run([&](int, absl::Duration) {
              return ++calls < 3 ? AttemptResult{absl::UnavailableError("HTTP 503"), true}
                                 : AttemptResult{absl::OkStatus(), false};
            })
            .ok());
  CHECK(retries == 2);
  // Retryable to the end: the last attempt is not retried.
  retries = 0;
  CHECK_FALSE(policy
                  .Run([](int, absl::Duration) {
                    return AttemptResult{absl::UnavailableError("HTTP 503"), true};
                  })
                  .ok());
  CHECK(retries == 2);
  // A 403 is not retried at all.
  retries = 0;
  CHECK_FALSE(policy
                  .Run([](int, absl::Duration) {
                    return AttemptResult{absl::PermissionDeniedError("HTTP 403"), false};
                  })
                  .ok());
  CHECK(retries == 0);
}

TEST_CASE("retry: a permanent failure is not retried, and a success ends the loop", "[retry]") {
  FakeTime time;
  RetryPolicy policy(RetryOptions{}, time.Clock());
  int attempts = 0;
  absl::Status denied = policy.Run(
      [&](int, absl::Duration) {
        return AttemptResult{absl::PermissionDeniedError("HTTP 403 AccessDenied"), false};
      },
      &attempts);
  CHECK(attempts == 1);
  CHECK(std::string(denied.message()) == "HTTP 403 AccessDenied");
  CHECK(time.sleeps.empty());

  absl::Status ok = policy.Run(
      [&](int attempt, absl::Duration) {
        return attempt < 3 ? AttemptResult{absl::UnavailableError("503"), true}
                           : AttemptResult{absl::OkStatus(), false};
      },
      &attempts);
  CHECK(ok.ok());
  CHECK(attempts == 3);
}

TEST_CASE("retry: the overall deadline bounds the attempts and each one's time", "[retry]") {
  FakeTime time;
  RetryPolicy policy(RetryOptions{.max_attempts = 100,
                                  .initial_backoff = absl::Seconds(1),
                                  .max_backoff = absl::Seconds(4),
                                  .overall_deadline = absl::Seconds(10)},
                     time.Clock());
  std::vector<absl::Duration> time_left;
  int attempts = 0;
  absl::Status status = policy.Run(
      [&](int, absl::Duration left) {
        time_left.push_back(left);
        time.now += absl::Seconds(1);  // each attempt takes a second
        return AttemptResult{absl::DeadlineExceededError("stalled"), true};
      },
      &attempts);
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(std::string(status.message()).find("overall deadline of 10s reached after") == 0);
  CHECK(time.now - absl::UnixEpoch() <= absl::Seconds(10));
  CHECK(attempts < 100);
  CHECK(time_left.front() == absl::Seconds(10));
  for (size_t i = 1; i < time_left.size(); ++i) CHECK(time_left[i] < time_left[i - 1]);
}

}  // namespace
}  // namespace ckpt::s3

// The write rate limiter (io/rate_limiter.h): its cap, a turn taken without
// waiting, a live change of it, and a cancelled writer giving up its turn.
#include "io/rate_limiter.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST_CASE("a rate limiter spaces writes at its rate", "[io][rate_limiter]") {
  RateLimiter limiter(10 << 20);  // 10 MiB/s
  const auto start = Clock::now();
  for (int i = 0; i < 4; ++i) limiter.Acquire(1 << 20);
  // The first write goes at once, each later one 0.1 s after the one before.
  CHECK(SecondsSince(start) >= 0.29);
  CHECK(SecondsSince(start) < 2.0);
}

TEST_CASE("a rate limiter's TryAcquire takes a turn only once it has come, "
          "never waiting", "[io][rate_limiter]") {
  RateLimiter limiter(1 << 20);  // 1 MiB/s: 8 MiB move the next turn 8 s on
  const auto start = Clock::now();
  CHECK(limiter.TryAcquire(8 << 20));
  CHECK_FALSE(limiter.TryAcquire(4096));
  CHECK_FALSE(limiter.TryAcquire(4096));
  CHECK(SecondsSince(start) < 2.0);
  // Lifted, or a new rate: the turn is there at once.
  limiter.SetRate(0);
  CHECK(limiter.TryAcquire(8 << 20));
  CHECK(limiter.TryAcquire(8 << 20));
  limiter.SetRate(1 << 20);
  CHECK(limiter.TryAcquire(8 << 20));
  CHECK_FALSE(limiter.TryAcquire(4096));
}

TEST_CASE("lifting a rate limit lets a waiting writer go at once",
          "[io][rate_limiter]") {
  RateLimiter limiter(1 << 20);  // 1 MiB/s: the second 8 MiB waits 8 s
  limiter.Acquire(8 << 20);
  const auto start = Clock::now();
  std::thread writer([&] { limiter.Acquire(8 << 20); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  limiter.SetRate(0);
  writer.join();
  CHECK(SecondsSince(start) < 2.0);
  CHECK(limiter.rate() == 0);
}

TEST_CASE("a cancelled writer stops waiting for its turn", "[io][rate_limiter]") {
  RateLimiter limiter(1 << 20);
  limiter.Acquire(8 << 20);
  std::atomic<bool> cancelled{false};
  const auto start = Clock::now();
  bool took_turn = true;
  std::thread writer([&] { took_turn = limiter.Acquire(8 << 20, &cancelled); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  cancelled = true;
  writer.join();
  CHECK(SecondsSince(start) < 2.0);
  CHECK_FALSE(took_turn);  // the writer knows it has no turn
}

}  // namespace
}  // namespace ckpt

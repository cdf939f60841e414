// Tests of StagingPool: argument checks, buffer geometry (O_DIRECT
// alignment, registered-buffer indexes) and the blocking Acquire that is
// the daemon's back-pressure.
#include "io/staging_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace ckpt {
namespace {

constexpr uint32_t kBuffer = 64 * 1024;

std::unique_ptr<StagingPool> MustCreate(uint64_t pool_bytes,
                                        uint32_t buffer_bytes) {
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(pool_bytes, buffer_bytes);
  INFO(pool.status());
  REQUIRE(pool.ok());
  return std::move(pool).value();
}

TEST_CASE(
    "StagingPool::Create rejects buffer sizes that are not a positive "
    "multiple of 4096",
    "[staging_pool]") {
  for (uint32_t size : {0u, 1u, 512u, 4095u, 4097u, 6144u, 65535u}) {
    INFO("buffer bytes " << size);
    CHECK(StagingPool::Create(1 << 20, size).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("StagingPool::Create rejects pools holding fewer than two buffers",
          "[staging_pool]") {
  for (uint64_t pool_bytes : {uint64_t{0}, uint64_t{4096}, uint64_t{kBuffer},
                              uint64_t{2 * kBuffer - 1}}) {
    INFO("pool bytes " << pool_bytes);
    CHECK(StagingPool::Create(pool_bytes, kBuffer).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK(StagingPool::Create(2 * kBuffer, kBuffer).ok());
}

TEST_CASE("StagingPool rounds the pool down to whole buffers",
          "[staging_pool]") {
  auto pool = MustCreate(5 * kBuffer + 4096, kBuffer);
  CHECK(pool->iovecs().size() == 5);
  CHECK(pool->buffer_bytes() == kBuffer);
  CHECK(pool->pool_bytes() == 5 * kBuffer);
  CHECK(pool->free_bytes() == 5 * kBuffer);
}

TEST_CASE(
    "StagingPool buffers are 4096-aligned, distinct, writable and "
    "match their registered iovec",
    "[staging_pool]") {
  auto pool = MustCreate(8 * kBuffer, kBuffer);
  const std::vector<iovec>& iovecs = pool->iovecs();
  REQUIRE(iovecs.size() == 8);

  std::vector<StagingBuffer> taken;
  std::set<int> indexes;
  for (int i = 0; i < 8; ++i) {
    StagingBuffer b = pool->TryAcquire();
    REQUIRE(b.data != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(b.data) % 4096 == 0);
    CHECK(b.size == kBuffer);
    REQUIRE(b.index >= 0);
    REQUIRE(b.index < 8);
    CHECK(iovecs[b.index].iov_base == b.data);
    CHECK(iovecs[b.index].iov_len == kBuffer);
    indexes.insert(b.index);
    // Fill it with its own index; overlapping buffers would clobber each other.
    std::memset(b.data, b.index + 1, b.size);
    taken.push_back(b);
  }
  CHECK(indexes.size() == 8);
  for (const StagingBuffer& b : taken) {
    INFO("buffer " << b.index);
    CHECK(b.data[0] == b.index + 1);
    CHECK(b.data[b.size - 1] == b.index + 1);
  }
  // The iovecs do not overlap either.
  for (size_t i = 1; i < iovecs.size(); ++i) {
    const char* prev = static_cast<char*>(iovecs[i - 1].iov_base);
    const char* cur = static_cast<char*>(iovecs[i].iov_base);
    const bool disjoint = prev + kBuffer <= cur || cur + kBuffer <= prev;
    CHECK(disjoint);
  }
  for (const StagingBuffer& b : taken) pool->Release(b);
}

TEST_CASE("StagingPool::TryAcquire returns no buffer when all are out",
          "[staging_pool]") {
  auto pool = MustCreate(2 * kBuffer, kBuffer);
  StagingBuffer a = pool->TryAcquire();
  StagingBuffer b = pool->TryAcquire();
  REQUIRE(a.data != nullptr);
  REQUIRE(b.data != nullptr);
  StagingBuffer none = pool->TryAcquire();
  CHECK(none.data == nullptr);
  CHECK(none.index == -1);

  pool->Release(b);
  StagingBuffer again = pool->TryAcquire();
  CHECK(again.data == b.data);
  CHECK(again.index == b.index);
  pool->Release(a);
  pool->Release(again);
}

TEST_CASE("StagingPool::free_bytes counts the buffers not borrowed",
          "[staging_pool]") {
  auto pool = MustCreate(4 * kBuffer, kBuffer);
  CHECK(pool->free_bytes() == 4 * kBuffer);
  StagingBuffer a = pool->Acquire();
  CHECK(pool->free_bytes() == 3 * kBuffer);
  StagingBuffer b = pool->TryAcquire();
  CHECK(pool->free_bytes() == 2 * kBuffer);
  pool->Release(a);
  CHECK(pool->free_bytes() == 3 * kBuffer);
  pool->Release(b);
  CHECK(pool->free_bytes() == 4 * kBuffer);
}

TEST_CASE(
    "StagingPool::Acquire blocks until another thread releases a "
    "buffer",
    "[staging_pool]") {
  auto pool = MustCreate(2 * kBuffer, kBuffer);
  StagingBuffer a = pool->Acquire();
  StagingBuffer b = pool->Acquire();
  REQUIRE(pool->free_bytes() == 0);

  std::atomic<bool> acquired{false};
  StagingBuffer got;
  std::thread waiter([&] {
    got = pool->Acquire();
    acquired.store(true);
  });
  // Give the waiter time to block. Not an assertion of timing: if it has
  // not blocked yet, the check below still holds.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(acquired.load());

  pool->Release(b);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!acquired.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool woke = acquired.load();
  if (!woke) pool->Release(a);  // unblock the thread so join returns
  waiter.join();
  REQUIRE(woke);
  CHECK(got.data == b.data);
  CHECK(got.index == b.index);
  pool->Release(a);
  pool->Release(got);
  CHECK(pool->free_bytes() == 2 * kBuffer);
}

TEST_CASE(
    "StagingPool serves many threads borrowing more buffers than it "
    "has without losing any",
    "[staging_pool]") {
  auto pool = MustCreate(3 * kBuffer, kBuffer);
  std::atomic<int> in_use{0};
  std::atomic<int> max_in_use{0};
  std::atomic<bool> overlap{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        StagingBuffer b = pool->Acquire();
        const int now = ++in_use;
        int seen = max_in_use.load();
        while (now > seen && !max_in_use.compare_exchange_weak(seen, now)) {
        }
        // A buffer handed to two threads at once would see the other's mark.
        b.data[0] = static_cast<char>(t);
        std::this_thread::yield();
        if (b.data[0] != static_cast<char>(t)) overlap.store(true);
        --in_use;
        pool->Release(b);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK_FALSE(overlap.load());
  CHECK(max_in_use.load() <= 3);
  CHECK(pool->free_bytes() == 3 * kBuffer);
}

}  // namespace
}  // namespace ckpt

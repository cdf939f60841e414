// Tests of IoWorkers: tasks run on the queues of the injected factory (the
// seam the save coordinator's tests use to run workers on a faulty queue),
// and the destructor finishes what was queued.
#include "io/io_workers.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "io/staging_pool.h"
#include "support/fault_injecting_queue.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FaultInjectingQueue;

constexpr uint32_t kBuffer = 4096;

std::unique_ptr<StagingPool> MustCreatePool() {
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(4 * kBuffer, kBuffer);
  INFO(pool.status());
  REQUIRE(pool.ok());
  return *std::move(pool);
}

TEST_CASE(
    "IoWorkers runs every task on a queue its factory made, one queue per "
    "worker, with the pool's buffers to register",
    "[io_workers]") {
  std::unique_ptr<StagingPool> pool = MustCreatePool();
  struct Made {
    uint32_t depth;
    size_t registered;
    const iovec* first;
  };
  std::vector<Made> made;  // only the constructing thread calls the factory
  auto factory = [&](uint32_t depth, absl::Span<const iovec> registered) {
    made.push_back({depth, registered.size(), registered.data()});
    return std::make_unique<FaultInjectingQueue>(depth);
  };

  absl::Mutex mu;
  std::set<const IoQueue*> queues_seen;
  std::vector<std::string> names_seen;
  constexpr int kTasks = 20;
  absl::BlockingCounter finished(kTasks);
  {
    IoWorkers workers(2, 3, *pool, factory);
    CHECK(workers.backend() == "fault-injecting");
    for (int i = 0; i < kTasks; ++i) {
      workers.Post([&](IoQueue& queue) {
        {
          absl::MutexLock lock(&mu);
          queues_seen.insert(&queue);
          names_seen.emplace_back(queue.name());
        }
        finished.DecrementCount();
      });
    }
    finished.Wait();
  }

  REQUIRE(made.size() == 2);
  for (const Made& m : made) {
    CHECK(m.depth == 3);
    CHECK(m.registered == pool->iovecs().size());
    CHECK(m.first == pool->iovecs().data());
  }
  CHECK(queues_seen.size() <= 2);
  CHECK(names_seen == std::vector<std::string>(kTasks, "fault-injecting"));
}

TEST_CASE("IoWorkers by default runs tasks on an io_uring or pwrite queue",
          "[io_workers]") {
  std::unique_ptr<StagingPool> pool = MustCreatePool();
  IoWorkers workers(1, 2, *pool);
  CHECK((workers.backend().rfind("io_uring", 0) == 0 || workers.backend() == "pwrite"));
}

TEST_CASE(
    "IoWorkers' backend names each kind of queue its workers got, with how "
    "many, when they differ",
    "[io_workers]") {
  std::unique_ptr<StagingPool> pool = MustCreatePool();
  // As when RLIMIT_MEMLOCK lets the first ring register the pool and not
  // the others: the first worker's queue differs from the rest.
  int made = 0;
  auto factory = [&](uint32_t depth, absl::Span<const iovec>) -> std::unique_ptr<IoQueue> {
    if (made++ == 0) return std::make_unique<FaultInjectingQueue>(depth);
    return CreatePwriteQueue(depth);
  };
  {
    IoWorkers workers(4, 2, *pool, factory);
    CHECK(workers.backend() == "fault-injecting on 1 of 4 workers, pwrite on 3");
  }
  made = 1;  // every worker gets the pwrite queue
  IoWorkers same(3, 2, *pool, factory);
  CHECK(same.backend() == "pwrite");
}

TEST_CASE("IoWorkers finishes every queued task before its destructor returns",
          "[io_workers]") {
  std::unique_ptr<StagingPool> pool = MustCreatePool();
  std::atomic<int> ran{0};
  {
    IoWorkers workers(1, 2, *pool);
    // The first task keeps the only worker busy while the rest queue up.
    workers.Post([](IoQueue&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    });
    for (int i = 0; i < 10; ++i) {
      workers.Post([&](IoQueue&) { ++ran; });
    }
  }
  CHECK(ran.load() == 10);
}

}  // namespace
}  // namespace ckpt

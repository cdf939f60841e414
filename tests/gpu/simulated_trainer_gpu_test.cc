// Tests of the trainer's side of the simulated GPU (SimulatedTrainerGpu):
// allocations and their ids, exports, and the ready/staged events. The
// daemon that dies before reaching its staged record is a forked child.
#include "gpu/simulated_trainer_gpu.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_test_support.h"

namespace ckpt {
namespace {

using ::ckpt::testing::AwaitSignal;
using ::ckpt::testing::ChildValue;
using ::ckpt::testing::kPatience;
using ::ckpt::testing::Signal;
using ::ckpt::testing::TakeOwnFd;
using ::ckpt::testing::TrainerChild;

TEST_CASE(
    "SignalStaged releases a trainer stream whose daemon died before "
    "reaching its staged record",
    "[gpu]") {
  SimulatedTrainerGpu gpu;
  const std::string uuid = SimulatedDeviceUuid(0);
  auto events = gpu.Events(uuid);
  REQUIRE(events.ok());
  // The daemon, holding the event page by inheritance: it enqueues its
  // staged record behind work that never ends, then dies.
  TrainerChild daemon([&](int sock) {
    auto staged = SimulatedEvent::Open(
        ChildValue(TakeOwnFd(events->staged.peer_fd), "dup"));
    CHILD_TRUE(staged.ok());
    auto* stream = new SimulatedStream;  // dies with the process
    stream->Enqueue([] { absl::Notification().WaitForNotification(); });
    stream->RecordEvent(*staged);
    CHILD_TRUE(Signal(sock));
    ::_exit(0);
    return 0;
  });
  REQUIRE(AwaitSignal(daemon.sock()));
  REQUIRE(daemon.Join() == 0);

  SimulatedStream stream;
  absl::Notification passed;
  REQUIRE(gpu.WaitStaged(uuid, &stream).ok());  // covers the dead record
  stream.Enqueue([&] { passed.Notify(); });
  CHECK_FALSE(passed.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  REQUIRE(gpu.SignalStaged(uuid).ok());
  CHECK(passed.WaitForNotificationWithTimeout(kPatience));
}

// ---- The trainer side.

TEST_CASE(
    "An allocation freed and made again at the same address gets a new id, "
    "and a freed one is no device memory",
    "[gpu]") {
  SimulatedTrainerGpu gpu;
  absl::StatusOr<uint64_t> address = gpu.Allocate(4096);
  REQUIRE(address.ok());
  auto first = gpu.AllocationIds(*address, 4096);
  REQUIRE(first.ok());
  REQUIRE(first->size() == 1);
  char* memory = reinterpret_cast<char*>(*address);
  memory[0] = 7;

  REQUIRE(gpu.Reallocate(*address).ok());
  auto second = gpu.AllocationIds(*address, 4096);
  REQUIRE(second.ok());
  REQUIRE(second->size() == 1);
  CHECK((*second)[0] != (*first)[0]);
  CHECK(memory[0] == 0);  // new memory, zero-filled

  REQUIRE(gpu.Free(*address).ok());
  CHECK(gpu.AllocationIds(*address, 4096).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(gpu.Reallocate(*address).code() == absl::StatusCode::kNotFound);

  // Ids are process-wide: another trainer object never repeats them.
  SimulatedTrainerGpu other;
  absl::StatusOr<uint64_t> elsewhere = other.Allocate(4096);
  REQUIRE(elsewhere.ok());
  auto third = other.AllocationIds(*elsewhere, 4096);
  REQUIRE(third.ok());
  CHECK((*third)[0] != (*first)[0]);
  CHECK((*third)[0] != (*second)[0]);
}

TEST_CASE(
    "Export and AllocationIds of memory that is not simulated device "
    "memory are NotFound",
    "[gpu]") {
  SimulatedTrainerGpu gpu;
  absl::StatusOr<uint64_t> address = gpu.Allocate(4096);
  REQUIRE(address.ok());
  std::vector<char> host(4096);
  const uint64_t host_address = reinterpret_cast<uint64_t>(host.data());

  absl::StatusOr<GpuRegionExport> exported = gpu.Export(host_address, 100);
  CHECK(exported.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(exported.status().message()),
             Catch::Contains("not simulated device memory"));
  CHECK(gpu.AllocationIds(host_address, 100).status().code() ==
        absl::StatusCode::kNotFound);
  // Past the allocation's end, and freeing what is not an allocation's start.
  CHECK(gpu.Export(*address + 4000, 200).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(gpu.Free(*address + 8).code() == absl::StatusCode::kNotFound);
  CHECK(gpu.Export(*address, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "The trainer's events are created once per device and need a real "
    "stream",
    "[gpu]") {
  SimulatedTrainerGpu gpu;
  const std::string uuid = SimulatedDeviceUuid(1);
  auto events = gpu.Events(uuid);
  REQUIRE(events.ok());
  auto again = gpu.Events(uuid);
  REQUIRE(again.ok());
  CHECK(again->ready.peer_fd == events->ready.peer_fd);
  CHECK(again->staged.peer_fd == events->staged.peer_fd);
  CHECK(events->ready.peer_fd != events->staged.peer_fd);
  auto other = gpu.Events(SimulatedDeviceUuid(0));
  REQUIRE(other.ok());
  CHECK(other->ready.peer_fd != events->ready.peer_fd);

  CHECK(gpu.Events(SimulatedDeviceUuid(2)).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(gpu.RecordReady(uuid, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(gpu.WaitStaged(uuid, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "A relay record is made once the daemon's staged record it waits for "
    "is, and after the relay record before it",
    "[gpu]") {
  using Kind = TrainerGpu::StagedWait::Kind;
  SimulatedTrainerGpu gpu;
  const std::string uuid = SimulatedDeviceUuid(0);
  absl::StatusOr<GpuEventHandles> events = gpu.Events(uuid);
  REQUIRE(events.ok());
  // The daemon's side of "staged": the same page, mapped again.
  absl::StatusOr<std::shared_ptr<SimulatedEvent>> staged =
      SimulatedEvent::Open(UniqueFd(::dup(events->staged.peer_fd)));
  REQUIRE(staged.ok());
  const uint64_t save_record = (*staged)->EnqueueRecord();  // reserved for a save

  absl::StatusOr<uint64_t> first = gpu.ReserveRelay(uuid);
  absl::StatusOr<uint64_t> second = gpu.ReserveRelay(uuid);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(*second == *first + 1);
  SimulatedStream trainer;
  std::atomic<bool> stepped{false};
  REQUIRE(gpu.WaitRelay(uuid, &trainer, *second).ok());
  trainer.Enqueue([&] { stepped = true; });  // the optimizer step
  // The second is passed on first, from another thread, with nothing to
  // wait for: it waits for the first to be passed on (enqueued behind it,
  // the first would never be reached), then comes after it.
  absl::Status second_relayed;
  std::thread submit([&] { second_relayed = gpu.Relay(uuid, *second, {Kind::kNone, 0}); });
  absl::SleepFor(absl::Milliseconds(50));
  REQUIRE(gpu.Relay(uuid, *first, {Kind::kRecord, save_record}).ok());
  submit.join();
  REQUIRE(second_relayed.ok());
  absl::SleepFor(absl::Milliseconds(100));
  CHECK_FALSE(stepped.load());
  CHECK_FALSE(gpu.CompleteRelay(uuid, *second));  // the first is not reached

  REQUIRE((*staged)->CompleteReserved(save_record));  // the daemon's copies ran
  const absl::Time deadline = absl::Now() + kPatience;
  while (!stepped.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  CHECK(stepped.load());
  CHECK(gpu.CompleteRelay(uuid, *second));  // reached already
  CHECK(gpu.WaitRelay(uuid, nullptr, *second).code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt

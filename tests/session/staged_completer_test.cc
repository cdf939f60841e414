// StagedCompleter on the simulated device: a staged record a failed save
// reserved is completed from the CPU only once the record before it was
// reached (never early: the earlier save's copies may still be reading),
// and then at once, several in a row included; the trainer's stream
// waiting for the last one goes on. A record a failed save had enqueued is
// left to its stream while the device works and completed from the CPU
// once the device failed.
#include "session/staged_completer.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>

#include "absl/time/clock.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_device_fixtures.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_test_support.h"
#include "gpu/simulated_trainer_gpu.h"

namespace ckpt {
namespace {

using ::ckpt::testing::InProcess;
using ::ckpt::testing::kPatience;
using ::ckpt::testing::TakeOwnFd;

TEST_CASE("StagedCompleter completes a failed save's staged record only once the "
          "record before it was reached, then in order",
          "[gpu][session]") {
  InProcess gpu;
  auto events = gpu.trainer.Events(gpu.region.device_uuid);
  REQUIRE(events.ok());
  absl::StatusOr<std::unique_ptr<GpuEvent>> opened =
      gpu.device.OpenEvent(0, events->staged, TakeOwnFd);
  REQUIRE(opened.ok());
  std::shared_ptr<GpuEvent> staged = *std::move(opened);
  // Three saves accepted; the first one's copies are still running.
  const uint64_t first = staged->ReserveRecord();
  const uint64_t second = staged->ReserveRecord();
  const uint64_t third = staged->ReserveRecord();
  // The trainer's step after the third save.
  SimulatedStream step_stream;
  REQUIRE(gpu.trainer.WaitStagedRecord(gpu.region.device_uuid, &step_stream, third).ok());
  std::atomic<bool> stepped{false};
  step_stream.Enqueue([&stepped] { stepped = true; });

  StagedCompleter completer;
  // The second and third saves failed.
  completer.Complete(staged, third);
  completer.Complete(staged, second);
  CHECK(completer.pending() == 2);
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(completer.pending() == 2);
  CHECK_FALSE(staged->CompleteReserved(second));
  CHECK_FALSE(stepped);

  // The first save's record is reached (its stream wrote it).
  REQUIRE(staged->CompleteReserved(first));
  const absl::Time end = absl::Now() + kPatience;
  while (completer.pending() > 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
  CHECK(completer.pending() == 0);
  CHECK(staged->CompleteReserved(third));
  step_stream.Synchronize();
  CHECK(stepped);

  // A record whose predecessor was reached completes in the call.
  const uint64_t fourth = staged->ReserveRecord();
  completer.Complete(staged, fourth);
  CHECK(completer.pending() == 0);
  CHECK(staged->CompleteReserved(fourth));
}

TEST_CASE("StagedCompleter leaves an enqueued record of a failed save to its "
          "stream while the device works, and completes it once the device failed",
          "[gpu][session]") {
  InProcess gpu;
  auto events = gpu.trainer.Events(gpu.region.device_uuid);
  REQUIRE(events.ok());
  absl::StatusOr<std::unique_ptr<GpuEvent>> opened =
      gpu.device.OpenEvent(0, events->staged, TakeOwnFd);
  REQUIRE(opened.ok());
  std::shared_ptr<GpuEvent> staged = *std::move(opened);
  auto wait_for = [](const StagedCompleter& completer, size_t pending) {
    const absl::Time end = absl::Now() + kPatience;
    while (completer.pending() != pending && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return completer.pending() == pending;
  };
  StagedCompleter completer;

  // Reached by its stream (the stand-in: the record before it reached, the
  // record written): forgotten, not completed by the completer.
  const uint64_t first = staged->ReserveRecord();
  completer.CompleteIfDeviceFails(staged, first);
  CHECK(completer.pending() == 1);
  absl::SleepFor(absl::Milliseconds(20));
  CHECK(completer.pending() == 1);
  REQUIRE(staged->CompleteReserved(first));
  CHECK(wait_for(completer, 0));

  // Two saves; the first's record was enqueued on a stream whose copies
  // wait, and the device fails before they run.
  const uint64_t second = staged->ReserveRecord();
  const uint64_t third = staged->ReserveRecord();
  SimulatedStream step_stream;
  REQUIRE(gpu.trainer.WaitStagedRecord(gpu.region.device_uuid, &step_stream, third).ok());
  std::atomic<bool> stepped{false};
  step_stream.Enqueue([&stepped] { stepped = true; });
  completer.CompleteIfDeviceFails(staged, second);
  completer.Complete(staged, third);
  absl::SleepFor(absl::Milliseconds(20));
  CHECK(completer.pending() == 2);
  CHECK_FALSE(stepped);
  gpu.device.FailDevice(0, absl::InternalError("injected: ECC error"));
  CHECK(wait_for(completer, 0));
  // Polled, not synchronized: a record never completed must fail the test,
  // not hang it (the stream's destructor gives up on its wait).
  const absl::Time end = absl::Now() + kPatience;
  while (!stepped && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
  CHECK(stepped);
}

}  // namespace
}  // namespace ckpt

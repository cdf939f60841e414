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
using ::ckpt::testing::OpenStaged;
using ::ckpt::testing::StepAfterStaged;

// Whether `completer` holds `pending` records within kPatience.
bool PendingBecomes(const StagedCompleter& completer, size_t pending) {
  const absl::Time end = absl::Now() + kPatience;
  while (completer.pending() != pending && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return completer.pending() == pending;
}

TEST_CASE("StagedCompleter completes a failed save's staged record only once the "
          "record before it was reached, then in order",
          "[gpu][session]") {
  InProcess gpu;
  std::shared_ptr<GpuEvent> staged = OpenStaged(gpu);
  // Three saves accepted; the first one's copies are still running.
  const uint64_t first = staged->ReserveRecord();
  const uint64_t second = staged->ReserveRecord();
  const uint64_t third = staged->ReserveRecord();
  // The trainer's step after the third save.
  StepAfterStaged step(gpu, third);

  StagedCompleter completer;
  // The second and third saves failed.
  completer.Complete(staged, third);
  completer.Complete(staged, second);
  CHECK(completer.pending() == 2);
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(completer.pending() == 2);
  CHECK_FALSE(staged->CompleteReserved(second));
  CHECK_FALSE(step.stepped);

  // The first save's record is reached (its stream wrote it).
  REQUIRE(staged->CompleteReserved(first));
  CHECK(PendingBecomes(completer, 0));
  CHECK(staged->CompleteReserved(third));
  CHECK(step.Ran());

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
  std::shared_ptr<GpuEvent> staged = OpenStaged(gpu);
  StagedCompleter completer;

  // Reached by its stream (the stand-in: the record before it reached, the
  // record written): forgotten, not completed by the completer.
  const uint64_t first = staged->ReserveRecord();
  completer.CompleteIfDeviceFails(staged, first);
  CHECK(completer.pending() == 1);
  absl::SleepFor(absl::Milliseconds(20));
  CHECK(completer.pending() == 1);
  REQUIRE(staged->CompleteReserved(first));
  CHECK(PendingBecomes(completer, 0));

  // Two saves; the first's record was enqueued on a stream whose copies
  // wait, and the device fails before they run.
  const uint64_t second = staged->ReserveRecord();
  const uint64_t third = staged->ReserveRecord();
  StepAfterStaged step(gpu, third);
  completer.CompleteIfDeviceFails(staged, second);
  completer.Complete(staged, third);
  absl::SleepFor(absl::Milliseconds(20));
  CHECK(completer.pending() == 2);
  CHECK_FALSE(step.stepped);
  gpu.device.FailDevice(0, absl::InternalError("injected: ECC error"));
  CHECK(PendingBecomes(completer, 0));
  CHECK(step.Ran());
}

}  // namespace
}  // namespace ckpt

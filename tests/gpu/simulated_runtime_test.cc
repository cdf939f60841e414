// Tests of the simulated GPU's runtime (gpu/simulated_runtime.h): the
// ordering rules of SimulatedStream and SimulatedEvent.
#include "gpu/simulated_runtime.h"

#include <catch2/catch.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gpu/simulated_test_support.h"

namespace ckpt {
namespace {

using ::ckpt::testing::kPatience;

TEST_CASE(
    "A stream's wait covers the records made before it, not those after, "
    "and a never-recorded event does not block",
    "[gpu]") {
  auto event = SimulatedEvent::Create();
  REQUIRE(event.ok());
  SimulatedStream waiter;
  absl::Notification passed;
  waiter.WaitEvent(*event);  // never recorded
  waiter.Enqueue([&] { passed.Notify(); });
  CHECK(passed.WaitForNotificationWithTimeout(kPatience));

  SimulatedStream recorder;
  recorder.RecordEvent(*event);
  recorder.Synchronize();
  CHECK((*event)->completed() == 1);
  absl::Notification release;
  recorder.Enqueue([&] { release.WaitForNotification(); });
  absl::Notification passed_again;
  waiter.WaitEvent(*event);      // covers record 1, which completed
  recorder.RecordEvent(*event);  // record 2, after the wait: not covered
  waiter.Enqueue([&] { passed_again.Notify(); });
  CHECK(passed_again.WaitForNotificationWithTimeout(kPatience));
  CHECK((*event)->recorded() == 2);
  CHECK((*event)->completed() == 1);
  release.Notify();
  recorder.Synchronize();
  CHECK((*event)->completed() == 2);
}

}  // namespace
}  // namespace ckpt

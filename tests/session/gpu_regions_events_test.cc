// GpuRegions' events, on the simulated device in this process: the
// trainer's ready and staged events are opened once however many regions
// name them, and a client that sends new events with every region is
// refused once the session holds kMaxGpuEventsPerSession, saying why,
// while regions with the events already open still register.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_test_support.h"
#include "session/gpu_regions_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::GpuRegionsFixture;
using ::ckpt::testing::kRegionBytes;
using ::ckpt::testing::Pattern;

TEST_CASE("a session opens each event once and refuses new events past "
          "its bound, with the reason",
          "[gpu][session]") {
  GpuRegionsFixture f;
  const uint64_t a = f.Allocate(Pattern(kRegionBytes, 1));
  // The trainer's own pair, named by every region: two events.
  for (uint64_t id = 1; id <= 3; ++id) f.Register(id, a);

  std::vector<std::shared_ptr<SimulatedEvent>> made_up;  // alive while named
  absl::Status refused;
  size_t accepted = 0;
  for (size_t i = 0; i < kMaxGpuEventsPerSession; ++i) {
    GpuEventHandles events;
    for (GpuHandleRef* handle : {&events.ready, &events.staged}) {
      absl::StatusOr<std::shared_ptr<SimulatedEvent>> event = SimulatedEvent::Create();
      REQUIRE(event.ok());
      handle->peer_fd = (*event)->fd();
      made_up.push_back(*std::move(event));
    }
    refused = f.TryRegister(10 + i, a, events);
    if (!refused.ok()) break;
    ++accepted;
  }
  INFO(refused.ToString());
  CHECK(absl::IsResourceExhausted(refused));
  CHECK(absl::StrContains(refused.message(), "at most 64 GPU events"));
  CHECK(accepted == (kMaxGpuEventsPerSession - 2) / 2);
  // Each registration at `a` replaced the one before.
  CHECK(f.regions->live_regions() == 1);
  // The trainer's own events are open already: its regions still register.
  const absl::Status own = f.TryRegister(100, a);
  INFO(own.ToString());
  CHECK(own.ok());
}

}  // namespace
}  // namespace ckpt

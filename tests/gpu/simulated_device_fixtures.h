// The fixtures shared by SimulatedDevice's tests
// (simulated_device_{mapping,ordering,copies}_test.cc): the size of the
// cross-process tests' allocations, a trainer in this process beside the
// daemon's device (InProcess), a daemon stream fenced behind the
// trainer's ready event (BlockedOnReady), the daemon's opening of the
// trainer's staged event (OpenStaged) and the trainer's next step queued
// behind a staged record (StepAfterStaged).
//
// Thread-safety: none; one test case owns each object.
#pragma once

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gpu/gpu_device.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_test_support.h"
#include "gpu/simulated_trainer_gpu.h"
#include "gpu/trainer_gpu.h"

namespace ckpt::testing {

inline constexpr uint64_t kBytes = 64 * 1024 + 5000;  // not a page multiple

// A trainer in this process with one exported region, and the daemon's
// device: the fixture of the daemon-side rules.
struct InProcess {
  SimulatedTrainerGpu trainer;
  SimulatedDevice device;
  uint64_t address = 0;
  GpuRegionExport region;

  explicit InProcess(int segments = 1, uint64_t segment = 4 * 4096) {
    absl::StatusOr<uint64_t> base = trainer.AllocateSegments(segments, segment);
    REQUIRE(base.ok());
    address = *base;
    const uint64_t bytes =
        segments * ((segment + SimulatedPageSize() - 1) / SimulatedPageSize() *
                    SimulatedPageSize());
    absl::StatusOr<GpuRegionExport> exported = trainer.Export(address, bytes);
    REQUIRE(exported.ok());
    region = *std::move(exported);
  }
  absl::StatusOr<std::unique_ptr<GpuMapping>> Map(
      const std::vector<GpuPiece>& pieces) {
    return device.Map(0, pieces, TakeOwnFd);
  }
};

// A daemon stream whose fence waits on the trainer's ready event, recorded
// on `trainer_stream` behind work that runs once `release` is notified.
struct BlockedOnReady {
  absl::StatusOr<std::unique_ptr<GpuEvent>> ready;
  absl::StatusOr<std::unique_ptr<GpuStream>> stream;
  absl::StatusOr<std::unique_ptr<GpuFence>> fence;

  BlockedOnReady(InProcess& gpu, SimulatedStream& trainer_stream,
                 absl::Notification& release) {
    trainer_stream.Enqueue([&release] { release.WaitForNotification(); });
    REQUIRE(
        gpu.trainer.RecordReady(gpu.region.device_uuid, &trainer_stream).ok());
    auto events = gpu.trainer.Events(gpu.region.device_uuid);
    REQUIRE(events.ok());
    ready = gpu.device.OpenEvent(0, events->ready, TakeOwnFd);
    REQUIRE(ready.ok());
    stream = gpu.device.CreateStream(0);
    REQUIRE(stream.ok());
    REQUIRE((*stream)->WaitEvent(**ready).ok());
    fence = (*stream)->Fence();
    REQUIRE(fence.ok());
  }
};

// The daemon's opening of the trainer's "staged" event of device 0.
inline std::shared_ptr<GpuEvent> OpenStaged(InProcess& gpu) {
  auto events = gpu.trainer.Events(gpu.region.device_uuid);
  REQUIRE(events.ok());
  absl::StatusOr<std::unique_ptr<GpuEvent>> staged =
      gpu.device.OpenEvent(0, events->staged, TakeOwnFd);
  REQUIRE(staged.ok());
  return *std::move(staged);
}

// The trainer's next step, queued on a stream of its own behind a wait for
// staged record `record` (enqueued at once: no CPU wait).
struct StepAfterStaged {
  SimulatedStream stream;
  std::atomic<bool> stepped{false};

  StepAfterStaged(InProcess& gpu, uint64_t record) {
    REQUIRE(gpu.trainer.WaitStagedRecord(gpu.region.device_uuid, &stream, record).ok());
    stream.Enqueue([this] { stepped = true; });
  }
  // Whether the step ran within kPatience. Polled, not synchronized: a
  // record never reached fails the test instead of hanging it (the
  // stream's destructor gives up on its wait).
  bool Ran() {
    const absl::Time end = absl::Now() + kPatience;
    while (!stepped && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
    return stepped;
  }
};

}  // namespace ckpt::testing

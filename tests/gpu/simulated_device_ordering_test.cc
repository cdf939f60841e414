// Tests of the simulated GPU's ordering (SimulatedDevice's streams, events
// and fences): the daemon's copy behind a wait on the trainer's ready event
// sees what the trainer wrote before recording it, the trainer's stream
// behind staged mutates the tensors only after the daemon's copies, a
// staged record waits for the one made ahead of it on another stream, and a
// fence behind an unfinished wait times out or, once its stream is
// destroyed, reports Aborted. Across processes, a forked child is the
// trainer (SimulatedTrainerGpu, its stream's "kernels" are lambdas) and this
// process is the daemon (SimulatedDevice), taking the child's fds with
// pidfd_getfd as ckptd does; the daemon-side rules run the trainer in this
// process and take its fds with dup.
//
// Ordering tests are deterministic: the daemon makes its wait or copy only
// after the child said its record was enqueued (CUDA's rule: a wait covers
// the records made before it), and the trainer's deliberate 100 ms delay
// only makes a broken implementation fail, never a correct one.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_device_fixtures.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_test_support.h"
#include "gpu/simulated_trainer_gpu.h"

namespace ckpt {
namespace {

using ::ckpt::testing::At;
using ::ckpt::testing::AwaitSignal;
using ::ckpt::testing::BlockedOnReady;
using ::ckpt::testing::Bytes;
using ::ckpt::testing::ChildValue;
using ::ckpt::testing::CopyOut;
using ::ckpt::testing::InProcess;
using ::ckpt::testing::kBytes;
using ::ckpt::testing::kPatience;
using ::ckpt::testing::Mismatch;
using ::ckpt::testing::OpenStaged;
using ::ckpt::testing::Pattern;
using ::ckpt::testing::PiecesOf;
using ::ckpt::testing::RecvPod;
using ::ckpt::testing::RegisteredBuffer;
using ::ckpt::testing::SendRegion;
using ::ckpt::testing::Signal;
using ::ckpt::testing::StepAfterStaged;
using ::ckpt::testing::TakeOwnFd;
using ::ckpt::testing::TrainerChild;
using ::ckpt::testing::WireRegion;

// ---- Across processes.

TEST_CASE(
    "The daemon's copy behind a wait on ready sees what the trainer's "
    "stream wrote before recording ready",
    "[gpu]") {
  const std::string data = Pattern(kBytes, 2);
  TrainerChild child([&](int sock) {
    SimulatedTrainerGpu gpu;
    SimulatedStream stream;
    const uint64_t address = ChildValue(gpu.Allocate(kBytes), "Allocate");
    GpuRegionExport region = SendRegion(sock, gpu, address, kBytes);
    // The last "kernel" before the save: slow, then it writes the tensors.
    stream.Enqueue([&] {
      absl::SleepFor(absl::Milliseconds(100));
      std::memcpy(At(address), data.data(), kBytes);
    });
    CHILD_OK(gpu.RecordReady(region.device_uuid, &stream));
    CHILD_TRUE(Signal(sock));  // ready is recorded (CPU side)
    CHILD_TRUE(AwaitSignal(sock));
    stream.Synchronize();
    return 0;
  });
  SKIP_UNLESS_FDS_CAN_BE_TAKEN(child);
  WireRegion wire;
  REQUIRE(RecvPod(child.sock(), wire));
  SimulatedDevice device;
  auto mapping = device.Map(0, PiecesOf(wire), child.taker());
  REQUIRE(mapping.ok());
  auto ready = device.OpenEvent(0, {"", wire.ready_fd}, child.taker());
  REQUIRE(ready.ok());
  auto stream = device.CreateStream(0);
  REQUIRE(stream.ok());
  RegisteredBuffer host(device, kBytes);

  REQUIRE(AwaitSignal(child.sock()));
  REQUIRE((*stream)->WaitEvent(**ready).ok());
  REQUIRE(CopyOut(**stream, (*mapping)->address(), host.data(), kBytes).ok());
  CHECK(Mismatch(host.bytes(), data) == "");

  REQUIRE(Signal(child.sock()));
  CHECK(child.Join() == 0);
}

TEST_CASE(
    "The trainer's stream waiting on staged mutates the tensors only after "
    "the daemon's copies",
    "[gpu]") {
  const std::string before = Pattern(kBytes, 3);
  const std::string after = Pattern(kBytes, 4);
  TrainerChild child([&](int sock) {
    SimulatedTrainerGpu gpu;
    SimulatedStream stream;
    const uint64_t address = ChildValue(gpu.Allocate(kBytes), "Allocate");
    std::memcpy(At(address), before.data(), kBytes);
    GpuRegionExport region = SendRegion(sock, gpu, address, kBytes);
    // The daemon's copy waits for ready, which the slow kernel delays.
    stream.Enqueue([] { absl::SleepFor(absl::Milliseconds(100)); });
    CHILD_OK(gpu.RecordReady(region.device_uuid, &stream));
    CHILD_TRUE(Signal(sock));       // ready is recorded
    CHILD_TRUE(AwaitSignal(sock));  // the daemon recorded staged
    // The optimizer step: behind staged, it must not overtake the copy.
    CHILD_OK(gpu.WaitStaged(region.device_uuid, &stream));
    stream.Enqueue([&] { std::memcpy(At(address), after.data(), kBytes); });
    stream.Synchronize();
    CHILD_TRUE(Signal(sock));  // mutated
    CHILD_TRUE(AwaitSignal(sock));
    return 0;
  });
  SKIP_UNLESS_FDS_CAN_BE_TAKEN(child);
  WireRegion wire;
  REQUIRE(RecvPod(child.sock(), wire));
  SimulatedDevice device;
  auto mapping = device.Map(0, PiecesOf(wire), child.taker());
  REQUIRE(mapping.ok());
  auto ready = device.OpenEvent(0, {"", wire.ready_fd}, child.taker());
  auto staged = device.OpenEvent(0, {"", wire.staged_fd}, child.taker());
  REQUIRE(ready.ok());
  REQUIRE(staged.ok());
  auto stream = device.CreateStream(0);
  REQUIRE(stream.ok());
  RegisteredBuffer host(device, kBytes);

  REQUIRE(AwaitSignal(child.sock()));
  REQUIRE((*stream)->WaitEvent(**ready).ok());
  const GpuCopy copy{(*mapping)->address(), host.data(), kBytes};
  REQUIRE((*stream)->CopyToHost({&copy, 1}).ok());
  REQUIRE((*stream)->RecordEvent(**staged).ok());
  auto fence = (*stream)->Fence();
  REQUIRE(fence.ok());
  REQUIRE(Signal(child.sock()));

  REQUIRE((*fence)->Wait(kPatience).ok());
  CHECK(Mismatch(host.bytes(), before) == "");
  REQUIRE(AwaitSignal(child.sock()));
  CHECK(Mismatch(Bytes((*mapping)->address(), kBytes), after) ==
        "");  // it did run, later
  REQUIRE(Signal(child.sock()));
  CHECK(child.Join() == 0);
}

// ---- The daemon side.

TEST_CASE(
    "A staged record reached before the one made ahead of it on another "
    "stream waits for it: a wait on the later record never passes while the "
    "earlier save's copies are still queued",
    "[gpu]") {
  InProcess gpu;
  SimulatedStream trainer_stream;
  absl::Notification release;
  // The earlier save's stream: its record waits behind the trainer's ready.
  BlockedOnReady earlier(gpu, trainer_stream, release);
  auto events = gpu.trainer.Events(gpu.region.device_uuid);
  REQUIRE(events.ok());
  auto staged = gpu.device.OpenEvent(0, events->staged, TakeOwnFd);
  REQUIRE(staged.ok());
  REQUIRE((*earlier.stream)->RecordEvent(**staged).ok());
  // The later save's stream has nothing to wait for but the earlier record.
  auto later = gpu.device.CreateStream(0);
  REQUIRE(later.ok());
  REQUIRE((*later)->RecordEvent(**staged).ok());
  auto later_fence = (*later)->Fence();
  REQUIRE(later_fence.ok());

  // The trainer's optimizer step, ordered after both saves' staged.
  SimulatedStream step_stream;
  REQUIRE(gpu.trainer.WaitStaged(gpu.region.device_uuid, &step_stream).ok());
  std::atomic<bool> stepped{false};
  step_stream.Enqueue([&stepped] { stepped = true; });
  absl::SleepFor(absl::Milliseconds(100));
  CHECK_FALSE(stepped);
  CHECK_FALSE(*(*later_fence)->Ready());

  release.Notify();
  REQUIRE((*later_fence)->Wait(absl::Seconds(10)).ok());
  step_stream.Synchronize();
  CHECK(stepped);
}

TEST_CASE(
    "Staged records reserved as saves are accepted: the trainer's stream waits "
    "for its save's record from the call on, records reach in the order they "
    "were reserved, and a failed save's record completed from the CPU waits "
    "for the one before it",
    "[gpu]") {
  InProcess gpu;
  SimulatedStream trainer_stream;
  absl::Notification release;
  // The first save's stream: its copies wait behind the trainer's ready.
  BlockedOnReady first_save(gpu, trainer_stream, release);
  std::shared_ptr<GpuEvent> staged = OpenStaged(gpu);
  // Three saves accepted before any copy is enqueued.
  const uint64_t first = staged->ReserveRecord();
  const uint64_t second = staged->ReserveRecord();
  const uint64_t third = staged->ReserveRecord();
  CHECK(second == first + 1);
  CHECK(third == second + 1);
  // The trainer's step after the second save waits for exactly its record.
  StepAfterStaged step(gpu, second);
  // The second save failed before its copies: its record cannot be
  // completed while the first's is pending.
  CHECK_FALSE(staged->CompleteReserved(second));
  REQUIRE((*first_save.stream)->RecordReserved(*staged, first).ok());
  // The third save's record, on a stream of its own with nothing before it.
  auto third_save = gpu.device.CreateStream(0);
  REQUIRE(third_save.ok());
  REQUIRE((*third_save)->RecordReserved(*staged, third).ok());
  auto third_fence = (*third_save)->Fence();
  REQUIRE(third_fence.ok());
  absl::SleepFor(absl::Milliseconds(100));
  CHECK_FALSE(step.stepped);
  CHECK_FALSE(staged->CompleteReserved(second));
  CHECK_FALSE(*(*third_fence)->Ready());

  release.Notify();  // the first save's copies run, then its record
  const absl::Time end = absl::Now() + kPatience;
  while (!staged->CompleteReserved(second) && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  CHECK(staged->CompleteReserved(second));
  REQUIRE((*third_fence)->Wait(kPatience).ok());
  CHECK(step.Ran());
  trainer_stream.Synchronize();
}

TEST_CASE(
    "A device whose context failed runs nothing more: a staged record "
    "enqueued before the failure is never reached by its stream but is "
    "completed from the CPU, and its fences and later calls report the "
    "sticky error while the other device keeps working",
    "[gpu]") {
  InProcess gpu;
  SimulatedStream trainer_stream;
  absl::Notification release;
  // A save's copies wait behind the trainer's ready event; its staged
  // record is enqueued after them.
  BlockedOnReady save(gpu, trainer_stream, release);
  std::shared_ptr<GpuEvent> staged = OpenStaged(gpu);
  const uint64_t record = staged->ReserveRecord();
  StepAfterStaged step(gpu, record);
  REQUIRE((*save.stream)->RecordReserved(*staged, record).ok());
  // While the device works, an unreached enqueued record is left alone.
  CHECK_FALSE(staged->CompleteIfDeviceFailed(record));

  gpu.device.FailDevice(0, absl::InternalError("injected: illegal address"));
  release.Notify();  // the trainer's stream reaches its ready event...
  trainer_stream.Synchronize();
  // ...but the failed device's stream gives up: no copy, no record.
  const absl::Status fenced = (*save.fence)->Wait(kPatience);
  CHECK(fenced.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(fenced.message(), "injected: illegal address"));
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(step.stepped);
  CHECK((*save.stream)->Fence().status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(gpu.device.CreateStream(0).status().code() == absl::StatusCode::kFailedPrecondition);

  // The record is completed from the CPU, so the trainer's step runs; of
  // two records reserved after the failure, the second completes at once
  // though the first was not reached.
  CHECK(staged->CompleteIfDeviceFailed(record));
  CHECK(step.Ran());
  (void)staged->ReserveRecord();
  const uint64_t later = staged->ReserveRecord();
  CHECK(staged->CompleteReserved(later));

  auto other = gpu.device.CreateStream(1);
  REQUIRE(other.ok());
  auto other_fence = (*other)->Fence();
  REQUIRE(other_fence.ok());
  CHECK((*other_fence)->Wait(kPatience).ok());
}

TEST_CASE(
    "A fence behind a wait on an event that has not completed reports "
    "DeadlineExceeded",
    "[gpu]") {
  InProcess gpu;
  SimulatedStream trainer_stream;
  absl::Notification release;
  BlockedOnReady blocked(gpu, trainer_stream, release);
  auto& fence = blocked.fence;
  CHECK((*fence)->Wait(absl::Milliseconds(50)).code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK((*fence)->Ready().value_or(true) == false);

  release.Notify();  // the trainer's work completes; so does the wait
  CHECK((*fence)->Wait(kPatience).ok());
  CHECK((*fence)->Ready().value_or(false) == true);
  trainer_stream.Synchronize();
}

TEST_CASE(
    "Destroying a stream blocked on an event returns, and its fence "
    "reports Aborted",
    "[gpu]") {
  InProcess gpu;
  SimulatedStream trainer_stream;
  absl::Notification release;
  BlockedOnReady blocked(gpu, trainer_stream, release);
  auto& stream = blocked.stream;
  auto& fence = blocked.fence;

  stream->reset();  // must not wait for the trainer
  CHECK((*fence)->Wait(kPatience).code() == absl::StatusCode::kAborted);
  release.Notify();
  trainer_stream.Synchronize();
}

}  // namespace
}  // namespace ckpt

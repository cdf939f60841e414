// Tests of the simulated GPU's daemon side (SimulatedDevice): mappings,
// events, streams, copies, fences and host registration. Across processes,
// a forked child is the trainer (SimulatedTrainerGpu, its stream's
// "kernels" are lambdas) and this process is the daemon (SimulatedDevice),
// taking the child's fds with pidfd_getfd as ckptd does. Tests of one
// side's rules run the trainer in this process and take its fds with dup.
//
// Ordering tests are deterministic: the daemon makes its wait or copy only
// after the child said its record was enqueued (CUDA's rule: a wait covers
// the records made before it), and the trainer's deliberate 100 ms delay
// only makes a broken implementation fail, never a correct one.
#include "gpu/simulated_device.h"

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/unique_fd.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_test_support.h"
#include "gpu/simulated_trainer_gpu.h"

namespace ckpt {
namespace {

using ::ckpt::testing::At;
using ::ckpt::testing::AwaitSignal;
using ::ckpt::testing::Bytes;
using ::ckpt::testing::ChildValue;
using ::ckpt::testing::CopyOut;
using ::ckpt::testing::kPatience;
using ::ckpt::testing::Mismatch;
using ::ckpt::testing::Pattern;
using ::ckpt::testing::PiecesOf;
using ::ckpt::testing::RecvPod;
using ::ckpt::testing::RegisteredBuffer;
using ::ckpt::testing::SendRegion;
using ::ckpt::testing::Signal;
using ::ckpt::testing::TakeOwnFd;
using ::ckpt::testing::TrainerChild;
using ::ckpt::testing::WireRegion;

// Open fds and /proc/self/maps lines naming simulated memory.
int OpenFdCount() {
  DIR* dir = ::opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  int count = 0;
  while (::readdir(dir) != nullptr) ++count;
  ::closedir(dir);
  return count;
}
int SimulatedMapsLines() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:ckpt-sim-alloc") != std::string::npos) ++count;
  }
  return count;
}
bool IsMapped(uint64_t address) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &begin, &end) == 2 &&
        begin <= address && address < end) {
      return true;
    }
  }
  return false;
}

constexpr uint64_t kBytes = 64 * 1024 + 5000;  // not a page multiple

// ---- Across processes.

TEST_CASE(
    "A trainer allocation mapped by the daemon holds the trainer's bytes "
    "and CopyToHost reads them",
    "[gpu]") {
  const std::string data = Pattern(kBytes, 1);
  TrainerChild child([&](int sock) {
    SimulatedTrainerGpu gpu;
    const uint64_t address = ChildValue(gpu.Allocate(kBytes), "Allocate");
    std::memcpy(At(address), data.data(), kBytes);
    GpuRegionExport region = SendRegion(sock, gpu, address + 100, kBytes - 200);
    CHILD_TRUE(AwaitSignal(sock));
    return 0;
  });
  SKIP_UNLESS_FDS_CAN_BE_TAKEN(child);
  WireRegion wire;
  REQUIRE(RecvPod(child.sock(), wire));

  SimulatedDevice device;
  absl::StatusOr<int> ordinal = device.FindDevice(std::string(wire.uuid, 16));
  REQUIRE(ordinal.ok());
  CHECK(*ordinal == 0);
  absl::StatusOr<std::unique_ptr<GpuMapping>> mapping =
      device.Map(*ordinal, PiecesOf(wire), child.taker());
  REQUIRE(mapping.ok());
  const uint64_t length = kBytes - 200;
  REQUIRE((*mapping)->length() == length);
  CHECK(Mismatch(Bytes((*mapping)->address(), length),
                 data.substr(100, length)) == "");

  RegisteredBuffer host(device, length);
  absl::StatusOr<std::unique_ptr<GpuStream>> stream = device.CreateStream(0);
  REQUIRE(stream.ok());
  REQUIRE(CopyOut(**stream, (*mapping)->address(), host.data(), length).ok());
  CHECK(Mismatch(host.bytes(), data.substr(100, length)) == "");

  REQUIRE(Signal(child.sock()));
  CHECK(child.Join() == 0);
}

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

TEST_CASE("A region spanning two back-to-back allocations maps contiguously",
          "[gpu]") {
  const uint64_t segment = 16 * SimulatedPageSize();
  const std::string data = Pattern(2 * segment, 5);
  const uint64_t offset = 1000;
  const uint64_t length = 2 * segment - 3000;
  TrainerChild child([&](int sock) {
    SimulatedTrainerGpu gpu;
    const uint64_t base =
        ChildValue(gpu.AllocateSegments(2, segment), "AllocateSegments");
    std::memcpy(At(base), data.data(), data.size());
    GpuRegionExport region = SendRegion(sock, gpu, base + offset, length);
    CHILD_TRUE(AwaitSignal(sock));
    return 0;
  });
  SKIP_UNLESS_FDS_CAN_BE_TAKEN(child);
  WireRegion wire;
  REQUIRE(RecvPod(child.sock(), wire));
  REQUIRE(wire.count == 2);
  CHECK(wire.pieces[0].offset == offset);
  CHECK(wire.pieces[0].length == segment - offset);
  CHECK(wire.pieces[1].offset == 0);
  CHECK(wire.pieces[1].length == length - (segment - offset));
  CHECK(wire.pieces[0].id != wire.pieces[1].id);

  SimulatedDevice device;
  auto mapping = device.Map(0, PiecesOf(wire), child.taker());
  REQUIRE(mapping.ok());
  REQUIRE((*mapping)->length() == length);
  CHECK(Mismatch(Bytes((*mapping)->address(), length),
                 data.substr(offset, length)) == "");

  // One copy across the boundary between the two allocations.
  RegisteredBuffer host(device, 4096);
  auto stream = device.CreateStream(0);
  REQUIRE(stream.ok());
  const uint64_t boundary = (*mapping)->address() + (segment - offset);
  REQUIRE(CopyOut(**stream, boundary - 2048, host.data(), 4096).ok());
  CHECK(Mismatch(host.bytes(), data.substr(segment - 2048, 4096)) == "");

  REQUIRE(Signal(child.sock()));
  CHECK(child.Join() == 0);
}

// ---- The daemon side.

TEST_CASE("FindDevice knows the simulated devices' uuids and no others",
          "[gpu]") {
  SimulatedDevice device(3);
  CHECK(device.name() == "simulated");
  const std::string uuid = SimulatedDeviceUuid(2);
  CHECK(uuid.size() == 16);
  CHECK(uuid.substr(0, 12) == "ckpt-sim-gpu");
  CHECK(device.FindDevice(uuid).value_or(-1) == 2);
  CHECK(device.FindDevice(SimulatedDeviceUuid(0)).value_or(-1) == 0);
  CHECK(device.FindDevice(SimulatedDeviceUuid(3)).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(device.FindDevice("ckpt-sim-gpu").status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(device.CreateStream(3).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

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

TEST_CASE("Destroying a mapping unmaps it and closes the fds it took",
          "[gpu]") {
  InProcess gpu(2);
  const int fds_before = OpenFdCount();
  const int maps_before = SimulatedMapsLines();

  absl::StatusOr<std::unique_ptr<GpuMapping>> mapping =
      gpu.Map(gpu.region.pieces);
  REQUIRE(mapping.ok());
  const uint64_t address = (*mapping)->address();
  CHECK(IsMapped(address));
  CHECK(SimulatedMapsLines() == maps_before + 2);
  CHECK(OpenFdCount() == fds_before);  // the mapping holds the files, not fds

  mapping->reset();
  CHECK_FALSE(IsMapped(address));
  CHECK(SimulatedMapsLines() == maps_before);
  CHECK(OpenFdCount() == fds_before);
}

TEST_CASE(
    "Map refuses a piece whose allocation_bytes do not match its memfd's "
    "size, and leaks nothing",
    "[gpu]") {
  InProcess gpu;
  const int fds_before = OpenFdCount();
  const int maps_before = SimulatedMapsLines();
  std::vector<GpuPiece> pieces = gpu.region.pieces;
  pieces[0].allocation_bytes += SimulatedPageSize();  // a lie: SIGBUS beyond
  pieces[0].length += SimulatedPageSize();
  absl::StatusOr<std::unique_ptr<GpuMapping>> mapping = gpu.Map(pieces);
  CHECK(mapping.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(mapping.status().message()),
             Catch::Contains("does not match the expected"));
  CHECK(OpenFdCount() == fds_before);
  CHECK(SimulatedMapsLines() == maps_before);
}

TEST_CASE(
    "Map refuses zero-length pieces and pieces past their allocation's end",
    "[gpu]") {
  InProcess gpu;
  const GpuPiece good = gpu.region.pieces.at(0);
  std::vector<GpuPiece> pieces = {good};
  pieces[0].length = 0;
  CHECK(gpu.Map(pieces).status().code() == absl::StatusCode::kInvalidArgument);
  pieces[0] = good;
  pieces[0].offset = 8;  // length unchanged: 8 bytes past the end
  CHECK(gpu.Map(pieces).status().code() == absl::StatusCode::kInvalidArgument);
  pieces[0].offset = std::numeric_limits<uint64_t>::max() - 4;  // wraps
  pieces[0].length = 16;
  CHECK(gpu.Map(pieces).status().code() == absl::StatusCode::kInvalidArgument);
  pieces[0] = good;
  pieces[0].allocation_bytes = 5000;  // not whole pages
  CHECK(gpu.Map(pieces).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(gpu.Map({}).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Map refuses pieces that break the contiguity rule", "[gpu]") {
  InProcess gpu(2);
  std::vector<GpuPiece> pieces = gpu.region.pieces;
  REQUIRE(pieces.size() == 2);
  pieces[1].offset = SimulatedPageSize();  // a later piece not at its start
  pieces[1].length -= SimulatedPageSize();
  absl::StatusOr<std::unique_ptr<GpuMapping>> mapping = gpu.Map(pieces);
  CHECK(mapping.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(mapping.status().message()),
             Catch::Contains("not contiguous"));

  pieces = gpu.region.pieces;
  pieces[0].length -= 1;  // an earlier piece ending before its end
  CHECK(gpu.Map(pieces).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Map and OpenEvent refuse legacy IPC handles", "[gpu]") {
  InProcess gpu;
  std::vector<GpuPiece> pieces = gpu.region.pieces;
  pieces[0].handle.ipc_handle = std::string(64, 'h');
  absl::StatusOr<std::unique_ptr<GpuMapping>> mapping = gpu.Map(pieces);
  CHECK(mapping.status().code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(mapping.status().message()),
             Catch::Contains("no legacy IPC handles"));
  const GpuHandleRef legacy{std::string(64, 'e'), -1};
  CHECK(gpu.device.OpenEvent(0, legacy, TakeOwnFd).status().code() ==
        absl::StatusCode::kUnimplemented);
}

TEST_CASE("Map refuses a memfd that its owner could still shrink", "[gpu]") {
  SimulatedDevice device;
  UniqueFd memfd(::memfd_create("unsealed", MFD_CLOEXEC));
  REQUIRE(memfd.valid());
  REQUIRE(::ftruncate(memfd.get(), 4096) == 0);
  GpuPiece piece;
  piece.handle.peer_fd = memfd.get();
  piece.allocation_bytes = 4096;
  piece.length = 4096;
  absl::StatusOr<std::unique_ptr<GpuMapping>> mapping =
      device.Map(0, {&piece, 1}, TakeOwnFd);
  CHECK(mapping.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(mapping.status().message()),
             Catch::Contains("not sealed"));
  // An event page must be a sealed memfd too.
  CHECK(device.OpenEvent(0, {"", memfd.get()}, TakeOwnFd).status().code() ==
        absl::StatusCode::kInvalidArgument);
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

TEST_CASE(
    "Copies whose host memory is not inside one registered chunk fail with "
    "FailedPrecondition",
    "[gpu]") {
  InProcess gpu;
  auto mapping = gpu.Map(gpu.region.pieces);
  REQUIRE(mapping.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());
  const uint64_t device = (*mapping)->address();
  std::vector<char> host(8192);

  const GpuCopy unregistered{device, host.data(), 4096};
  CHECK((*stream)->CopyToHost({&unregistered, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK((*stream)->CopyToDevice({&unregistered, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);

  REQUIRE(gpu.device.RegisterHostMemory(host.data(), 8192, 4096).ok());
  const GpuCopy inside{device, host.data() + 4096, 4096};
  CHECK((*stream)->CopyToHost({&inside, 1}).ok());
  const GpuCopy straddling{device, host.data() + 100, 4096};  // two chunks
  CHECK((*stream)->CopyToHost({&straddling, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);
  auto fence = (*stream)->Fence();
  REQUIRE(fence.ok());
  CHECK((*fence)->Wait(kPatience).ok());  // refused copies leave no error

  REQUIRE(gpu.device.UnregisterHostMemory(host.data(), 8192, 4096).ok());
  CHECK((*stream)->CopyToHost({&inside, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "Registering host memory twice or unregistering unknown memory is "
    "refused",
    "[gpu]") {
  SimulatedDevice device;
  std::vector<char> host(8192);
  REQUIRE(device.RegisterHostMemory(host.data(), 8192, 4096).ok());
  CHECK(device.RegisterHostMemory(host.data() + 4000, 100, 4096).code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(device.UnregisterHostMemory(host.data(), 8192, 8192).code() ==
        absl::StatusCode::kFailedPrecondition);  // not the chunks registered
  REQUIRE(device.UnregisterHostMemory(host.data(), 8192, 4096).ok());
  CHECK(device.UnregisterHostMemory(host.data(), 8192, 4096).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("A copy of device memory outside every live mapping is refused",
          "[gpu]") {
  InProcess gpu;
  auto mapping = gpu.Map(gpu.region.pieces);
  REQUIRE(mapping.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());
  RegisteredBuffer host(gpu.device, 4096);
  const uint64_t end = (*mapping)->address() + (*mapping)->length();
  const GpuCopy past_end{end - 100, host.data(), 200};
  CHECK((*stream)->CopyToHost({&past_end, 1}).code() ==
        absl::StatusCode::kInvalidArgument);
  const uint64_t address = (*mapping)->address();
  mapping->reset();
  const GpuCopy unmapped{address, host.data(), 100};
  CHECK((*stream)->CopyToHost({&unmapped, 1}).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "A copy fault injected on enqueue is returned, one injected on "
    "completion is reported by later fences",
    "[gpu]") {
  InProcess gpu;
  auto mapping = gpu.Map(gpu.region.pieces);
  REQUIRE(mapping.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());
  RegisteredBuffer host(gpu.device, 4096);
  const GpuCopy copy{(*mapping)->address(), host.data(), 4096};

  gpu.device.FailNextCopy(absl::DataLossError("injected on enqueue"));
  CHECK((*stream)->CopyToHost({&copy, 1}).code() ==
        absl::StatusCode::kDataLoss);
  CHECK(CopyOut(**stream, copy.device, copy.host, copy.length).ok());

  gpu.device.FailNextCopy(absl::DataLossError("injected on completion"),
                          CopyFault::kOnCompletion);
  REQUIRE((*stream)->CopyToDevice({&copy, 1}).ok());
  auto fence = (*stream)->Fence();
  REQUIRE(fence.ok());
  const absl::Status failed = (*fence)->Wait(kPatience);
  CHECK(failed.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(failed.message()),
             Catch::Contains("injected on completion"));
  CHECK(CopyOut(**stream, copy.device, copy.host, copy.length).code() ==
        absl::StatusCode::kDataLoss);  // sticky
}

}  // namespace
}  // namespace ckpt

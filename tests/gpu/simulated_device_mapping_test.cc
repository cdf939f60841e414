// Tests of the simulated GPU's mappings (SimulatedDevice::Map): a
// trainer's allocations imported by the daemon, one allocation and two
// back-to-back ones, with the bytes read back by a copy; device lookup by
// uuid; a destroyed mapping unmapping its memory and leaking no fd; and the
// refusal of bad pieces and handles (sizes that do not match the memfd,
// empty or out-of-range pieces, broken contiguity, legacy IPC handles,
// unsealed memfds). Across processes, a forked child is the trainer
// (SimulatedTrainerGpu) and this process is the daemon (SimulatedDevice),
// taking the child's fds with pidfd_getfd as ckptd does; the daemon-side
// rules run the trainer in this process and take its fds with dup.
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_device_fixtures.h"
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
using ::ckpt::testing::InProcess;
using ::ckpt::testing::kBytes;
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

}  // namespace
}  // namespace ckpt

// Tests of the simulated GPU. Across processes, a forked child is the
// trainer (SimulatedTrainerGpu, its stream's "kernels" are lambdas) and
// this process is the daemon (SimulatedDevice), taking the child's fds
// with pidfd_getfd as ckptd does. Tests of one side's rules run the
// trainer in this process and take its fds with dup.
//
// Ordering tests are deterministic: the daemon makes its wait or copy only
// after the child said its record was enqueued (CUDA's rule: a wait covers
// the records made before it), and the trainer's deliberate 100 ms delay
// only makes a broken implementation fail, never a correct one.
#include "gpu/simulated_device.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_trainer_gpu.h"
#include "support/skip.h"

namespace ckpt {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(20);

// Bytes that differ at every position, so misplaced data is caught.
std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  }
  return data;
}

char* At(uint64_t address) { return reinterpret_cast<char*>(address); }
std::string Bytes(uint64_t address, uint64_t length) {
  return std::string(At(address), length);
}

// "" when `actual` equals `expected`, else where they first differ (Catch
// would print kilobytes of binary).
std::string Mismatch(const std::string& actual, const std::string& expected) {
  if (actual.size() != expected.size()) {
    return "size " + std::to_string(actual.size()) + ", expected " +
           std::to_string(expected.size());
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] != expected[i]) {
      return "first difference at byte " + std::to_string(i);
    }
  }
  return "";
}

// ---- The trainer child and what it sends.

// One region's export and the device's events, as the child sends them.
struct WireRegion {
  char uuid[16];
  uint32_t count = 0;
  struct {
    int32_t fd;
    uint64_t allocation_bytes, offset, length, id;
  } pieces[4];
  int32_t ready_fd = -1;
  int32_t staged_fd = -1;
};

template <typename T>
bool SendPod(int sock, const T& value) {
  return ::send(sock, &value, sizeof value, MSG_NOSIGNAL) ==
         static_cast<ssize_t>(sizeof value);
}
template <typename T>
bool RecvPod(int sock, T& value) {
  ssize_t n;
  do {
    n = ::recv(sock, &value, sizeof value, 0);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof value);
}
bool Signal(int sock) { return SendPod(sock, '!'); }
bool AwaitSignal(int sock) {
  char c;
  return RecvPod(sock, c) && c == '!';
}

std::vector<GpuPiece> PiecesOf(const WireRegion& wire) {
  std::vector<GpuPiece> pieces(wire.count);
  for (uint32_t i = 0; i < wire.count; ++i) {
    pieces[i].handle.peer_fd = wire.pieces[i].fd;
    pieces[i].allocation_bytes = wire.pieces[i].allocation_bytes;
    pieces[i].offset = wire.pieces[i].offset;
    pieces[i].length = wire.pieces[i].length;
  }
  return pieces;
}

// In the child, where Catch2 must not run: a failed step exits with 1.
[[noreturn]] void ChildFail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "trainer child: %s: %s\n", what,
               status.ToString().c_str());
  ::_exit(1);
}
#define CHILD_OK(expr)                                        \
  do {                                                        \
    const absl::Status child_status_ = (expr);                \
    if (!child_status_.ok()) ChildFail(#expr, child_status_); \
  } while (0)
template <typename T>
T ChildValue(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) ChildFail(what, value.status());
  return *std::move(value);
}
#define CHILD_TRUE(cond)                                            \
  do {                                                              \
    if (!(cond)) ChildFail(#cond, absl::InternalError("is false")); \
  } while (0)

// Exports [address, +length) with device 0's events and sends it; returns
// the export, which keeps the fds open until the child drops it.
GpuRegionExport SendRegion(int sock, SimulatedTrainerGpu& gpu, uint64_t address,
                           uint64_t length) {
  GpuRegionExport region = ChildValue(gpu.Export(address, length), "Export");
  const GpuEventHandles events =
      ChildValue(gpu.Events(region.device_uuid), "Events");
  WireRegion wire;
  CHILD_TRUE(region.device_uuid.size() == 16 && region.pieces.size() <= 4);
  std::memcpy(wire.uuid, region.device_uuid.data(), 16);
  wire.count = region.pieces.size();
  for (size_t i = 0; i < region.pieces.size(); ++i) {
    const GpuPiece& p = region.pieces[i];
    wire.pieces[i] = {p.handle.peer_fd, p.allocation_bytes, p.offset, p.length,
                      region.allocation_ids[i]};
  }
  wire.ready_fd = events.ready.peer_fd;
  wire.staged_fd = events.staged.peer_fd;
  CHILD_TRUE(SendPod(sock, wire));
  return region;
}

// A forked child playing the trainer: `body` runs there with its end of a
// SOCK_SEQPACKET socketpair and returns the child's exit code.
class TrainerChild {
 public:
  explicit TrainerChild(std::function<int(int sock)> body) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(sv[0]);
      int code = 2;
      try {
        code = body(sv[1]);
      } catch (...) {
      }
      ::_exit(code);
    }
    ::close(sv[1]);
    child_sock_number_ = sv[1];
    sock_.reset(sv[0]);
    pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    pidfd_errno_ = errno;
  }
  ~TrainerChild() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  int sock() const { return sock_.get(); }

  // Why this machine does not let this process take the child's fds
  // (empty if it does): a kernel without pidfd_getfd (before 5.6), or
  // ptrace rules that forbid it. Other errors are the test's to report.
  std::string CannotTakeFds() const {
    int err = pidfd_errno_;
    if (pidfd_.valid()) {
      UniqueFd probe(static_cast<int>(
          ::syscall(SYS_pidfd_getfd, pidfd_.get(), child_sock_number_, 0)));
      if (probe.valid()) return "";
      err = errno;
    }
    if (err != ENOSYS && err != EPERM && err != EACCES) return "";
    return std::string("pidfd_open/pidfd_getfd: ") + std::strerror(err);
  }

  // Takes the child's fds, as the daemon's sessions do.
  PeerFdTaker taker() const {
    const int pidfd = pidfd_.get();
    return [pidfd](int peer_fd) -> absl::StatusOr<UniqueFd> {
      const int fd =
          static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, peer_fd, 0));
      if (fd < 0) return ErrnoToStatus(errno, "pidfd_getfd");
      return UniqueFd(fd);
    };
  }

  // Waits for the child to end; its exit code, or -1 if it was killed.
  int Join() {
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int child_sock_number_ = -1;
  UniqueFd sock_;
  UniqueFd pidfd_;
  int pidfd_errno_ = 0;
};

#define SKIP_UNLESS_FDS_CAN_BE_TAKEN(child)                            \
  do {                                                                 \
    const std::string why = (child).CannotTakeFds();                   \
    if (!why.empty()) CKPT_SKIP("cannot take a child's fds: " << why); \
  } while (0)

// ---- The daemon side in this process.

// Takes fds of this very process (the trainer running here), as a dup.
absl::StatusOr<UniqueFd> TakeOwnFd(int fd) {
  UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) return ErrnoToStatus(errno, "dup");
  return copy;
}

// A host buffer registered with `device` as one chunk.
class RegisteredBuffer {
 public:
  RegisteredBuffer(SimulatedDevice& device, uint64_t length)
      : device_(device), data_(length, '\0') {
    REQUIRE(device_.RegisterHostMemory(data_.data(), length, length).ok());
  }
  ~RegisteredBuffer() {
    CHECK(device_.UnregisterHostMemory(data_.data(), data_.size(), data_.size())
              .ok());
  }
  char* data() { return data_.data(); }
  const std::string& bytes() const { return data_; }

 private:
  SimulatedDevice& device_;
  std::string data_;
};

// Copies [address, +length) of a mapping into `host` on `stream` and waits.
absl::Status CopyOut(GpuStream& stream, uint64_t address, char* host,
                     uint64_t length) {
  const GpuCopy copy{address, host, length};
  RETURN_IF_ERROR(stream.CopyToHost({&copy, 1}));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> fence, stream.Fence());
  return fence->Wait(kPatience);
}

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
    "An allocation freed and made again at the same address gets a new id",
    "[gpu]") {
  SimulatedTrainerGpu gpu;
  absl::StatusOr<uint64_t> address = gpu.Allocate(4096);
  REQUIRE(address.ok());
  auto first = gpu.AllocationIds(*address, 4096);
  REQUIRE(first.ok());
  REQUIRE(first->size() == 1);

  REQUIRE(gpu.Free(*address).ok());
  CHECK(gpu.AllocationIds(*address, 4096).status().code() ==
        absl::StatusCode::kNotFound);
  absl::StatusOr<uint64_t> again = gpu.Allocate(4096, 0, *address);
  REQUIRE(again.ok());
  REQUIRE(*again == *address);
  auto second = gpu.AllocationIds(*address, 4096);
  REQUIRE(second.ok());
  REQUIRE(second->size() == 1);
  CHECK((*second)[0] != (*first)[0]);

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
             Catch::Contains("does not match the allocation's size"));
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
  trainer_stream.Enqueue([&] { release.WaitForNotification(); });
  REQUIRE(
      gpu.trainer.RecordReady(gpu.region.device_uuid, &trainer_stream).ok());
  auto events = gpu.trainer.Events(gpu.region.device_uuid);
  REQUIRE(events.ok());
  auto ready = gpu.device.OpenEvent(0, events->ready, TakeOwnFd);
  REQUIRE(ready.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());

  REQUIRE((*stream)->WaitEvent(**ready).ok());
  auto fence = (*stream)->Fence();
  REQUIRE(fence.ok());
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
  trainer_stream.Enqueue([&] { release.WaitForNotification(); });
  REQUIRE(
      gpu.trainer.RecordReady(gpu.region.device_uuid, &trainer_stream).ok());
  auto events = gpu.trainer.Events(gpu.region.device_uuid);
  REQUIRE(events.ok());
  auto ready = gpu.device.OpenEvent(0, events->ready, TakeOwnFd);
  REQUIRE(ready.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());
  REQUIRE((*stream)->WaitEvent(**ready).ok());
  auto fence = (*stream)->Fence();
  REQUIRE(fence.ok());

  stream->reset();  // must not wait for the trainer
  CHECK((*fence)->Wait(kPatience).code() == absl::StatusCode::kAborted);
  release.Notify();
  trainer_stream.Synchronize();
}

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

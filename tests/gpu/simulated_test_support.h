// Test support shared by the simulated GPU's tests: pattern bytes and
// their comparison, a forked child playing the trainer
// (SimulatedTrainerGpu) and what it sends over a SOCK_SEQPACKET
// socketpair, and the daemon side in this process: taking the child's fds
// with pidfd_getfd as ckptd does (or its own with dup), registered host
// buffers and copies out of a mapping.
//
// Thread-safety: none; one test case owns each object.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "gpu/gpu_device.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_trainer_gpu.h"
#include "gpu/trainer_gpu.h"
#include "support/skip.h"

namespace ckpt::testing {

inline constexpr absl::Duration kPatience = absl::Seconds(20);

// Bytes that differ at every position, so misplaced data is caught.
inline std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  }
  return data;
}

inline char* At(uint64_t address) { return reinterpret_cast<char*>(address); }
inline std::string Bytes(uint64_t address, uint64_t length) {
  return std::string(At(address), length);
}

// "" when `actual` equals `expected`, else where they first differ (Catch
// would print kilobytes of binary).
inline std::string Mismatch(const std::string& actual,
                            const std::string& expected) {
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
inline bool Signal(int sock) { return SendPod(sock, '!'); }
inline bool AwaitSignal(int sock) {
  char c;
  return RecvPod(sock, c) && c == '!';
}

inline std::vector<GpuPiece> PiecesOf(const WireRegion& wire) {
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
[[noreturn]] inline void ChildFail(const char* what,
                                   const absl::Status& status) {
  std::fprintf(stderr, "trainer child: %s: %s\n", what,
               status.ToString().c_str());
  ::_exit(1);
}
#define CHILD_OK(expr)                                                         \
  do {                                                                         \
    const absl::Status child_status_ = (expr);                                 \
    if (!child_status_.ok()) ::ckpt::testing::ChildFail(#expr, child_status_); \
  } while (0)
template <typename T>
T ChildValue(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) ChildFail(what, value.status());
  return *std::move(value);
}
#define CHILD_TRUE(cond)                                                  \
  do {                                                                    \
    if (!(cond))                                                          \
      ::ckpt::testing::ChildFail(#cond, absl::InternalError("is false")); \
  } while (0)

// Exports [address, +length) with device 0's events and sends it; returns
// the export, which keeps the fds open until the child drops it.
inline GpuRegionExport SendRegion(int sock, SimulatedTrainerGpu& gpu,
                                  uint64_t address, uint64_t length) {
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
inline absl::StatusOr<UniqueFd> TakeOwnFd(int fd) {
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
inline absl::Status CopyOut(GpuStream& stream, uint64_t address, char* host,
                            uint64_t length) {
  const GpuCopy copy{address, host, length};
  RETURN_IF_ERROR(stream.CopyToHost({&copy, 1}));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> fence, stream.Fence());
  return fence->Wait(kPatience);
}

}  // namespace ckpt::testing

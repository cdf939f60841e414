// Test support for the CUDA tests: processes, messages and trainer memory.
//
// CUDA and fork do not mix: a child forked after its parent used CUDA
// cannot use it. So the test process never calls CUDA: a case runs its CUDA
// work in forked children (Spawn, RunPair), which report a Status through a
// pipe, and checks that Status. RunPair's parent forks its child before it
// touches CUDA. The daemon takes the trainer's fds with pidfd_getfd, which
// Yama's ptrace rules allow from an ancestor, or from a process the
// trainer named (AllowToTakeFds).
//
// Everything here is inline: included by the CUDA test files only.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "cuda/cuda_driver.h"
#include "gpu/trainer_gpu.h"
#include "support/skip.h"

namespace ckpt::cuda_testing {

inline constexpr absl::Duration kPatience = absl::Seconds(60);

inline std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = (i * 131 + seed * 7 + (i >> 9));
  return data;
}

struct Child {
  pid_t pid = -1;
  UniqueFd result;
};

// Runs `body` in a forked child, which reports its Status and exits.
inline Child Spawn(const std::function<absl::Status()>& body) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    const absl::Status status = body();
    const std::string out =
        absl::StrCat(static_cast<int>(status.code()), " ", status.message());
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  Child child{pid, UniqueFd(fds[0])};
  if (pid < 0) child.result.reset();
  return child;
}

// How a child ends: it finishes and reports a Status, or the case kills it
// (SIGKILL), which is then what must happen.
enum class ChildEnd { kFinishes, kKilled };

// The Status `child` reported, waiting at most kPatience (then it is
// killed). With kKilled: OK if it was killed by SIGKILL before reporting.
inline absl::Status Join(Child& child, ChildEnd end = ChildEnd::kFinishes) {
  if (child.pid < 0) return ErrnoToStatus(errno, "fork");
  std::string out;
  bool hung = false;
  const absl::Time deadline = absl::Now() + kPatience;
  for (char buf[4096];;) {
    pollfd p = {child.result.get(), POLLIN, 0};
    const int left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || ::poll(&p, 1, left) == 0) {
      ::kill(child.pid, SIGKILL);
      hung = true;
      break;
    }
    const ssize_t n = ::read(child.result.get(), buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, n);
  }
  int wait_status = 0;
  ::waitpid(child.pid, &wait_status, 0);
  if (hung) return absl::DeadlineExceededError("hung child");
  const bool killed =
      WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL;
  if (end == ChildEnd::kKilled) {
    if (killed && out.empty()) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("the child was to be killed, but it ended with status ",
                     wait_status, ", reporting: ", out));
  }
  const size_t space = out.find(' ');
  if (space == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("child died, status ", wait_status));
  }
  return absl::Status(static_cast<absl::StatusCode>(std::stoi(out)),
                      out.substr(space + 1));
}

// Kills `pid` (SIGKILL) and waits until it has exited, without reaping it
// (its parent's Join does).
inline absl::Status KillAndAwait(pid_t pid) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) return ErrnoToStatus(errno, "pidfd_open");
  if (::kill(pid, SIGKILL) != 0) return ErrnoToStatus(errno, "kill");
  pollfd p = {pidfd.get(), POLLIN, 0};
  if (::poll(&p, 1, absl::ToInt64Milliseconds(kPatience)) != 1) {
    return absl::DeadlineExceededError("the killed process did not exit");
  }
  return absl::OkStatus();
}

// The daemon's way to take a trainer's fds: pidfd_getfd.
inline PeerFdTaker PidfdTaker(pid_t trainer) {
  auto pidfd = std::make_shared<UniqueFd>(
      static_cast<int>(::syscall(SYS_pidfd_open, trainer, 0)));
  const int open_errno = errno;
  return [pidfd, open_errno](int peer_fd) -> absl::StatusOr<UniqueFd> {
    if (!pidfd->valid()) return ErrnoToStatus(open_errno, "pidfd_open");
    UniqueFd fd(
        static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd->get(), peer_fd, 0)));
    if (!fd.valid()) return ErrnoToStatus(errno, "pidfd_getfd");
    return fd;
  };
}

// Lets `daemon`, not an ancestor of this process, take its fds under
// Yama's ptrace rules (without Yama, the ordinary same-user rules apply).
inline absl::Status AllowToTakeFds(pid_t daemon) {
  if (::prctl(PR_SET_PTRACER, daemon, 0, 0, 0) == 0 || errno == EINVAL) {
    return absl::OkStatus();
  }
  return ErrnoToStatus(errno, "prctl(PR_SET_PTRACER)");
}

inline absl::Status Send(int sock, const std::string& message) {
  if (::send(sock, message.data(), message.size(), MSG_NOSIGNAL) >= 0) {
    return absl::OkStatus();
  }
  return ErrnoToStatus(errno, "send");
}
inline absl::StatusOr<std::string> Recv(int sock) {
  pollfd p = {sock, POLLIN, 0};
  if (::poll(&p, 1, absl::ToInt64Milliseconds(kPatience)) != 1) {
    return absl::DeadlineExceededError("no message from the other process");
  }
  std::string buf(1 << 16, '\0');
  const ssize_t n = ::recv(sock, buf.data(), buf.size(), 0);
  if (n <= 0) return absl::AbortedError("the other process is gone");
  buf.resize(n);
  return buf;
}
inline absl::Status Expect(int sock, const std::string& word) {
  ASSIGN_OR_RETURN(std::string got, Recv(sock));
  if (got == word) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("expected ", word, ", got ", got));
}

// One process of a pair: `peer` is the other's pid.
using Side = std::function<absl::Status(int sock, pid_t peer)>;

// Runs `parent` in a child and `child` in a grandchild, forked before
// `parent` runs, connected by a SOCK_SEQPACKET socketpair. The names label
// their Statuses; `end` says whether `parent` kills `child`.
inline absl::Status RunParentAndChild(const char* parent_name,
                                      const Side& parent,
                                      const char* child_name, const Side& child,
                                      ChildEnd end) {
  Child outer = Spawn([&] {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      return ErrnoToStatus(errno, "socketpair");
    }
    const pid_t parent_pid = ::getpid();
    Child inner = Spawn([&] { return child(sv[1], parent_pid); });
    ::close(sv[1]);
    const absl::Status parent_status = parent(sv[0], inner.pid);
    ::close(sv[0]);  // a child waiting for its parent sees it gone
    const absl::Status child_status = Join(inner, end);
    if (parent_status.ok()) return Annotate(child_status, child_name);
    return absl::Status(
        parent_status.code(),
        absl::StrCat(parent_name, ": ", parent_status.message(), "; ",
                     child_name, ": ", child_status.message()));
  });
  return Join(outer);
}

// The usual pair: the daemon is the trainer's parent, and so may take its
// fds.
inline absl::Status RunPair(
    const std::function<absl::Status(int sock)>& trainer,
    const std::function<absl::Status(int, pid_t)>& daemon,
    ChildEnd end = ChildEnd::kFinishes) {
  return RunParentAndChild(
      "daemon", daemon, "trainer",
      [&](int sock, pid_t) { return trainer(sock); }, end);
}

// Empty where a CUDA device is usable, else why not (asked in a child).
inline std::string NoCudaDevice() {
  static const std::string* why = [] {
    Child child = Spawn([] {
      int count = 0;
      RETURN_IF_ERROR(
          CudaErrorToStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
      return count > 0 ? absl::OkStatus() : absl::NotFoundError("0 devices");
    });
    const absl::Status status = Join(child);
    return new std::string(status.ok() ? "" : status.ToString());
  }();
  return *why;
}
#define SKIP_WITHOUT_CUDA_DEVICE()                                  \
  if (const std::string why = ::ckpt::cuda_testing::NoCudaDevice(); \
      !why.empty()) {                                               \
    CKPT_SKIP("no CUDA device: " << why);                           \
  }

// What the trainer sends: a region of at most two pieces and the events
// (the fds of their pages in the trainer).
struct Wire {
  char uuid[16];
  int32_t ready_fd = -1, staged_fd = -1;
  uint32_t count = 0;
  struct {
    char ipc[64];
    uint32_t ipc_bytes;
    int32_t fd;
    uint64_t allocation_bytes, offset, length;
  } pieces[2];
};
inline std::string ToWire(const std::string& uuid,
                          const GpuEventHandles& events,
                          const std::vector<GpuPiece>& pieces) {
  Wire w = {};
  uuid.copy(w.uuid, 16);
  w.ready_fd = events.ready.peer_fd;
  w.staged_fd = events.staged.peer_fd;
  for (const GpuPiece& p : pieces) {
    if (w.count == 2) break;
    auto& out = w.pieces[w.count++];
    out.ipc_bytes = p.handle.ipc_handle.copy(out.ipc, 64);
    out.fd = p.handle.peer_fd;
    out.allocation_bytes = p.allocation_bytes;
    out.offset = p.offset;
    out.length = p.length;
  }
  return std::string(reinterpret_cast<const char*>(&w), sizeof w);
}
inline Wire FromWire(const std::string& in) {
  Wire w = {};
  std::memcpy(&w, in.data(), std::min(in.size(), sizeof w));
  return w;
}
inline std::vector<GpuPiece> PiecesOf(const Wire& w) {
  std::vector<GpuPiece> pieces;
  for (uint32_t i = 0; i < w.count && i < 2; ++i) {
    const auto& p = w.pieces[i];
    pieces.push_back({{std::string(p.ipc, p.ipc_bytes), p.fd},
                      p.allocation_bytes,
                      p.offset,
                      p.length});
  }
  return pieces;
}

// ---- Trainer-side memory.

// Physical allocations mapped back to back, as PyTorch's expandable
// segments do; `types`: CUmemAllocationProp::requestedHandleTypes.
class VirtualMemory {
 public:
  ~VirtualMemory() { (void)Release(); }
  absl::Status Create(std::vector<size_t> granules,
                      CUmemAllocationHandleType types) {
    ASSIGN_OR_RETURN(api_, CudaDriver());
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    prop_.requestedHandleTypes = types;
    RETURN_IF_ERROR(Cu(api_->cuMemGetAllocationGranularity(
        &granule_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
    for (size_t n : granules)
      sizes_.push_back(n * granule_), bytes_ += n * granule_;
    RETURN_IF_ERROR(Cu(api_->cuMemAddressReserve(&base_, bytes_, 0, 0, 0)));
    handles_.resize(sizes_.size());
    for (size_t i = 0; i < sizes_.size(); ++i) RETURN_IF_ERROR(MapOne(i));
    return absl::OkStatus();
  }
  // Replaces allocation i by a new one at the same address.
  absl::Status Remap(size_t i) {
    RETURN_IF_ERROR(UnmapOne(i));
    return MapOne(i);
  }
  absl::Status Release() {
    for (size_t i = 0; i < handles_.size(); ++i) RETURN_IF_ERROR(UnmapOne(i));
    if (base_ != 0) RETURN_IF_ERROR(Cu(api_->cuMemAddressFree(base_, bytes_)));
    base_ = 0;
    return absl::OkStatus();
  }
  uint64_t base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t granule() const { return granule_; }

 private:
  static absl::Status Cu(CUresult result) {
    return CuResultToStatus(result, "test virtual memory");
  }
  uint64_t At(size_t i) const {
    uint64_t at = base_;
    for (size_t j = 0; j < i; ++j) at += sizes_[j];
    return at;
  }
  absl::Status MapOne(size_t i) {
    RETURN_IF_ERROR(Cu(api_->cuMemCreate(&handles_[i], sizes_[i], &prop_, 0)));
    RETURN_IF_ERROR(Cu(api_->cuMemMap(At(i), sizes_[i], 0, handles_[i], 0)));
    CUmemAccessDesc access = {prop_.location,
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return Cu(api_->cuMemSetAccess(At(i), sizes_[i], &access, 1));
  }
  absl::Status UnmapOne(size_t i) {
    if (handles_[i] == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Cu(api_->cuMemUnmap(At(i), sizes_[i])));
    RETURN_IF_ERROR(Cu(api_->cuMemRelease(handles_[i])));
    handles_[i] = 0;
    return absl::OkStatus();
  }

  const CudaDriverApi* api_ = nullptr;
  CUmemAllocationProp prop_ = {};
  size_t granule_ = 0, bytes_ = 0;
  std::vector<size_t> sizes_;
  std::vector<CUmemGenericAllocationHandle> handles_;
  CUdeviceptr base_ = 0;
};

// Host memory is registered in kChunk pieces. A copy whose host side spans
// two registrations is a pageable copy, which may wait for the stream, so
// copies stay inside chunks, as ckptd's buffers do.
inline constexpr uint64_t kChunk = 1 << 20;

inline std::vector<GpuCopy> InChunks(uint64_t device, char* host,
                                     uint64_t length) {
  std::vector<GpuCopy> copies;
  for (uint64_t at = 0; at < length; at += kChunk) {
    copies.push_back({device + at, host + at, std::min(kChunk, length - at)});
  }
  return copies;
}

inline absl::Status Cuda(cudaError_t error, const char* what) {
  return CudaErrorToStatus(error, what);
}

// Holds `stream` until a byte arrives on the returned fd.
inline absl::StatusOr<int> HoldStream(cudaStream_t stream) {
  int gate[2];
  if (::pipe(gate) != 0) return ErrnoToStatus(errno, "pipe");
  auto wait = [](void* fd) {
    char c;
    (void)!::read(static_cast<int>(reinterpret_cast<intptr_t>(fd)), &c, 1);
  };
  RETURN_IF_ERROR(
      Cuda(cudaLaunchHostFunc(stream, wait,
                              reinterpret_cast<void*>(intptr_t{gate[0]})),
           "cudaLaunchHostFunc"));
  return gate[1];
}
inline absl::Status Release(int gate) {
  return ::write(gate, "x", 1) == 1 ? absl::OkStatus()
                                    : ErrnoToStatus(errno, "write gate");
}

}  // namespace ckpt::cuda_testing

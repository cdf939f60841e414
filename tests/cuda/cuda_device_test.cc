// Tests of CudaDevice on a real GPU: a trainer child exports memory with
// CudaTrainerGpu, a daemon child maps and copies it (cuda_test_support.h
// says why every case runs in children).
//
// Ordering is tested deterministically: the trainer's stream is held by a
// host function that waits on a pipe, so the daemon's copies must wait for
// the trainer's "ready" however fast the GPU is.
#include "cuda/cuda_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_event_page.h"
#include "cuda/cuda_test_support.h"
#include "cuda/cuda_trainer_gpu.h"
#include "support/skip.h"

namespace ckpt::cuda_testing {
namespace {

// ---- A region's round trip, both sides.

enum class Kind { kCudaMalloc, kVirtual };

absl::Status TrainerRoundTrip(Kind kind, int sock) {
  RETURN_IF_ERROR(Cuda(cudaSetDevice(0), "cudaSetDevice"));
  VirtualMemory vmm;
  void* malloced = nullptr;
  uint64_t address, length;
  if (kind == Kind::kVirtual) {  // from inside the first into the second
    RETURN_IF_ERROR(
        vmm.Create({4, 8}, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    address = vmm.base() + 4096;
    length = vmm.bytes() - 2 * 4096;
  } else {
    RETURN_IF_ERROR(Cuda(cudaMalloc(&malloced, 8 << 20), "cudaMalloc"));
    address = reinterpret_cast<uint64_t>(malloced) + 4096 + 512;
    length = 5 << 20;
  }
  void* device = reinterpret_cast<void*>(address);
  RETURN_IF_ERROR(Cuda(cudaMemset(device, 0, length), "cudaMemset"));
  // Pinned, so that the copies below are asynchronous.
  void* pinned = nullptr;
  RETURN_IF_ERROR(Cuda(cudaMallocHost(&pinned, length), "cudaMallocHost"));
  std::memcpy(pinned, Pattern(length, 2).data(), length);
  ASSIGN_OR_RETURN(auto gpu, CudaTrainerGpu::Create());
  ASSIGN_OR_RETURN(GpuRegionExport region, gpu->Export(address, length));
  ASSIGN_OR_RETURN(GpuEventHandles events, gpu->Events(region.device_uuid));
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(Cuda(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  // The tensors' last write, held back until the daemon's copies are queued.
  ASSIGN_OR_RETURN(const int gate, HoldStream(stream));
  RETURN_IF_ERROR(Cuda(
      cudaMemcpyAsync(device, pinned, length, cudaMemcpyHostToDevice, stream),
      "write"));
  RETURN_IF_ERROR(gpu->RecordReady(region.device_uuid, stream));
  RETURN_IF_ERROR(
      Send(sock, ToWire(region.device_uuid, events, region.pieces)));

  RETURN_IF_ERROR(Expect(sock, "release"));
  RETURN_IF_ERROR(Release(gate));
  RETURN_IF_ERROR(Expect(sock, "written"));
  region.fds.clear();  // the daemon has mapped them
  RETURN_IF_ERROR(gpu->WaitStaged(region.device_uuid, stream));
  RETURN_IF_ERROR(Cuda(
      cudaMemcpyAsync(pinned, device, length, cudaMemcpyDeviceToHost, stream),
      "read"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (std::memcmp(pinned, Pattern(length, 3).data(), length) != 0) {
    return absl::InternalError("the daemon's CopyToDevice bytes are not here");
  }
  if (kind == Kind::kCudaMalloc) {
    RETURN_IF_ERROR(Send(sock, "done"));
    RETURN_IF_ERROR(Expect(sock, "unmapped"));
    return Cuda(cudaFree(malloced), "cudaFree");
  }
  // The daemon's import keeps the memory after we let go of ours...
  RETURN_IF_ERROR(vmm.Release());
  size_t free_bytes = 0, total = 0;
  RETURN_IF_ERROR(Cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo"));
  RETURN_IF_ERROR(Send(sock, "freed"));
  RETURN_IF_ERROR(Expect(sock, "unmapped"));
  // ...until its mapping is dropped.
  const size_t expected = free_bytes + vmm.granule() * 12 * 9 / 10;
  for (const absl::Time end = absl::Now() + absl::Seconds(5);;) {
    RETURN_IF_ERROR(
        Cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo"));
    if (free_bytes >= expected) return absl::OkStatus();
    if (absl::Now() > end) {
      return absl::InternalError(absl::StrCat(
          "device memory did not come back: ", free_bytes, " < ", expected));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::Status DaemonRoundTrip(Kind kind, int sock, pid_t trainer) {
  ASSIGN_OR_RETURN(std::string message, Recv(sock));
  const Wire wire = FromWire(message);
  const std::vector<GpuPiece> pieces = PiecesOf(wire);
  if (pieces.size() != (kind == Kind::kVirtual ? 2u : 1u)) {
    return absl::InternalError(absl::StrCat(pieces.size(), " pieces exported"));
  }
  const PeerFdTaker take_fd = PidfdTaker(trainer);
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> gpu, CudaDevice::Create());
  ASSIGN_OR_RETURN(const int device,
                   gpu->FindDevice(std::string(wire.uuid, 16)));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuMapping> mapping,
                   gpu->Map(device, pieces, take_fd));
  const uint64_t length = mapping->length();
  ASSIGN_OR_RETURN(auto ready,
                   gpu->OpenEvent(device, {"", wire.ready_fd}, take_fd));
  ASSIGN_OR_RETURN(auto staged,
                   gpu->OpenEvent(device, {"", wire.staged_fd}, take_fd));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuStream> stream,
                   gpu->CreateStream(device));
  const uint64_t host_bytes = (length + kChunk - 1) / kChunk * kChunk;
  std::unique_ptr<char[]> host(new char[host_bytes]);
  RETURN_IF_ERROR(gpu->RegisterHostMemory(host.get(), host_bytes, kChunk));

  // The copies wait for "ready", which waits for the trainer's gate.
  RETURN_IF_ERROR(stream->WaitEvent(*ready).status());
  RETURN_IF_ERROR(
      stream->CopyToHost(InChunks(mapping->address(), host.get(), length)));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> fence, stream->Fence());
  const absl::Status early = fence->Wait(absl::Milliseconds(200));
  if (!absl::IsDeadlineExceeded(early) || fence->Ready().value_or(true)) {
    return absl::InternalError(
        absl::StrCat("no wait for ready: ", early.ToString()));
  }
  RETURN_IF_ERROR(Send(sock, "release"));
  RETURN_IF_ERROR(fence->Wait(kPatience));
  if (std::string(host.get(), length) != Pattern(length, 2)) {
    return absl::InternalError("CopyToHost bytes differ from the trainer's");
  }

  const std::string back = Pattern(length, 3);
  std::memcpy(host.get(), back.data(), length);
  RETURN_IF_ERROR(
      stream->CopyToDevice(InChunks(mapping->address(), host.get(), length)));
  RETURN_IF_ERROR(stream->RecordEvent(*staged));
  ASSIGN_OR_RETURN(fence, stream->Fence());
  RETURN_IF_ERROR(fence->Wait(kPatience));
  RETURN_IF_ERROR(Send(sock, "written"));

  auto read_back = [&](const GpuMapping& m) -> absl::Status {
    std::memset(host.get(), 0, length);
    RETURN_IF_ERROR(
        stream->CopyToHost(InChunks(m.address(), host.get(), length)));
    ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> f, stream->Fence());
    RETURN_IF_ERROR(f->Wait(kPatience));
    if (std::string(host.get(), length) == back) return absl::OkStatus();
    return absl::InternalError("the mapping reads wrong bytes");
  };
  if (kind == Kind::kCudaMalloc) {
    // One opening serves both mappings; the last one dropped closes it,
    // and the handle opens again afterwards.
    ASSIGN_OR_RETURN(std::unique_ptr<GpuMapping> second,
                     gpu->Map(device, pieces, take_fd));
    if (second->address() != mapping->address()) {
      return absl::InternalError("a second mapping of one handle moved");
    }
    mapping.reset();
    RETURN_IF_ERROR(read_back(*second));
    second.reset();
    ASSIGN_OR_RETURN(mapping, gpu->Map(device, pieces, take_fd));
    RETURN_IF_ERROR(read_back(*mapping));
    RETURN_IF_ERROR(Expect(sock, "done"));
  } else {
    RETURN_IF_ERROR(Expect(sock, "freed"));
    RETURN_IF_ERROR(read_back(*mapping));  // alive through our import
  }
  mapping.reset();
  RETURN_IF_ERROR(gpu->UnregisterHostMemory(host.get(), host_bytes, kChunk));
  return Send(sock, "unmapped");
}

// ---- Cases.

TEST_CASE("CudaDevice is created without a driver, and FindDevice says why",
          "[cuda]") {
  Child child = Spawn([] {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> gpu, CudaDevice::Create());
    const absl::Status found = gpu->FindDevice(std::string(16, '\0')).status();
    if (absl::IsNotFound(found)) return absl::OkStatus();  // a GPU is here
    if (absl::IsFailedPrecondition(found) &&
        absl::StrContains(found.message(), "no usable CUDA driver or device")) {
      return absl::OkStatus();
    }
    return Annotate(found, "FindDevice");
  });
  const absl::Status status = Join(child);
  INFO(status);
  CHECK(status.ok());
}

TEST_CASE("CudaDevice::Map rejects malformed pieces before any CUDA call",
          "[cuda]") {
  std::unique_ptr<CudaDevice> gpu = *CudaDevice::Create();
  const PeerFdTaker no_fds = [](int) -> absl::StatusOr<UniqueFd> {
    return absl::InternalError("no fd should be taken");
  };
  const uint64_t mb = 1 << 20;
  const GpuHandleRef legacy{std::string(sizeof(cudaIpcMemHandle_t), 'h')};
  const GpuHandleRef fd{"", 7};
  const std::vector<std::vector<GpuPiece>> bad = {
      {},
      {{legacy, mb, 0, 0}},
      {{legacy, mb, 4096, mb}},
      {{{"short"}, mb, 0, 4096}},
      {{{"", -1}, mb, 0, 4096}},
      {{legacy, mb, 0, 4096}, {legacy, mb, 0, 4096}},
      {{legacy, mb, 0, mb}, {fd, mb, 0, 4096}},
      {{fd, mb, 0, 4096}, {fd, mb, 0, 4096}},  // a gap after the first
      {{fd, mb, 0, mb}, {fd, mb, 8, 64}},      // a gap before the second
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const absl::Status status = gpu->Map(0, bad[i], no_fds).status();
    INFO("case " << i << ": " << status);
    CHECK(absl::IsInvalidArgument(status));
  }
}

TEST_CASE(
    "CudaDevice::OpenEvent refuses IPC handle bytes and any fd but a "
    "one-page memfd sealed against shrinking, before any CUDA call",
    "[cuda]") {
  // In a child all the same: were a bad fd let through, the CUDA calls
  // after the check would spoil this process for the later cases' forks.
  Child child = Spawn([]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> gpu, CudaDevice::Create());
    const uint64_t page = ::sysconf(_SC_PAGESIZE);
    auto memfd = [&](uint64_t bytes, unsigned flags, int seals) {
      UniqueFd fd(::memfd_create("ckpt-test-event", MFD_CLOEXEC | flags));
      if (::ftruncate(fd.get(), bytes) != 0) fd.reset();
      if (seals != 0 && ::fcntl(fd.get(), F_ADD_SEALS, seals) != 0) fd.reset();
      return fd;
    };
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
    UniqueFd pipe_read(pipe_fds[0]);
    const UniqueFd pipe_write(pipe_fds[1]);
    const int shrink_grow = F_SEAL_SHRINK | F_SEAL_GROW;
    struct Bad {
      const char* what;
      UniqueFd fd;
    };
    Bad bad[] = {
        {"a pipe", std::move(pipe_read)},
        {"an unsealable memfd", memfd(page, 0, 0)},
        {"an unsealed memfd", memfd(page, MFD_ALLOW_SEALING, 0)},
        {"a memfd sealed against growing only",
         memfd(page, MFD_ALLOW_SEALING, F_SEAL_GROW)},
        {"a memfd of two pages",
         memfd(2 * page, MFD_ALLOW_SEALING, shrink_grow)},
        {"an empty memfd", memfd(0, MFD_ALLOW_SEALING, shrink_grow)},
    };
    for (Bad& b : bad) {
      if (!b.fd.valid())
        return absl::InternalError(absl::StrCat(b.what, ": setup"));
      const int peer_fd = b.fd.get() + 1000;  // as numbered in the trainer
      const PeerFdTaker take = [&](int fd) -> absl::StatusOr<UniqueFd> {
        if (fd != peer_fd) return absl::InternalError("took the wrong fd");
        return UniqueFd(::fcntl(b.fd.get(), F_DUPFD_CLOEXEC, 0));
      };
      const absl::Status s = gpu->OpenEvent(0, {"", peer_fd}, take).status();
      if (s.ok()) return absl::InternalError(absl::StrCat(b.what, " passed"));
      if (!absl::IsInvalidArgument(s)) return Annotate(s, b.what);
    }
    // What the trainer makes passes (the check refuses not everything).
    const UniqueFd good = memfd(page, MFD_ALLOW_SEALING, shrink_grow);
    RETURN_IF_ERROR(Annotate(cuda_internal::CheckEventPageFd(good.get()),
                             "a sealed one-page memfd"));
    const PeerFdTaker no_fds = [](int) -> absl::StatusOr<UniqueFd> {
      return absl::NotFoundError("no such fd in the trainer");
    };
    const absl::Status ipc =
        gpu->OpenEvent(0, {std::string(64, 'e')}, no_fds).status();
    if (!absl::IsInvalidArgument(ipc) ||
        !absl::StrContains(ipc.message(), "CUDA IPC events are not used")) {
      return Annotate(ipc, "IPC event handle bytes");
    }
    if (!absl::IsInvalidArgument(
            gpu->OpenEvent(0, {"", -1}, no_fds).status())) {
      return absl::InternalError("an event without an fd was accepted");
    }
    if (!absl::IsNotFound(gpu->OpenEvent(0, {"", 7}, no_fds).status())) {
      return absl::InternalError("the fd taker's error was not passed on");
    }
    return absl::OkStatus();
  });
  const absl::Status status = Join(child);
  INFO(status);
  CHECK(status.ok());
}

TEST_CASE(
    "Handles a trainer made up (IPC handle bytes, an fd that is no CUDA "
    "allocation) fail their mapping and leave the device usable for others",
    "[cuda]") {
  SKIP_WITHOUT_CUDA_DEVICE();
  Child child = Spawn([]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> gpu, CudaDevice::Create());
    const uint64_t mb = 2 << 20;
    std::string made_up(sizeof(cudaIpcMemHandle_t), '\0');
    for (size_t i = 0; i < made_up.size(); ++i) made_up[i] = static_cast<char>(i * 37 + 11);
    const PeerFdTaker no_fds = [](int) -> absl::StatusOr<UniqueFd> {
      return absl::InternalError("no fd should be taken");
    };
    if (gpu->Map(0, {{{made_up}, mb, 0, mb}}, no_fds).ok()) {
      return absl::InternalError("made-up IPC handle bytes were mapped");
    }
    const PeerFdTaker memfd = [](int) -> absl::StatusOr<UniqueFd> {
      UniqueFd fd(::memfd_create("ckpt-not-cuda", MFD_CLOEXEC));
      if (!fd.valid() || ::ftruncate(fd.get(), 2 << 20) != 0) {
        return ErrnoToStatus(errno, "memfd");
      }
      return fd;
    };
    if (gpu->Map(0, {{{"", 5}, mb, 0, mb}}, memfd).ok()) {
      return absl::InternalError("a plain memfd was imported as GPU memory");
    }
    // Not marked broken: a stream is made and its work completes.
    ASSIGN_OR_RETURN(std::unique_ptr<GpuStream> stream, gpu->CreateStream(0));
    ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> fence, stream->Fence());
    return Annotate(fence->Wait(absl::Seconds(30)), "after the refused mappings");
  });
  const absl::Status status = Join(child);
  INFO(status);
  CHECK(status.ok());
}

TEST_CASE(
    "A cudaMalloc region is copied out after the trainer's ready event, "
    "written back, and its IPC opening is shared, closed and reopened",
    "[cuda]") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const absl::Status status = RunPair(
      [](int sock) { return TrainerRoundTrip(Kind::kCudaMalloc, sock); },
      [](int sock, pid_t t) {
        return DaemonRoundTrip(Kind::kCudaMalloc, sock, t);
      });
  INFO(status);
  CHECK(status.ok());
}

TEST_CASE(
    "A region over two virtual-memory allocations maps as two fd pieces, "
    "copies both ways, and its memory returns when the mapping is dropped",
    "[cuda]") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const absl::Status status =
      RunPair([](int sock) { return TrainerRoundTrip(Kind::kVirtual, sock); },
              [](int sock, pid_t t) {
                return DaemonRoundTrip(Kind::kVirtual, sock, t);
              });
  INFO(status);
  CHECK(status.ok());
}

// The trainer's stream is held before its ready record, and the trainer is
// killed there: with CUDA IPC events the daemon's copy stream then hung for
// good. Here the daemon completes the dead trainer's records from the CPU.
TEST_CASE(
    "A copy stream waiting on the ready event of a trainer killed before its "
    "stream reached the record is released by CompleteThrough",
    "[cuda]") {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto trainer = [](int sock) -> absl::Status {
    RETURN_IF_ERROR(Cuda(cudaSetDevice(0), "cudaSetDevice"));
    VirtualMemory vmm;  // the daemon's import outlives us
    RETURN_IF_ERROR(vmm.Create({2}, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    const std::string data = Pattern(vmm.bytes(), 5);
    RETURN_IF_ERROR(
        Cuda(cudaMemcpy(reinterpret_cast<void*>(vmm.base()), data.data(),
                        data.size(), cudaMemcpyHostToDevice),
             "cudaMemcpy"));
    ASSIGN_OR_RETURN(auto gpu, CudaTrainerGpu::Create());
    ASSIGN_OR_RETURN(GpuRegionExport region,
                     gpu->Export(vmm.base(), vmm.bytes()));
    ASSIGN_OR_RETURN(GpuEventHandles events, gpu->Events(region.device_uuid));
    cudaStream_t stream = nullptr;
    RETURN_IF_ERROR(Cuda(
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
    ASSIGN_OR_RETURN(const int gate, HoldStream(stream));  // never released
    RETURN_IF_ERROR(gpu->RecordReady(region.device_uuid, stream));
    RETURN_IF_ERROR(
        Send(sock, ToWire(region.device_uuid, events, region.pieces)));
    (void)gate;
    return Expect(sock, "never");  // killed while waiting here
  };
  auto daemon = [](int sock, pid_t trainer) -> absl::Status {
    ASSIGN_OR_RETURN(std::string message, Recv(sock));
    const Wire wire = FromWire(message);
    const PeerFdTaker take_fd = PidfdTaker(trainer);
    ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> gpu, CudaDevice::Create());
    ASSIGN_OR_RETURN(const int device,
                     gpu->FindDevice(std::string(wire.uuid, 16)));
    ASSIGN_OR_RETURN(std::unique_ptr<GpuMapping> mapping,
                     gpu->Map(device, PiecesOf(wire), take_fd));
    ASSIGN_OR_RETURN(auto ready,
                     gpu->OpenEvent(device, {"", wire.ready_fd}, take_fd));
    ASSIGN_OR_RETURN(auto stream, gpu->CreateStream(device));
    const uint64_t length = mapping->length();
    const uint64_t host_bytes = (length + kChunk - 1) / kChunk * kChunk;
    std::unique_ptr<char[]> host(new char[host_bytes]());
    RETURN_IF_ERROR(gpu->RegisterHostMemory(host.get(), host_bytes, kChunk));

    ASSIGN_OR_RETURN(const uint64_t waited, stream->WaitEvent(*ready));
    RETURN_IF_ERROR(
        stream->CopyToHost(InChunks(mapping->address(), host.get(), length)));
    ASSIGN_OR_RETURN(std::unique_ptr<GpuFence> fence, stream->Fence());
    if (!absl::IsDeadlineExceeded(fence->Wait(absl::Milliseconds(200)))) {
      return absl::InternalError("the copies did not wait for ready");
    }
    RETURN_IF_ERROR(KillAndAwait(trainer));
    // Its death alone ends nothing: its record died with its context.
    if (!absl::IsDeadlineExceeded(fence->Wait(absl::Milliseconds(300)))) {
      return absl::InternalError("the wait ended without CompleteThrough");
    }
    RETURN_IF_ERROR(ready->CompleteThrough(waited));
    RETURN_IF_ERROR(Annotate(fence->Wait(absl::Seconds(5)),
                             "the copies after CompleteThrough"));
    if (std::string(host.get(), length) != Pattern(length, 5)) {
      return absl::InternalError("the copies read wrong bytes");
    }
    return gpu->UnregisterHostMemory(host.get(), host_bytes, kChunk);
  };
  const absl::Status status = RunPair(trainer, daemon, ChildEnd::kKilled);
  INFO(status);
  CHECK(status.ok());
}

}  // namespace
}  // namespace ckpt::cuda_testing

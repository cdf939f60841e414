// Tests of CudaTrainerGpu on a real GPU, in forked children
// (cuda_test_support.h says why).
#include "cuda/cuda_trainer_gpu.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_test_support.h"
#include "support/skip.h"

namespace ckpt::cuda_testing {
namespace {

TEST_CASE(
    "CudaTrainerGpu gives a re-mapped allocation a new id and refuses "
    "memory it cannot export",
    "[cuda]") {
  SKIP_WITHOUT_CUDA_DEVICE();
  Child child = Spawn([]() -> absl::Status {
    RETURN_IF_ERROR(Cuda(cudaSetDevice(0), "cudaSetDevice"));
    ASSIGN_OR_RETURN(auto gpu, CudaTrainerGpu::Create());
    VirtualMemory vmm;
    RETURN_IF_ERROR(
        vmm.Create({1, 2}, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    ASSIGN_OR_RETURN(GpuRegionExport region,
                     gpu->Export(vmm.base(), vmm.bytes()));
    ASSIGN_OR_RETURN(auto ids, gpu->AllocationIds(vmm.base(), vmm.bytes()));
    if (ids.size() != 2 || ids != region.allocation_ids || ids[0] == ids[1]) {
      return absl::InternalError("Export and AllocationIds disagree");
    }
    RETURN_IF_ERROR(vmm.Remap(1));
    ASSIGN_OR_RETURN(auto now, gpu->AllocationIds(vmm.base(), vmm.bytes()));
    if (now.size() != 2 || now[0] != ids[0] || now[1] == ids[1]) {
      return absl::InternalError("the re-mapped allocation kept its id");
    }
    VirtualMemory closed;
    RETURN_IF_ERROR(closed.Create({1}, CU_MEM_HANDLE_TYPE_NONE));
    const absl::Status refused = gpu->Export(closed.base(), 4096).status();
    if (!absl::IsFailedPrecondition(refused) ||
        !absl::StrContains(refused.message(), "requestedHandleTypes")) {
      return Annotate(refused, "Export without a POSIX-FD handle type");
    }
    char on_host[64];
    if (!absl::IsInvalidArgument(
            gpu->Export(reinterpret_cast<uint64_t>(on_host), 64).status())) {
      return absl::InternalError("Export accepted host memory");
    }
    return absl::OkStatus();
  });
  const absl::Status status = Join(child);
  INFO(status);
  CHECK(status.ok());
}

// The mirror of cuda_device_test's CompleteThrough case: the daemon is
// killed with copies and its staged record queued behind the trainer's
// ready, which the trainer holds back. With CUDA IPC events the trainer's
// stream waiting on staged then hung for good; SignalStaged must release
// it. The trainer is the parent here, so that it can kill the daemon.
TEST_CASE(
    "SignalStaged releases a trainer stream waiting on the staged event of a "
    "daemon killed after it enqueued its copies behind an unsatisfied wait",
    "[cuda]") {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto trainer = [](int sock, pid_t daemon) -> absl::Status {
    RETURN_IF_ERROR(AllowToTakeFds(daemon));
    RETURN_IF_ERROR(Cuda(cudaSetDevice(0), "cudaSetDevice"));
    VirtualMemory vmm;
    RETURN_IF_ERROR(vmm.Create({2}, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    ASSIGN_OR_RETURN(auto gpu, CudaTrainerGpu::Create());
    ASSIGN_OR_RETURN(GpuRegionExport region,
                     gpu->Export(vmm.base(), vmm.bytes()));
    const std::string& uuid = region.device_uuid;
    ASSIGN_OR_RETURN(GpuEventHandles events, gpu->Events(uuid));
    cudaStream_t held = nullptr, waiting = nullptr;
    cudaEvent_t passed = nullptr;
    RETURN_IF_ERROR(
        Cuda(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking), "s"));
    RETURN_IF_ERROR(
        Cuda(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking), "s"));
    RETURN_IF_ERROR(
        Cuda(cudaEventCreateWithFlags(&passed, cudaEventDisableTiming), "e"));
    ASSIGN_OR_RETURN(const int gate, HoldStream(held));
    RETURN_IF_ERROR(gpu->RecordReady(uuid, held));  // behind the gate
    RETURN_IF_ERROR(Send(sock, ToWire(uuid, events, region.pieces)));
    RETURN_IF_ERROR(Expect(sock, "staged recorded"));

    RETURN_IF_ERROR(gpu->WaitStaged(uuid, waiting));
    RETURN_IF_ERROR(Cuda(cudaEventRecord(passed, waiting), "cudaEventRecord"));
    absl::SleepFor(absl::Milliseconds(200));
    if (cudaEventQuery(passed) != cudaErrorNotReady) {
      return absl::InternalError("WaitStaged did not wait for the daemon");
    }
    RETURN_IF_ERROR(KillAndAwait(daemon));
    // Its death alone ends nothing: its record died with its context.
    absl::SleepFor(absl::Milliseconds(300));
    cudaError_t query = cudaEventQuery(passed);
    if (query != cudaErrorNotReady) {
      return Annotate(Cuda(query, "cudaEventQuery"),
                      "the wait ended without SignalStaged");
    }
    RETURN_IF_ERROR(gpu->SignalStaged(uuid));
    for (const absl::Time end = absl::Now() + absl::Seconds(5);
         query == cudaErrorNotReady && absl::Now() < end;) {
      absl::SleepFor(absl::Milliseconds(1));
      query = cudaEventQuery(passed);
    }
    (void)cudaGetLastError();
    RETURN_IF_ERROR(Release(gate));
    RETURN_IF_ERROR(Cuda(query, "the wait SignalStaged should release"));
    RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(held), "sync held"));
    return Cuda(cudaStreamSynchronize(waiting), "sync waiting");
  };
  auto daemon = [](int sock, pid_t trainer) -> absl::Status {
    ASSIGN_OR_RETURN(std::string message, Recv(sock));
    const Wire wire = FromWire(message);
    const PeerFdTaker take_fd = PidfdTaker(trainer);
    ASSIGN_OR_RETURN(auto gpu, CudaDevice::Create());
    ASSIGN_OR_RETURN(const int device,
                     gpu->FindDevice(std::string(wire.uuid, 16)));
    ASSIGN_OR_RETURN(auto mapping, gpu->Map(device, PiecesOf(wire), take_fd));
    ASSIGN_OR_RETURN(auto ready,
                     gpu->OpenEvent(device, {"", wire.ready_fd}, take_fd));
    ASSIGN_OR_RETURN(auto staged,
                     gpu->OpenEvent(device, {"", wire.staged_fd}, take_fd));
    ASSIGN_OR_RETURN(auto stream, gpu->CreateStream(device));
    const uint64_t length = mapping->length();
    const uint64_t host_bytes = (length + kChunk - 1) / kChunk * kChunk;
    std::unique_ptr<char[]> host(new char[host_bytes]);
    RETURN_IF_ERROR(gpu->RegisterHostMemory(host.get(), host_bytes, kChunk));
    RETURN_IF_ERROR(stream->WaitEvent(*ready).status());
    RETURN_IF_ERROR(
        stream->CopyToHost(InChunks(mapping->address(), host.get(), length)));
    RETURN_IF_ERROR(stream->RecordEvent(*staged));
    RETURN_IF_ERROR(Send(sock, "staged recorded"));
    return Expect(sock, "never");  // killed while waiting here
  };
  const absl::Status status = RunParentAndChild("trainer", trainer, "daemon",
                                                daemon, ChildEnd::kKilled);
  INFO(status);
  CHECK(status.ok());
}

}  // namespace
}  // namespace ckpt::cuda_testing

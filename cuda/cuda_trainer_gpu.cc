#include "cuda/cuda_trainer_gpu.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_event_page.h"

namespace ckpt {
namespace {

// A runtime error as a Status. A non-sticky error is also cleared from the
// runtime's per-thread last error: PyTorch checks cudaGetLastError() after
// its kernel launches and would blame them for our failure.
absl::Status Check(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  if (!IsStickyCudaError(error)) (void)cudaGetLastError();
  return CudaErrorToStatus(error, what);
}

// A driver error as a Status, naming the usual cause of the context errors:
// libckpt called before the trainer used CUDA.
absl::Status Check(CUresult result, absl::string_view what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  absl::Status status = CuResultToStatus(result, what);
  if (result == CUDA_ERROR_INVALID_CONTEXT ||
      result == CUDA_ERROR_NOT_INITIALIZED ||
      result == CUDA_ERROR_DEINITIALIZED) {
    return absl::FailedPreconditionError(absl::StrCat(
        status.message(),
        " (this thread has no CUDA context: initialize CUDA, e.g. allocate "
        "the tensors, before registering them)"));
  }
  return status;
}

// Check of driver results, for event pages.
cuda_internal::CuCheck DriverCheck() {
  return [](CUresult result, absl::string_view what) {
    return Check(result, what);
  };
}

// One physical allocation under a region.
struct AllocationSpan {
  // The allocation's mapping in this process. For cuMemMap'd memory
  // cuMemGetAddressRange returns the mapping of the one physical allocation
  // under the pointer, whereas CU_POINTER_ATTRIBUTE_RANGE_START_ADDR /
  // RANGE_SIZE return the whole cuMemAddressReserve range (cuda.h says so,
  // and an H100 with driver 580 agrees): the walk uses the former. The
  // driver maps allocations whole (cuMemMap of part of one is
  // CUDA_ERROR_NOT_SUPPORTED), so the mapping's size is the allocation's.
  CUdeviceptr base = 0;
  size_t bytes = 0;
  uint64_t offset = 0;  // the region's part: from base
  uint64_t length = 0;
  uint64_t buffer_id = 0;
  bool legacy = false;  // cudaMalloc memory: a cudaIpcMemHandle_t exports it
};

// cuPointerGetAttribute of an integer attribute. The driver writes 4 bytes
// for some (the booleans) and 8 for others; a zeroed uint64_t reads right
// either way on little-endian hosts.
absl::StatusOr<uint64_t> PointerAttribute(const CudaDriverApi& api,
                                          CUpointer_attribute attribute,
                                          CUdeviceptr p, const char* name) {
  uint64_t value = 0;
  CUresult result = api.cuPointerGetAttribute(&value, attribute, p);
  if (result == CUDA_ERROR_INVALID_VALUE) {
    return absl::InvalidArgumentError(
        absl::StrCat("address 0x", absl::Hex(p),
                     " is not in a CUDA allocation (", name, ")"));
  }
  RETURN_IF_ERROR(Check(result, absl::StrCat("cuPointerGetAttribute(", name,
                                             ") of 0x", absl::Hex(p))));
  return value;
}

// Calls `visit` for each allocation under [address, address + length), in
// address order. Only pointer queries: no handle, no fd.
absl::Status WalkAllocations(
    const CudaDriverApi& api, uint64_t address, uint64_t length,
    const std::function<absl::Status(const AllocationSpan&)>& visit) {
  const uint64_t end = address + length;
  for (uint64_t p = address; p < end;) {
    AllocationSpan span;
    ASSIGN_OR_RETURN(
        span.legacy,
        PointerAttribute(api, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                         p, "IS_LEGACY_CUDA_IPC_CAPABLE"));
    ASSIGN_OR_RETURN(
        span.buffer_id,
        PointerAttribute(api, CU_POINTER_ATTRIBUTE_BUFFER_ID, p, "BUFFER_ID"));
    RETURN_IF_ERROR(
        Check(api.cuMemGetAddressRange(&span.base, &span.bytes, p),
              absl::StrCat("cuMemGetAddressRange of 0x", absl::Hex(p))));
    const uint64_t allocation_end = span.base + span.bytes;
    if (span.base > p || allocation_end <= p) {
      return absl::InternalError(absl::StrCat(
          "cuMemGetAddressRange of 0x", absl::Hex(p), " returned [0x",
          absl::Hex(span.base), ", 0x", absl::Hex(allocation_end),
          "), which does not contain it"));
    }
    span.offset = p - span.base;
    span.length = std::min(end, allocation_end) - p;
    RETURN_IF_ERROR(visit(span));
    p += span.length;
  }
  return absl::OkStatus();
}

absl::Status CheckRange(uint64_t address, uint64_t length) {
  if (address == 0 || length == 0 || address + length < address) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a device region: address 0x", absl::Hex(address),
                     ", length ", length));
  }
  return absl::OkStatus();
}

absl::Status NotDeviceMemory(uint64_t address, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "address 0x", absl::Hex(address), " is not device memory (", what,
      "; managed and host memory cannot be shared with the daemon)"));
}

// The device of device memory at `address`; InvalidArgument for any other
// memory. The driver is asked first: cudaPointerGetAttributes, a runtime
// call, creates the primary context of the calling thread's current device
// before it answers, and on a thread that never chose one (ckptd.torch
// makes the save RPC from its own submit thread) that is device 0: about
// 500 MiB of GPU 0 taken by every rank of the node. The driver answers for
// unified addresses without a current context; where it wants one
// (CUDA_ERROR_INVALID_CONTEXT), the runtime call is the fallback.
absl::StatusOr<int> DeviceOf(const CudaDriverApi& api, uint64_t address) {
  const CUdeviceptr p = address;
  uint64_t type = 0;  // CUmemorytype, 4 bytes written
  const CUresult result =
      api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (result == CUDA_ERROR_INVALID_VALUE) {
    return NotDeviceMemory(address, "unknown to CUDA");
  }
  if (result == CUDA_SUCCESS) {
    ASSIGN_OR_RETURN(const uint64_t managed,
                     PointerAttribute(api, CU_POINTER_ATTRIBUTE_IS_MANAGED, p,
                                      "IS_MANAGED"));
    if (type != CU_MEMORYTYPE_DEVICE || managed != 0) {
      return NotDeviceMemory(address, absl::StrCat("CUmemorytype ", type,
                                                   managed != 0 ? ", managed" : ""));
    }
    ASSIGN_OR_RETURN(const uint64_t ordinal,
                     PointerAttribute(api, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                      p, "DEVICE_ORDINAL"));
    return static_cast<int>(ordinal);
  }
  if (result != CUDA_ERROR_INVALID_CONTEXT) {
    return Check(result, absl::StrCat("cuPointerGetAttribute(MEMORY_TYPE) of 0x",
                                      absl::Hex(address)));
  }
  cudaPointerAttributes attributes = {};
  RETURN_IF_ERROR(Check(
      cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(address)),
      absl::StrCat("cudaPointerGetAttributes of 0x", absl::Hex(address))));
  if (attributes.type != cudaMemoryTypeDevice) {
    return NotDeviceMemory(
        address, absl::StrCat("cudaMemoryType ", static_cast<int>(attributes.type)));
  }
  return attributes.device;
}

// A POSIX-FD shareable handle of the allocation mapped at `span`.
absl::StatusOr<UniqueFd> ExportFd(const CudaDriverApi& api,
                                  const AllocationSpan& span) {
  ASSIGN_OR_RETURN(
      uint64_t handle_types,
      PointerAttribute(api, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                       span.base, "ALLOWED_HANDLE_TYPES"));
  if ((handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the virtual-memory allocation at 0x", absl::Hex(span.base),
        " cannot be exported as a file descriptor: create it with "
        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in "
        "CUmemAllocationProp::requestedHandleTypes"));
  }
  CUmemGenericAllocationHandle handle = 0;
  RETURN_IF_ERROR(Check(
      api.cuMemRetainAllocationHandle(&handle,
                                      reinterpret_cast<void*>(span.base)),
      absl::StrCat("cuMemRetainAllocationHandle of 0x", absl::Hex(span.base))));
  int fd = -1;
  CUresult exported = api.cuMemExportToShareableHandle(
      &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  CUresult released = api.cuMemRelease(handle);  // the retain's reference
  UniqueFd owned(exported == CUDA_SUCCESS ? fd : -1);
  RETURN_IF_ERROR(Check(exported, "cuMemExportToShareableHandle"));
  RETURN_IF_ERROR(Check(released, "cuMemRelease"));
  return owned;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaTrainerGpu>> CudaTrainerGpu::Create() {
  return std::unique_ptr<CudaTrainerGpu>(new CudaTrainerGpu());
}

// The event pages unregister and unmap themselves once no stream of ours
// uses them (cuda_event_page.h); their memfds close.
CudaTrainerGpu::~CudaTrainerGpu() = default;

absl::StatusOr<GpuRegionExport> CudaTrainerGpu::Export(uint64_t address,
                                                       uint64_t length) {
  RETURN_IF_ERROR(CheckRange(address, length));
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  ASSIGN_OR_RETURN(int device, DeviceOf(*api, address));
  GpuRegionExport out;
  ASSIGN_OR_RETURN(out.device_uuid, DeviceUuid(device));
  ScopedCudaDevice guard(device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));

  RETURN_IF_ERROR(WalkAllocations(
      *api, address, length, [&](const AllocationSpan& span) -> absl::Status {
        GpuPiece piece;
        piece.allocation_bytes = span.bytes;
        piece.offset = span.offset;
        piece.length = span.length;
        if (span.legacy) {
          if (span.length != length) {
            return absl::InvalidArgumentError(absl::StrCat(
                "the region at 0x", absl::Hex(address), " (", length,
                " bytes) is not inside one cudaMalloc allocation: legacy CUDA "
                "IPC shares one allocation per region"));
          }
          cudaIpcMemHandle_t handle;
          RETURN_IF_ERROR(Check(
              cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(span.base)),
              "cudaIpcGetMemHandle"));
          piece.handle.ipc_handle.assign(reinterpret_cast<const char*>(&handle),
                                         sizeof(handle));
        } else {
          if (!out.pieces.empty() && !out.pieces[0].handle.ipc_handle.empty()) {
            return absl::InvalidArgumentError(
                "the region spans a cudaMalloc allocation and a "
                "virtual-memory one");
          }
          ASSIGN_OR_RETURN(UniqueFd fd, ExportFd(*api, span));
          piece.handle.peer_fd = fd.get();
          out.fds.push_back(std::move(fd));
        }
        out.pieces.push_back(std::move(piece));
        out.allocation_ids.push_back(span.buffer_id);
        return absl::OkStatus();
      }));
  return out;
}

absl::StatusOr<std::vector<uint64_t>> CudaTrainerGpu::AllocationIds(
    uint64_t address, uint64_t length) {
  RETURN_IF_ERROR(CheckRange(address, length));
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  ASSIGN_OR_RETURN(int device, DeviceOf(*api, address));
  ScopedCudaDevice guard(device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));
  std::vector<uint64_t> ids;
  RETURN_IF_ERROR(
      WalkAllocations(*api, address, length, [&](const AllocationSpan& span) {
        ids.push_back(span.buffer_id);
        return absl::OkStatus();
      }));
  return ids;
}

absl::StatusOr<GpuEventHandles> CudaTrainerGpu::Events(
    const std::string& device_uuid) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  return events->handles;
}

absl::Status CudaTrainerGpu::RecordReady(const std::string& device_uuid,
                                         GpuStreamHandle stream) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  ScopedCudaDevice guard(events->device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));
  return Annotate(events->ready->Record(static_cast<CUstream>(stream),
                                        events->device, DriverCheck()),
                  absl::StrCat("recording ready on device ", events->device));
}

absl::Status CudaTrainerGpu::WaitStaged(const std::string& device_uuid,
                                        GpuStreamHandle stream) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  ScopedCudaDevice guard(events->device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));
  return Annotate(
      events->staged->Wait(static_cast<CUstream>(stream), events->device,
                           DriverCheck()),
      absl::StrCat("waiting for staged on device ", events->device));
}

absl::Status CudaTrainerGpu::WaitStagedRecord(const std::string& device_uuid,
                                              GpuStreamHandle stream, uint64_t record) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  ScopedCudaDevice guard(events->device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));
  return Annotate(events->staged->WaitFor(static_cast<CUstream>(stream), events->device,
                                          DriverCheck(), static_cast<uint32_t>(record)),
                  absl::StrCat("waiting for staged record ", record, " on device ",
                               events->device));
}

absl::Status CudaTrainerGpu::SignalStaged(const std::string& device_uuid) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  events->staged->CompleteRecorded();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaTrainerGpu::ReserveRelay(const std::string& device_uuid) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  return events->relay->Reserve();
}

absl::Status CudaTrainerGpu::WaitRelay(const std::string& device_uuid, GpuStreamHandle stream,
                                       uint64_t record) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  ScopedCudaDevice guard(events->device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));
  return Annotate(events->relay->WaitFor(static_cast<CUstream>(stream), events->device,
                                         DriverCheck(), static_cast<uint32_t>(record)),
                  absl::StrCat("waiting for relay record ", record, " on device ",
                               events->device));
}

absl::Status CudaTrainerGpu::Relay(const std::string& device_uuid, uint64_t record,
                                   StagedWait after) {
  ASSIGN_OR_RETURN(const DeviceEvents* events, EventsFor(device_uuid));
  ScopedCudaDevice guard(events->device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));
  const CUstream stream = static_cast<CUstream>(events->relay_stream.get());
  return relay_order_.InOrder(device_uuid, record, [&]() -> absl::Status {
    absl::Status waited = absl::OkStatus();
    switch (after.kind) {
      case StagedWait::Kind::kRecord:
        waited = events->staged->WaitFor(stream, events->device, DriverCheck(),
                                         static_cast<uint32_t>(after.staged_record));
        break;
      case StagedWait::Kind::kLatest:
        waited = events->staged->Wait(stream, events->device, DriverCheck());
        break;
      case StagedWait::Kind::kNone:
        break;
    }
    RETURN_IF_ERROR(
        Annotate(waited, absl::StrCat("relaying staged on device ", events->device)));
    return Annotate(events->relay->RecordReserved(stream, events->device, DriverCheck(),
                                                  static_cast<uint32_t>(record)),
                    absl::StrCat("making relay record ", record, " on device ",
                                 events->device));
  });
}

bool CudaTrainerGpu::CompleteRelay(const std::string& device_uuid, uint64_t record) {
  absl::StatusOr<const DeviceEvents*> events = EventsFor(device_uuid);
  // No events: none was reserved, so none is owed.
  return !events.ok() || (*events)->relay->CompleteReserved(static_cast<uint32_t>(record));
}

CudaTrainerGpu::OwnedStream::~OwnedStream() {
  if (stream_ == nullptr) return;
  const cudaError_t error = cudaStreamDestroy(stream_);
  // At process exit the runtime may be unloaded first: the stream went with it.
  if (error != cudaSuccess && error != cudaErrorCudartUnloading) {
    std::fprintf(stderr, "libckpt: cudaStreamDestroy of the relay stream: %s\n",
                 cudaGetErrorString(error));
  }
}

absl::Status CudaTrainerGpu::OwnedStream::Create() {
  return Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags (relay stream)");
}

absl::StatusOr<std::string> CudaTrainerGpu::DeviceUuid(int device) {
  absl::MutexLock lock(&mu_);
  auto it = uuids_.find(device);
  if (it != uuids_.end()) return it->second;
  cudaDeviceProp prop;
  RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, device),
                        absl::StrCat("cudaGetDeviceProperties(", device, ")")));
  std::string uuid(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  uuids_.emplace(device, uuid);
  return uuid;
}

absl::StatusOr<const CudaTrainerGpu::DeviceEvents*> CudaTrainerGpu::EventsFor(
    const std::string& uuid) {
  {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(uuid);
    if (it != events_.end()) return &it->second;
  }
  int count = 0;
  RETURN_IF_ERROR(Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  int device = -1;
  for (int i = 0; i < count && device < 0; ++i) {
    ASSIGN_OR_RETURN(std::string candidate, DeviceUuid(i));
    if (candidate == uuid) device = i;
  }
  if (device < 0) {
    return absl::NotFoundError(
        absl::StrCat("no CUDA device with the requested uuid among the ", count,
                     " this process sees"));
  }

  absl::MutexLock lock(&mu_);
  auto it = events_.find(uuid);  // another thread may have won the race
  if (it != events_.end()) return &it->second;
  ScopedCudaDevice guard(device);
  RETURN_IF_ERROR(Check(guard.error(), "cudaSetDevice"));
  DeviceEvents events;
  events.device = device;
  for (auto [page, ref] : {std::pair(&events.ready, &events.handles.ready),
                           std::pair(&events.staged, &events.handles.staged)}) {
    absl::StatusOr<std::unique_ptr<cuda_internal::EventPage>> created =
        cuda_internal::EventPage::Create(device, DriverCheck());
    if (!created.ok()) {
      return Annotate(
          created.status(),
          absl::StrCat("creating an event page on device ", device));
    }
    *page = *std::move(created);
    ref->peer_fd = (*page)->fd();
  }
  absl::StatusOr<std::unique_ptr<cuda_internal::EventPage>> relay =
      cuda_internal::EventPage::Create(device, DriverCheck());
  if (!relay.ok()) {
    return Annotate(relay.status(), absl::StrCat("creating the relay page on device ", device));
  }
  events.relay = *std::move(relay);
  RETURN_IF_ERROR(Annotate(events.relay_stream.Create(), absl::StrCat("on device ", device)));
  return &events_.emplace(uuid, std::move(events)).first->second;
}

}  // namespace ckpt

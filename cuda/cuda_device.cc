#include "cuda/cuda_device.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "cuda/cuda_device_state.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_event_page.h"
#include "cuda/cuda_stream.h"

namespace ckpt {
namespace {

using cuda_internal::CudaEvent;
using cuda_internal::CudaStream;
using cuda_internal::DeviceState;

// A legacy handle's allocation, opened through the refcounted table.
class IpcMapping final : public GpuMapping {
 public:
  IpcMapping(std::shared_ptr<DeviceState> state, int device, std::string handle,
             uint64_t address, uint64_t length)
      : state_(std::move(state)),
        device_(device),
        handle_(std::move(handle)),
        address_(address),
        length_(length) {}
  ~IpcMapping() override { state_->CloseIpcMemory(device_, handle_); }

  uint64_t address() const override { return address_; }
  uint64_t length() const override { return length_; }

 private:
  const std::shared_ptr<DeviceState> state_;
  const int device_;
  const std::string handle_;
  const uint64_t address_;
  const uint64_t length_;
};

// Imported virtual-memory allocations mapped back to back in one VA
// reservation. Built step by step by Build(); the destructor undoes exactly
// the steps that succeeded, so a failed Build leaks nothing.
class VmmMapping final : public GpuMapping {
 public:
  VmmMapping(std::shared_ptr<DeviceState> state, const CudaDriverApi* api,
             int device)
      : state_(std::move(state)), api_(api), device_(device) {}

  ~VmmMapping() override {
    // A Build that failed before importing anything left nothing to undo:
    // do not touch the device (it may be the reason Build failed).
    if (imports_.empty() && reserved_ == 0) return;
    ScopedCudaDevice guard(device_);
    if (guard.error() != cudaSuccess) {
      // The driver calls below act on the thread's current context: in
      // another device's they would fail at best, and at worst unmap a
      // range of that context. Leaking the mapping (and keeping the
      // trainer's allocations alive) is the lesser harm.
      if (guard.error() == cudaErrorCudartUnloading) {
        // Process exit: the runtime went first and takes the mappings along.
        (void)cudaGetLastError();
        return;
      }
      // Through Check, so that a sticky error marks the device broken.
      absl::Status status = state_->SetDevice(guard, device_);
      LogError("leaking a mapping of ", imports_.size(),
               " imported allocations on device ", device_,
               " (not unmapped or released): ", status.message());
      return;
    }
    for (const Import& import : imports_) {
      if (import.mapped_at == 0) continue;
      Warn(api_->cuMemUnmap(import.mapped_at, import.bytes), "cuMemUnmap");
    }
    if (reserved_ != 0) {
      Warn(api_->cuMemAddressFree(reserved_, reserved_bytes_),
           "cuMemAddressFree");
    }
    for (const Import& import : imports_) {
      Warn(api_->cuMemRelease(import.handle), "cuMemRelease");
    }
  }

  absl::Status Build(absl::Span<const GpuPiece> pieces,
                     const PeerFdTaker& take_fd) {
    ScopedCudaDevice guard(device_);
    RETURN_IF_ERROR(state_->SetDevice(guard, device_));
    for (size_t i = 0; i < pieces.size(); ++i) {
      const GpuPiece& piece = pieces[i];
      absl::StatusOr<UniqueFd> fd = take_fd(piece.handle.peer_fd);
      if (!fd.ok()) {
        return Annotate(
            fd.status(),
            absl::StrCat("taking fd ", piece.handle.peer_fd, " of piece ", i));
      }
      CUmemGenericAllocationHandle handle = 0;
      RETURN_IF_ERROR(state_->CheckPeerInput(
          device_,
          api_->cuMemImportFromShareableHandle(
              &handle,
              reinterpret_cast<void*>(static_cast<uintptr_t>(fd->get())),
              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          absl::StrCat("cuMemImportFromShareableHandle of piece ", i)));
      // The handle holds the allocation now; the fd closes here.
      imports_.push_back(Import{handle, 0, piece.allocation_bytes});
    }

    // The exporter's location id is its own ordinal: ask for ours.
    CUmemAllocationProp prop = {};
    RETURN_IF_ERROR(state_->CheckPeerInput(
        device_,
        api_->cuMemGetAllocationPropertiesFromHandle(&prop, imports_[0].handle),
        "cuMemGetAllocationPropertiesFromHandle"));
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    size_t granularity = 0;
    RETURN_IF_ERROR(state_->CheckPeerInput(
        device_,
        api_->cuMemGetAllocationGranularity(&granularity, &prop,
                                            CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity"));
    if (granularity == 0) granularity = 1;
    uint64_t total = 0;
    for (size_t i = 0; i < imports_.size(); ++i) {
      if (imports_[i].bytes % granularity != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "piece ", i, ": allocation_bytes ", imports_[i].bytes,
            " is not a multiple of the allocation granularity ", granularity));
      }
      total += imports_[i].bytes;
    }

    RETURN_IF_ERROR(state_->CheckPeerInput(
        device_,
        api_->cuMemAddressReserve(&reserved_, total, granularity, 0, 0),
        absl::StrCat("cuMemAddressReserve of ", total, " bytes")));
    reserved_bytes_ = total;
    CUdeviceptr at = reserved_;
    for (size_t i = 0; i < imports_.size(); ++i) {
      // A mapping covers a whole allocation (the driver maps no part of
      // one), so allocation_bytes must be the allocation's true size.
      RETURN_IF_ERROR(state_->CheckPeerInput(
          device_,
          api_->cuMemMap(at, imports_[i].bytes, 0, imports_[i].handle, 0),
          absl::StrCat("cuMemMap of piece ", i, " (", imports_[i].bytes,
                       " bytes; is allocation_bytes its true size?)")));
      imports_[i].mapped_at = at;
      at += imports_[i].bytes;
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    RETURN_IF_ERROR(state_->CheckPeerInput(
        device_, api_->cuMemSetAccess(reserved_, total, &access, 1),
        "cuMemSetAccess"));

    address_ = reserved_ + pieces.front().offset;
    for (const GpuPiece& piece : pieces) length_ += piece.length;
    return absl::OkStatus();
  }

  uint64_t address() const override { return address_; }
  uint64_t length() const override { return length_; }

 private:
  struct Import {
    CUmemGenericAllocationHandle handle;
    CUdeviceptr mapped_at;  // 0 until mapped
    uint64_t bytes;
  };

  void Warn(CUresult result, absl::string_view what) {
    absl::Status status = state_->Check(device_, result, what);
    if (!status.ok()) LogWarning(status.message());
  }

  const std::shared_ptr<DeviceState> state_;
  const CudaDriverApi* const api_;
  const int device_;
  std::vector<Import> imports_;
  CUdeviceptr reserved_ = 0;
  uint64_t reserved_bytes_ = 0;
  uint64_t address_ = 0;
  uint64_t length_ = 0;
};

// InvalidArgument unless `pieces` are one legacy piece, or POSIX-FD pieces
// that cover a contiguous region.
absl::Status ValidatePieces(absl::Span<const GpuPiece> pieces) {
  if (pieces.empty()) {
    return absl::InvalidArgumentError("a region needs at least one piece");
  }
  const bool legacy = !pieces[0].handle.ipc_handle.empty();
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const GpuPiece& piece = pieces[i];
    const std::string where = absl::StrCat("piece ", i, " of ", pieces.size());
    const bool piece_legacy = !piece.handle.ipc_handle.empty();
    if (!piece_legacy && piece.handle.peer_fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has neither IPC handle bytes nor an fd"));
    }
    if (piece_legacy != legacy) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " mixes legacy IPC handles and fds in one region"));
    }
    if (piece.length == 0 || piece.allocation_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has a zero length or allocation size"));
    }
    if (piece.offset >= piece.allocation_bytes ||
        piece.length > piece.allocation_bytes - piece.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": offset ", piece.offset, " + length ", piece.length,
          " runs past the allocation's ", piece.allocation_bytes, " bytes"));
    }
    if (piece.allocation_bytes > UINT64_MAX / 2 - total) {
      return absl::InvalidArgumentError("the pieces' sizes overflow");
    }
    total += piece.allocation_bytes;
    if (legacy) continue;
    if (i > 0 && piece.offset != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " starts at offset ", piece.offset,
                       ", not 0: the region is not contiguous"));
    }
    if (i + 1 < pieces.size() &&
        piece.offset + piece.length != piece.allocation_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       " ends before its allocation does: the region is not "
                       "contiguous"));
    }
  }
  if (legacy && pieces.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a legacy IPC region has exactly one piece, not ", pieces.size()));
  }
  if (legacy &&
      pieces[0].handle.ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a legacy IPC memory handle has ", sizeof(cudaIpcMemHandle_t),
        " bytes, not ", pieces[0].handle.ipc_handle.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create() {
  return std::unique_ptr<CudaDevice>(
      new CudaDevice(std::make_shared<cuda_internal::DeviceState>()));
}

CudaDevice::CudaDevice(std::shared_ptr<cuda_internal::DeviceState> state)
    : state_(std::move(state)) {}

CudaDevice::~CudaDevice() = default;

absl::StatusOr<int> CudaDevice::FindDevice(const std::string& uuid) {
  return state_->FindDevice(uuid);
}

absl::StatusOr<std::unique_ptr<GpuMapping>> CudaDevice::Map(
    int device, absl::Span<const GpuPiece> pieces, const PeerFdTaker& take_fd) {
  RETURN_IF_ERROR(ValidatePieces(pieces));
  RETURN_IF_ERROR(state_->CheckDevice(device));
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());

  if (pieces[0].handle.ipc_handle.empty()) {
    auto mapping = std::make_unique<VmmMapping>(state_, api, device);
    RETURN_IF_ERROR(mapping->Build(pieces, take_fd));
    return mapping;
  }

  const GpuPiece& piece = pieces[0];
  ASSIGN_OR_RETURN(void* base,
                   state_->OpenIpcMemory(device, piece.handle.ipc_handle));
  auto mapping = std::make_unique<IpcMapping>(
      state_, device, piece.handle.ipc_handle,
      reinterpret_cast<uint64_t>(base) + piece.offset, piece.length);
  // The trainer's allocation_bytes is only a claim: a region past the real
  // allocation would make the copies fault, and a fault is sticky.
  CUdeviceptr opened_base = 0;
  size_t opened_bytes = 0;
  {
    ScopedCudaDevice guard(device);
    RETURN_IF_ERROR(state_->SetDevice(guard, device));
    RETURN_IF_ERROR(state_->Check(
        device,
        api->cuMemGetAddressRange(&opened_base, &opened_bytes,
                                  reinterpret_cast<CUdeviceptr>(base)),
        "cuMemGetAddressRange of an opened IPC handle"));
  }
  if (piece.offset + piece.length > opened_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the region (offset ", piece.offset, ", length ", piece.length,
        ") runs past its allocation's ", opened_bytes, " bytes"));
  }
  return mapping;
}

absl::StatusOr<std::unique_ptr<GpuEvent>> CudaDevice::OpenEvent(
    int device, const GpuHandleRef& handle, const PeerFdTaker& take_fd) {
  if (!handle.ipc_handle.empty()) {
    return absl::InvalidArgumentError(
        "CUDA IPC events are not used: events are host-memory semaphores "
        "(send the fd of the event's page)");
  }
  if (handle.peer_fd < 0) {
    return absl::InvalidArgumentError("an event needs the fd of its page");
  }
  absl::StatusOr<UniqueFd> fd = take_fd(handle.peer_fd);
  if (!fd.ok()) {
    return Annotate(fd.status(),
                    absl::StrCat("taking event fd ", handle.peer_fd));
  }
  // Before any CUDA call: what the peer sent is checked first.
  RETURN_IF_ERROR(Annotate(cuda_internal::CheckEventPageFd(fd->get()),
                           absl::StrCat("event fd ", handle.peer_fd)));
  RETURN_IF_ERROR(state_->CheckDevice(device));
  ScopedCudaDevice guard(device);
  RETURN_IF_ERROR(state_->SetDevice(guard, device));
  DeviceState* state = state_.get();
  ASSIGN_OR_RETURN(
      std::unique_ptr<cuda_internal::EventPage> page,
      cuda_internal::EventPage::Open(
          *std::move(fd), device,
          [state, device](CUresult result, absl::string_view what) {
            return state->CheckPeerInput(device, result, what);
          }));
  return std::make_unique<CudaEvent>(state_, device, std::move(page));
}

absl::StatusOr<std::unique_ptr<GpuStream>> CudaDevice::CreateStream(
    int device) {
  RETURN_IF_ERROR(state_->CheckDevice(device));
  ScopedCudaDevice guard(device);
  RETURN_IF_ERROR(state_->SetDevice(guard, device));
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(state_->Check(
      device, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags"));
  return std::make_unique<CudaStream>(state_, device, stream);
}

absl::Status CudaDevice::RegisterHostMemory(char* data, uint64_t length,
                                            uint64_t chunk_bytes) {
  if (data == nullptr || length == 0 || chunk_bytes == 0) {
    return absl::InvalidArgumentError(
        "host memory to register needs an address, a length and a chunk "
        "size");
  }
  // Registered in the current device's context; Portable makes the pages
  // pinned for every context of the process.
  int device = 0;
  RETURN_IF_ERROR(state_->Check(0, cudaGetDevice(&device), "cudaGetDevice"));
  RETURN_IF_ERROR(state_->CheckDevice(device));
  for (uint64_t done = 0; done < length;) {
    const uint64_t bytes = std::min(chunk_bytes, length - done);
    absl::Status status = state_->Check(
        device, cudaHostRegister(data + done, bytes, cudaHostRegisterPortable),
        absl::StrCat("cudaHostRegister of ", bytes, " bytes at offset ", done));
    if (!status.ok()) {
      if (done > 0) {
        absl::Status undo = UnregisterHostMemory(data, done, chunk_bytes);
        if (!undo.ok()) LogWarning(undo.message());
      }
      return status;
    }
    done += bytes;
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::UnregisterHostMemory(char* data, uint64_t length,
                                              uint64_t chunk_bytes) {
  if (data == nullptr || length == 0 || chunk_bytes == 0) {
    return absl::InvalidArgumentError(
        "host memory to unregister needs an address, a length and a chunk "
        "size");
  }
  int device = 0;
  RETURN_IF_ERROR(state_->Check(0, cudaGetDevice(&device), "cudaGetDevice"));
  absl::Status first_error;
  for (uint64_t done = 0; done < length;) {
    const uint64_t bytes = std::min(chunk_bytes, length - done);
    absl::Status status =
        state_->Check(device, cudaHostUnregister(data + done),
                      absl::StrCat("cudaHostUnregister at offset ", done));
    if (first_error.ok()) first_error = status;
    done += bytes;
  }
  return first_error;
}

}  // namespace ckpt

#include "cuda/cuda_device_state.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt::cuda_internal {
namespace {

constexpr size_t kUuidBytes = 16;

// "GPU-82f9189d-620f-a1a7-b51b-9c01914963e5", as nvidia-smi -L prints it.
std::string FormatUuid(const std::string& uuid) {
  std::string out = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(
        &out, absl::Hex(static_cast<unsigned char>(uuid[i]), absl::kZeroPad2));
  }
  return out;
}

absl::Status BrokenError(int device, absl::string_view cause) {
  return absl::FailedPreconditionError(
      absl::StrCat("device ", device, " hit a sticky CUDA error (", cause,
                   "); its context cannot be used again: restart ckptd"));
}

absl::Status NoUsableDevice(const absl::Status& cause) {
  return absl::FailedPreconditionError(
      absl::StrCat("no usable CUDA driver or device: ", cause.message()));
}

}  // namespace

absl::StatusOr<int> DeviceState::FindDevice(const std::string& uuid) {
  if (uuid.size() != kUuidBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a device uuid has 16 bytes, not ", uuid.size()));
  }
  int found = -1;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(EnumerateLocked());
    for (size_t i = 0; i < uuids_.size(); ++i) {
      if (uuids_[i] == uuid) found = static_cast<int>(i);
    }
    if (found < 0) {
      return absl::NotFoundError(absl::StrCat(
          "no CUDA device ", FormatUuid(uuid), " among the ", uuids_.size(),
          " this process sees (is it hidden by CUDA_VISIBLE_DEVICES?)"));
    }
  }
  RETURN_IF_ERROR(CheckDevice(found));
  return found;
}

absl::Status DeviceState::CheckDevice(int device) {
  int count = device_count_.load(std::memory_order_acquire);
  if (count < 0) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(EnumerateLocked());
    count = static_cast<int>(uuids_.size());
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device,
                     " does not exist (this process sees ", count, ")"));
  }
  if (broken_count_.load(std::memory_order_acquire) == 0) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  auto it = broken_.find(device);
  if (it == broken_.end()) return absl::OkStatus();
  return BrokenError(device, it->second);
}

absl::Status DeviceState::Check(int device, cudaError_t error,
                                absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  absl::Status status =
      CudaErrorToStatus(error, absl::StrCat(what, " on device ", device));
  if (IsStickyCudaError(error)) return MarkBroken(device, status);
  (void)cudaGetLastError();
  return status;
}

absl::Status DeviceState::Check(int device, CUresult result,
                                absl::string_view what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  absl::Status status =
      CuResultToStatus(result, absl::StrCat(what, " on device ", device));
  if (IsStickyCuResult(result)) return MarkBroken(device, status);
  return status;
}

absl::Status DeviceState::CheckPeerInput(int device, cudaError_t error,
                                         absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaErrorToStatus(error, absl::StrCat(what, " on device ", device));
}

absl::Status DeviceState::CheckPeerInput(int device, CUresult result,
                                         absl::string_view what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return CuResultToStatus(result, absl::StrCat(what, " on device ", device));
}

absl::StatusOr<void*> DeviceState::OpenIpcMemory(int device,
                                                 const std::string& handle) {
  // The device switch comes before ipc_mu_: the first one on a device
  // creates its primary context (hundreds of milliseconds), and no other
  // session's open or close should wait for that. The guard is the calling
  // thread's alone and is restored after the lock is released.
  ScopedCudaDevice guard(device);
  RETURN_IF_ERROR(SetDevice(guard, device));
  absl::MutexLock lock(&ipc_mu_);
  auto key = std::make_pair(device, handle);
  auto it = ipc_.find(key);
  if (it != ipc_.end()) {
    ++it->second.users;
    return it->second.base;
  }
  // Opened under ipc_mu_: a second cudaIpcOpenMemHandle of the handle in
  // this context would fail, so the lookup, the open and the insert are one
  // step (and a close in progress finishes before the handle is reopened).
  cudaIpcMemHandle_t ipc_handle;
  std::memcpy(&ipc_handle, handle.data(), sizeof(ipc_handle));
  void* base = nullptr;
  RETURN_IF_ERROR(CheckPeerInput(
      device,
      cudaIpcOpenMemHandle(&base, ipc_handle, cudaIpcMemLazyEnablePeerAccess),
      "cudaIpcOpenMemHandle"));
  ipc_.emplace(std::move(key), IpcOpening{base, 1});
  return base;
}

void DeviceState::CloseIpcMemory(int device, const std::string& handle) {
  absl::MutexLock lock(&ipc_mu_);
  auto it = ipc_.find(std::make_pair(device, handle));
  if (it == ipc_.end() || --it->second.users > 0) return;
  void* base = it->second.base;
  ipc_.erase(it);
  // Still under ipc_mu_, so that no open of the same handle runs before the
  // close is done. The switch is cheap here: the open made the context.
  ScopedCudaDevice guard(device);
  absl::Status status = SetDevice(guard, device);
  if (status.ok()) {
    status =
        Check(device, cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  }
  if (!status.ok()) LogWarning(status.message());
}

absl::Status DeviceState::MarkBroken(int device, const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = broken_.emplace(device, std::string(cause.message()));
  if (inserted) {
    broken_count_.fetch_add(1, std::memory_order_release);
    LogError(BrokenError(device, it->second).message());
  }
  return BrokenError(device, it->second);
}

absl::Status DeviceState::EnumerateLocked() {
  if (enumerated_) return enumeration_;
  enumerated_ = true;
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    enumeration_ =
        NoUsableDevice(CudaErrorToStatus(error, "cudaGetDeviceCount"));
  } else if (count == 0) {
    enumeration_ = NoUsableDevice(
        absl::NotFoundError("cudaGetDeviceCount found no device"));
  }
  for (int i = 0; enumeration_.ok() && i < count; ++i) {
    cudaDeviceProp prop;
    error = cudaGetDeviceProperties(&prop, i);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      enumeration_ = NoUsableDevice(CudaErrorToStatus(
          error, absl::StrCat("cudaGetDeviceProperties(", i, ")")));
      break;
    }
    static_assert(sizeof(prop.uuid.bytes) == kUuidBytes);
    uuids_.emplace_back(prop.uuid.bytes, kUuidBytes);
  }
  if (!enumeration_.ok()) {
    uuids_.clear();
    LogWarning(enumeration_.message());
    return enumeration_;
  }
  device_count_.store(count, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace ckpt::cuda_internal

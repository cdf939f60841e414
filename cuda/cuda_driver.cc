#include "cuda/cuda_driver.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

struct LoadedDriver {
  absl::Status status;
  CudaDriverApi api;
};

template <typename Fn>
absl::Status LookUp(const char* symbol, Fn* fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t error = cudaGetDriverEntryPointByVersion(
      symbol, &address, kCudaDriverApiVersion, cudaEnableDefault, &found);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA driver: ",
        CudaErrorToStatus(error, absl::StrCat("looking up ", symbol))
            .message()));
  }
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA driver: it lacks ", symbol, " at CUDA ",
        kCudaDriverApiVersion / 1000, ".", kCudaDriverApiVersion % 1000 / 10,
        found == cudaDriverEntryPointVersionNotSufficent
            ? " (the driver is older than that)"
            : ""));
  }
  *fn = reinterpret_cast<Fn>(address);
  return absl::OkStatus();
}

absl::Status LoadAll(CudaDriverApi& d) {
  RETURN_IF_ERROR(LookUp("cuGetErrorName", &d.cuGetErrorName));
  RETURN_IF_ERROR(LookUp("cuGetErrorString", &d.cuGetErrorString));
  RETURN_IF_ERROR(LookUp("cuDeviceGet", &d.cuDeviceGet));
  RETURN_IF_ERROR(
      LookUp("cuDevicePrimaryCtxGetState", &d.cuDevicePrimaryCtxGetState));
  RETURN_IF_ERROR(LookUp("cuMemGetAddressRange", &d.cuMemGetAddressRange));
  RETURN_IF_ERROR(LookUp("cuPointerGetAttribute", &d.cuPointerGetAttribute));
  RETURN_IF_ERROR(
      LookUp("cuMemRetainAllocationHandle", &d.cuMemRetainAllocationHandle));
  RETURN_IF_ERROR(LookUp("cuMemRelease", &d.cuMemRelease));
  RETURN_IF_ERROR(
      LookUp("cuMemExportToShareableHandle", &d.cuMemExportToShareableHandle));
  RETURN_IF_ERROR(LookUp("cuMemImportFromShareableHandle",
                         &d.cuMemImportFromShareableHandle));
  RETURN_IF_ERROR(LookUp("cuMemGetAllocationPropertiesFromHandle",
                         &d.cuMemGetAllocationPropertiesFromHandle));
  RETURN_IF_ERROR(LookUp("cuMemGetAllocationGranularity",
                         &d.cuMemGetAllocationGranularity));
  RETURN_IF_ERROR(LookUp("cuMemAddressReserve", &d.cuMemAddressReserve));
  RETURN_IF_ERROR(LookUp("cuMemAddressFree", &d.cuMemAddressFree));
  RETURN_IF_ERROR(LookUp("cuMemMap", &d.cuMemMap));
  RETURN_IF_ERROR(LookUp("cuMemUnmap", &d.cuMemUnmap));
  RETURN_IF_ERROR(LookUp("cuMemSetAccess", &d.cuMemSetAccess));
  RETURN_IF_ERROR(LookUp("cuMemCreate", &d.cuMemCreate));
  RETURN_IF_ERROR(LookUp("cuDeviceGetAttribute", &d.cuDeviceGetAttribute));
  RETURN_IF_ERROR(LookUp("cuMemHostRegister", &d.cuMemHostRegister));
  RETURN_IF_ERROR(LookUp("cuMemHostUnregister", &d.cuMemHostUnregister));
  RETURN_IF_ERROR(
      LookUp("cuMemHostGetDevicePointer", &d.cuMemHostGetDevicePointer));
  RETURN_IF_ERROR(LookUp("cuStreamWaitValue32", &d.cuStreamWaitValue32));
  RETURN_IF_ERROR(LookUp("cuStreamWriteValue32", &d.cuStreamWriteValue32));
  RETURN_IF_ERROR(LookUp("cuEventCreate", &d.cuEventCreate));
  RETURN_IF_ERROR(LookUp("cuEventRecord", &d.cuEventRecord));
  RETURN_IF_ERROR(LookUp("cuEventQuery", &d.cuEventQuery));
  RETURN_IF_ERROR(LookUp("cuEventDestroy", &d.cuEventDestroy));
  return absl::OkStatus();
}

// Loaded once, on first use, by whichever thread gets here first (a
// function-local static: C++ makes its initialisation thread-safe). Never
// destroyed, so that destructors of static objects may still use it.
const LoadedDriver& Loaded() {
  static const LoadedDriver* const loaded = [] {
    auto* driver = new LoadedDriver;
    driver->status = LoadAll(driver->api);
    if (!driver->status.ok()) LogWarning(driver->status.message());
    return driver;
  }();
  return *loaded;
}

// The table, or null where there is no usable driver.
const CudaDriverApi* LoadedOrNull() {
  const LoadedDriver& driver = Loaded();
  return driver.status.ok() ? &driver.api : nullptr;
}

absl::StatusCode CodeFor(int error) {
  // cudaError_t and CUresult share the numbers of these errors.
  switch (error) {
    case cudaErrorMemoryAllocation:  // == CUDA_ERROR_OUT_OF_MEMORY
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:  // == CUDA_ERROR_INVALID_HANDLE
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorInitializationError:  // == CUDA_ERROR_NOT_INITIALIZED
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorStubLibrary:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
    case cudaErrorDeviceUninitialized:  // == CUDA_ERROR_INVALID_CONTEXT
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorNotReady:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::StatusOr<const CudaDriverApi*> CudaDriver() {
  const LoadedDriver& driver = Loaded();
  if (!driver.status.ok()) return driver.status;
  return &driver.api;
}

absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view context) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::Status(CodeFor(error),
                      absl::StrCat(context, ": ", cudaGetErrorName(error), ": ",
                                   cudaGetErrorString(error)));
}

absl::Status CuResultToStatus(CUresult result, absl::string_view context) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = result == CUDA_ERROR_NOT_FOUND
                              ? absl::StatusCode::kNotFound
                              : CodeFor(static_cast<int>(result));
  const char* name = nullptr;
  const char* text = nullptr;
  if (const CudaDriverApi* api = LoadedOrNull()) {
    if (api->cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (api->cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  }
  if (name == nullptr) {
    return absl::Status(
        code, absl::StrCat(context, ": CUresult ", static_cast<int>(result)));
  }
  return absl::Status(code, absl::StrCat(context, ": ", name, ": ",
                                         text != nullptr ? text : "?"));
}

bool IsStickyCudaError(cudaError_t error) {
  switch (error) {
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

bool IsStickyCuResult(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
    case CUDA_ERROR_UNKNOWN:
      return true;
    default:
      return false;
  }
}

ScopedCudaDevice::ScopedCudaDevice(int device) {
  int current = -1;
  error_ = cudaGetDevice(&current);
  if (error_ != cudaSuccess) return;
  // Even when `device` is current already: cudaGetDevice does not bind its
  // context to this thread, and driver calls need it bound.
  error_ = cudaSetDevice(device);
  if (error_ == cudaSuccess && current != device) previous_ = current;
}

ScopedCudaDevice::~ScopedCudaDevice() {
  if (previous_ < 0) return;
  // cudaSetDevice creates the primary context of the device it selects:
  // restore only a device whose context already exists.
  if (const CudaDriverApi* api = LoadedOrNull()) {
    CUdevice device = 0;
    unsigned int flags = 0;
    int active = 0;
    if (api->cuDeviceGet(&device, previous_) == CUDA_SUCCESS &&
        api->cuDevicePrimaryCtxGetState(device, &flags, &active) ==
            CUDA_SUCCESS &&
        !active) {
      return;
    }
  }
  cudaError_t error = cudaSetDevice(previous_);
  if (error != cudaSuccess) {
    LogWarning(CudaErrorToStatus(
                   error, absl::StrCat("restoring current device ", previous_))
                   .message());
  }
}

}  // namespace ckpt

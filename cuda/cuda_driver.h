// The CUDA driver entry points ckptd calls, CUDA results as Status, and a
// device guard.
//
// Nothing links libcuda: the static runtime (cudart_static) opens the driver
// when first called, and the driver functions the runtime does not wrap (the
// virtual-memory API, pointer attributes, stream memory operations) are
// looked up through it with cudaGetDriverEntryPointByVersion. A host without
// a driver therefore loads our binaries and gets a Status at the first CUDA
// call instead of a loader error.
//
// Every cudaError_t goes through CudaErrorToStatus and every CUresult through
// CuResultToStatus, so that all CUDA errors read the same way:
//   "cudaIpcOpenMemHandle on device 0: cudaErrorInvalidValue: invalid argument"
//
// Thread-safety: CudaDriver() loads the table once and is safe to call from
// any thread; the table is immutable afterwards. ScopedCudaDevice changes the
// calling thread's current device only.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// The driver functions we use, at the ABI of CUDA 12.0 (kCudaDriverApiVersion)
// whatever the installed driver: the pointer types are the versioned PFN_
// typedefs of cudaTypedefs.h, so a signature change in a later CUDA release
// cannot silently apply here. The member names are the functions' names;
// cuda.h #defines some of them (cuMemGetAddressRange -> _v2), which renames
// the member and its uses alike.
struct CudaDriverApi {
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 cuDevicePrimaryCtxGetState = nullptr;
  PFN_cuMemGetAddressRange_v3020 cuMemGetAddressRange = nullptr;
  PFN_cuPointerGetAttribute_v4000 cuPointerGetAttribute = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 cuMemRetainAllocationHandle = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 cuMemExportToShareableHandle =
      nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle =
      nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020
      cuMemGetAllocationPropertiesFromHandle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity =
      nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  // Not used by ckptd itself; tests make virtual-memory allocations with it.
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  // Events (cuda_event_page.h): a host page registered for device access,
  // stream memory operations on it, and CUDA events that tell when a
  // stream is done with it. At CUDA 12.0 the stream memory operations are
  // the "v2" API of CUDA 11.7 (cuda.h maps cuStreamWaitValue32 to
  // cuStreamWaitValue32_v2), which every device supports without the
  // NVreg_EnableStreamMemOPs module parameter the v1 API needed.
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute = nullptr;
  PFN_cuMemHostRegister_v6050 cuMemHostRegister = nullptr;
  PFN_cuMemHostUnregister_v4000 cuMemHostUnregister = nullptr;
  PFN_cuMemHostGetDevicePointer_v3020 cuMemHostGetDevicePointer = nullptr;
  PFN_cuStreamWaitValue32_v11070 cuStreamWaitValue32 = nullptr;
  PFN_cuStreamWriteValue32_v11070 cuStreamWriteValue32 = nullptr;
  PFN_cuEventCreate_v2000 cuEventCreate = nullptr;
  PFN_cuEventRecord_v2000 cuEventRecord = nullptr;
  PFN_cuEventQuery_v2000 cuEventQuery = nullptr;
  PFN_cuEventDestroy_v4000 cuEventDestroy = nullptr;
};

// The CUDA version whose ABI we ask for (12.0): every function above exists
// in it, and asking for a version newer than the driver fails.
inline constexpr unsigned int kCudaDriverApiVersion = 12000;

// The driver table, looked up on the first call. FailedPrecondition
// ("no usable CUDA driver: ...") when there is no driver, or one lacking a
// function we need; the same result on every later call.
absl::StatusOr<const CudaDriverApi*> CudaDriver();

// "<context>: <cudaGetErrorName>: <cudaGetErrorString>". Codes:
// out of memory -> ResourceExhausted; invalid value, device pointer or
// resource handle -> InvalidArgument; no device, no or too old a driver,
// not supported or permitted -> FailedPrecondition; not ready ->
// Unavailable; anything else (the sticky errors among them) -> Internal.
absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view context);

// The same for driver results, with cuGetErrorName / cuGetErrorString
// (a bare number if the driver table is not loaded). CUDA_ERROR_NOT_FOUND
// maps to NotFound.
absl::Status CuResultToStatus(CUresult result, absl::string_view context);

// True for the errors that leave the context unusable: every later call in
// it fails the same way, and only a new process recovers (driver_types.h
// says so of each: illegal address, launch failure, ECC, ...).
bool IsStickyCudaError(cudaError_t error);
bool IsStickyCuResult(CUresult result);

// Makes `device` the calling thread's current device, its primary context
// (created on first use since CUDA 12) bound to the thread for driver calls
// too, until destroyed; then restores the
// previous device. Restoring skips a device whose primary context is not
// active, so that the guard never creates a context (and its memory) on a
// device the process had not used. Check error() before relying on it.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int device);
  ~ScopedCudaDevice();
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

  // cudaSuccess, or what cudaGetDevice / cudaSetDevice returned.
  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;  // the device to restore; -1: nothing to restore
  cudaError_t error_ = cudaSuccess;
};

}  // namespace ckpt

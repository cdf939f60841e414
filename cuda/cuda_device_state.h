// DeviceState: what a CudaDevice shares with every object it hands out
// (mappings, events, streams, fences), which may outlive it: the device
// list, the devices broken by a sticky error, and the refcounted openings
// of legacy IPC memory handles.
//
// Sticky errors: Check() turns a CUDA result into a Status; one of the
// errors that leave a context unusable (IsStickyCudaError) marks the device
// broken, and from then on CheckDevice() and Check() on it return
// FailedPrecondition("device N hit a sticky CUDA error (...); its context
// cannot be used again: restart ckptd"). Other devices are unaffected: each
// device has its own primary context.
//
// Thread-safety: safe for concurrent use. CheckDevice() is lock-free once
// the devices are listed and none is broken: it runs before every copy.
// Lock order: ipc_mu_, then mu_.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cuda/cuda_driver.h"

namespace ckpt::cuda_internal {

class DeviceState {
 public:
  // The ordinal of the device with this 16-byte uuid (cudaDeviceProp::uuid).
  // The devices are listed on the first call of this or CheckDevice, and
  // the list (or the error: FailedPrecondition "no usable CUDA driver or
  // device: ...") is kept.
  absl::StatusOr<int> FindDevice(const std::string& uuid);

  // OK if `device` exists and has not hit a sticky error.
  absl::Status CheckDevice(int device);

  // `error` of `what` on `device` as a Status ("<what> on device N: ...").
  // A sticky error marks the device broken; any other error is cleared from
  // the runtime's per-thread last error, so that no later, unrelated check
  // reports it again.
  absl::Status Check(int device, cudaError_t error, absl::string_view what);
  absl::Status Check(int device, CUresult result, absl::string_view what);
  // Check of a call whose arguments the trainer supplied (an fd, IPC handle
  // bytes, allocation sizes, an event page): the error fails the call but
  // never marks the device broken. Some drivers answer a bad handle with
  // the generic "unknown error", which elsewhere means a lost context, and
  // one trainer must not be able to take a GPU away from every other
  // session by sending one; a context that really broke is marked by the
  // next stream operation's Check.
  absl::Status CheckPeerInput(int device, cudaError_t error, absl::string_view what);
  absl::Status CheckPeerInput(int device, CUresult result, absl::string_view what);
  // Check of a ScopedCudaDevice's result.
  absl::Status SetDevice(const ScopedCudaDevice& guard, int device) {
    return Check(device, guard.error(), "cudaSetDevice");
  }

  // The base address of the allocation behind legacy `handle` (the bytes of
  // a cudaIpcMemHandle_t), opened on `device` once however many mappings
  // use it: CUDA lets a context open a handle only once.
  absl::StatusOr<void*> OpenIpcMemory(int device, const std::string& handle);
  // Drops one use; the last one closes the handle (errors are logged).
  void CloseIpcMemory(int device, const std::string& handle);

  // Whether cudaMemcpyBatchAsync was found unsupported (then copies go one
  // cudaMemcpyAsync at a time); MarkBatchCopiesUnsupported() is true for
  // its first caller only.
  bool batch_copies_unsupported() const {
    return batch_copies_unsupported_.load(std::memory_order_relaxed);
  }
  bool MarkBatchCopiesUnsupported() {
    return !batch_copies_unsupported_.exchange(true);
  }

 private:
  struct IpcOpening {
    void* base;
    int users;
  };

  absl::Status MarkBroken(int device, const absl::Status& cause);
  absl::Status EnumerateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Held across a handle's lookup, cudaIpcOpenMemHandle / CloseMemHandle
  // and the table update, since a context opens a handle only once; never
  // across the device switch that may create a context (OpenIpcMemory).
  absl::Mutex ipc_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<std::pair<int, std::string>, IpcOpening> ipc_
      ABSL_GUARDED_BY(ipc_mu_);

  absl::Mutex mu_;
  bool enumerated_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status enumeration_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> uuids_ ABSL_GUARDED_BY(mu_);     // by ordinal
  std::map<int, std::string> broken_ ABSL_GUARDED_BY(mu_);  // -> its cause

  // Read without mu_: -1 until the devices are listed; the size of broken_.
  std::atomic<int> device_count_{-1};
  std::atomic<int> broken_count_{0};
  std::atomic<bool> batch_copies_unsupported_{false};
};

}  // namespace ckpt::cuda_internal

#include "cuda/cuda_event_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/sealed_memfd.h"
#include "common/status.h"

namespace ckpt::cuda_internal {
namespace {

// The words live in memory another process maps: they must be atomic
// without a lock (a lock would live in one process's memory only).
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free,
              "GPU events need lock-free 32-bit atomics");

constexpr size_t kRecorded = 0;
constexpr size_t kCompleted = 1;
constexpr CUdeviceptr kCompletedOffset = kCompleted * sizeof(uint32_t);

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

absl::StatusOr<uint32_t*> MapPage(int fd) {
  void* page =
      ::mmap(nullptr, PageSize(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) return ErrnoToStatus(errno, "mmap of an event page");
  return static_cast<uint32_t*>(page);
}

// The name of a stream memory operation, and why it may be unsupported.
std::string MemOp(const char* op, CUresult result) {
  if (result != CUDA_ERROR_NOT_SUPPORTED) return op;
  return absl::StrCat(op,
                      " (this device or platform lacks stream memory "
                      "operations, which GPU events are made of)");
}

void WarnUnless(CUresult result, absl::string_view what) {
  if (result != CUDA_SUCCESS) {
    LogWarning(CuResultToStatus(result, what).message());
  }
}

}  // namespace

absl::Status CheckEventPageFd(int fd) {
  return CheckSealedMemfd(fd, PageSize(), "an event page");
}

absl::StatusOr<std::unique_ptr<EventPage>> EventPage::Create(
    int device, const CuCheck& check) {
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  // The daemon refuses a page that could shrink under its mapping.
  ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd("ckpt-cuda-event", PageSize()));
  // A new memfd reads as zeros: never recorded, nothing completed.
  ASSIGN_OR_RETURN(uint32_t * words, MapPage(fd.get()));
  std::unique_ptr<EventPage> page(
      new EventPage(api, std::move(fd), words, device));
  RETURN_IF_ERROR(page->Register(check));
  return page;
}

absl::StatusOr<std::unique_ptr<EventPage>> EventPage::Open(
    UniqueFd fd, int device, const CuCheck& check) {
  RETURN_IF_ERROR(CheckEventPageFd(fd.get()));
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  ASSIGN_OR_RETURN(uint32_t * words, MapPage(fd.get()));
  std::unique_ptr<EventPage> page(
      new EventPage(api, UniqueFd(), words, device));
  RETURN_IF_ERROR(page->Register(check));
  return page;
}

EventPage::~EventPage() {
  bool in_use = false;
  bool exiting = false;
  {
    absl::MutexLock lock(&mu_);
    in_use = untracked_;
    for (const Use& use : uses_) {
      ScopedCudaDevice guard(use.device);
      if (guard.error() != cudaSuccess) {
        // At process exit the runtime may be gone first: nothing to free.
        exiting = guard.error() == cudaErrorCudartUnloading;
        (void)cudaGetLastError();
        in_use = true;
        continue;
      }
      if (api_->cuEventQuery(use.event) != CUDA_SUCCESS) in_use = true;
      // Allowed while pending: the driver frees the event once it completes.
      WarnUnless(api_->cuEventDestroy(use.event), "cuEventDestroy");
    }
    uses_.clear();
  }
  if (registered_ && !in_use) {
    ScopedCudaDevice guard(device_);
    if (guard.error() != cudaSuccess) {
      exiting = guard.error() == cudaErrorCudartUnloading;
      (void)cudaGetLastError();
      in_use = true;
    } else if (CUresult r = api_->cuMemHostUnregister(words_);
               r != CUDA_SUCCESS) {
      WarnUnless(r, "cuMemHostUnregister of an event page");
      in_use = true;  // still registered: the address must stay ours
    }
  }
  if (in_use) {
    if (!exiting) {
      LogWarning("an event page of device ", device_,
                 " stays mapped: a stream may still wait on or write it");
    }
    return;
  }
  if (::munmap(words_, PageSize()) != 0) {
    LogWarning(ErrnoToStatus(errno, "munmap of an event page").message());
  }
}

absl::Status EventPage::Register(const CuCheck& check) {
  CUdevice device = 0;
  RETURN_IF_ERROR(check(api_->cuDeviceGet(&device, device_), "cuDeviceGet"));
  int can_register = 0;
  int can_map = 0;
  RETURN_IF_ERROR(check(
      api_->cuDeviceGetAttribute(
          &can_register, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, device),
      "cuDeviceGetAttribute(HOST_REGISTER_SUPPORTED)"));
  RETURN_IF_ERROR(
      check(api_->cuDeviceGetAttribute(
                &can_map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, device),
            "cuDeviceGetAttribute(CAN_MAP_HOST_MEMORY)"));
  if (!can_register || !can_map) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device_, " cannot ",
        can_register ? "map host memory" : "register host memory",
        ": GPU events are semaphores in host memory that streams wait on"));
  }
  // PORTABLE: the streams of every context (device) of the process may use
  // the page; DEVICEMAP: they can address it.
  RETURN_IF_ERROR(
      check(api_->cuMemHostRegister(
                words_, PageSize(),
                CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
            "cuMemHostRegister of an event page"));
  registered_ = true;
  return CompletedOnDevice(check).status();
}

absl::StatusOr<CUdeviceptr> EventPage::CompletedOnDevice(
    const CuCheck& check) const {
  CUdeviceptr base = 0;
  RETURN_IF_ERROR(check(api_->cuMemHostGetDevicePointer(&base, words_, 0),
                        "cuMemHostGetDevicePointer of an event page"));
  return base + kCompletedOffset;
}

absl::Status EventPage::EnqueueRecord(CUstream stream, int stream_device,
                                      const CuCheck& check, uint32_t target,
                                      RecordOrder order) {
  ASSIGN_OR_RETURN(CUdeviceptr completed, CompletedOnDevice(check));
  // Created first, so that an enqueued operation never lacks its event.
  CUevent after = nullptr;
  RETURN_IF_ERROR(check(api_->cuEventCreate(&after, CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate"));
  const char* op = "cuStreamWriteValue32 (event record)";
  CUresult result = CUDA_SUCCESS;
  if (order == RecordOrder::kAfterPrevious) {
    op = "cuStreamWaitValue32 (the event's previous record)";
    result = api_->cuStreamWaitValue32(stream, completed, target - 1,
                                       CU_STREAM_WAIT_VALUE_GEQ);
  }
  if (result == CUDA_SUCCESS) {
    op = "cuStreamWriteValue32 (event record)";
    result = api_->cuStreamWriteValue32(stream, completed, target,
                                        CU_STREAM_WRITE_VALUE_DEFAULT);
  }
  if (result != CUDA_SUCCESS) {
    WarnUnless(api_->cuEventDestroy(after), "cuEventDestroy");
    // (A wait enqueued before a failed write only holds its stream.)
    return check(result, MemOp(op, result));
  }
  return Track(stream, stream_device, after, check);
}

absl::Status EventPage::Record(CUstream stream, int stream_device,
                               const CuCheck& check, RecordOrder order) {
  const uint32_t target = Reserve();
  const absl::Status status = EnqueueRecord(stream, stream_device, check, target, order);
  if (!status.ok()) {
    // Not enqueued, so no write will ever reach `target`, and no wait was
    // handed this number: take the record back, unless another was made
    // since (whose write covers it too).
    uint32_t expected = target;
    std::atomic_ref<uint32_t>(words_[kRecorded])
        .compare_exchange_strong(expected, target - 1, std::memory_order_acq_rel);
  }
  return status;
}

uint32_t EventPage::Reserve() {
  return std::atomic_ref<uint32_t>(words_[kRecorded]).fetch_add(1, std::memory_order_acq_rel) +
         1;
}

absl::Status EventPage::RecordReserved(CUstream stream, int stream_device,
                                       const CuCheck& check, uint32_t target) {
  return EnqueueRecord(stream, stream_device, check, target, RecordOrder::kAfterPrevious);
}

bool EventPage::CompleteReserved(uint32_t target) {
  std::atomic_ref<uint32_t> completed(words_[kCompleted]);
  uint32_t now = completed.load(std::memory_order_acquire);
  for (;;) {
    // Cyclic, as the GPU compares.
    if (static_cast<int32_t>(now - target) >= 0) return true;
    if (static_cast<int32_t>(now - (target - 1)) < 0) return false;
    if (completed.compare_exchange_weak(now, target, std::memory_order_release,
                                        std::memory_order_acquire)) {
      return true;
    }
  }
}

absl::Status EventPage::Wait(CUstream stream, int stream_device,
                             const CuCheck& check) {
  return WaitFor(stream, stream_device, check, recorded());
}

absl::Status EventPage::WaitFor(CUstream stream, int stream_device,
                                const CuCheck& check, uint32_t target) {
  ASSIGN_OR_RETURN(CUdeviceptr completed, CompletedOnDevice(check));
  CUevent after = nullptr;
  RETURN_IF_ERROR(check(api_->cuEventCreate(&after, CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate"));
  const CUresult result = api_->cuStreamWaitValue32(stream, completed, target,
                                                    CU_STREAM_WAIT_VALUE_GEQ);
  if (result != CUDA_SUCCESS) {
    WarnUnless(api_->cuEventDestroy(after), "cuEventDestroy");
    return check(result, MemOp("cuStreamWaitValue32 (event wait)", result));
  }
  return Track(stream, stream_device, after, check);
}

void EventPage::CompleteRecorded() { CompleteThrough(recorded()); }

bool EventPage::Reached(uint32_t target) const {
  return static_cast<int32_t>(completed() - target) >= 0;
}

void EventPage::CompleteThrough(uint32_t target) {
  std::atomic_ref<uint32_t> completed(words_[kCompleted]);
  uint32_t now = completed.load(std::memory_order_acquire);
  // Raised only (cyclically, as the GPU compares): a stream's write that
  // landed meanwhile may already be ahead.
  while (static_cast<int32_t>(now - target) < 0 &&
         !completed.compare_exchange_weak(now, target,
                                          std::memory_order_release,
                                          std::memory_order_acquire)) {
  }
}

uint32_t EventPage::recorded() const {
  return std::atomic_ref<uint32_t>(words_[kRecorded])
      .load(std::memory_order_acquire);
}

uint32_t EventPage::completed() const {
  return std::atomic_ref<uint32_t>(words_[kCompleted])
      .load(std::memory_order_acquire);
}

absl::Status EventPage::Track(CUstream stream, int stream_device, CUevent after,
                              const CuCheck& check) {
  const CUresult result = api_->cuEventRecord(after, stream);
  absl::MutexLock lock(&mu_);
  if (result != CUDA_SUCCESS) {
    // The operation is enqueued, but when it ends cannot be told.
    untracked_ = true;
    WarnUnless(api_->cuEventDestroy(after), "cuEventDestroy");
    return check(result, "cuEventRecord after an event operation");
  }
  // Forget this device's uses that completed (queried in its context, the
  // current one), so the list stays as long as the work in flight.
  std::erase_if(uses_, [&](const Use& use) {
    if (use.device != stream_device) return false;
    if (api_->cuEventQuery(use.event) != CUDA_SUCCESS) return false;
    WarnUnless(api_->cuEventDestroy(use.event), "cuEventDestroy");
    return true;
  });
  uses_.push_back(Use{after, stream_device});
  return absl::OkStatus();
}

}  // namespace ckpt::cuda_internal

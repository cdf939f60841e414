#include "session/gpu_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "gpu/simulated_device.h"
#ifdef CKPT_HAVE_CUDA
#include "cuda/cuda_device.h"
#endif

namespace ckpt {

uint64_t GpuBackend::RegistrationChunk(uint32_t buffer_bytes) {
  const uint64_t limit = uint64_t{1} << 30;
  return std::max<uint64_t>(buffer_bytes, limit / buffer_bytes * buffer_bytes);
}

absl::StatusOr<std::unique_ptr<GpuBackend>> GpuBackend::Open(
    const std::string& kind, StagingPool* pool, uint32_t pool_share_percent) {
  std::unique_ptr<GpuDevice> device;
  std::string reason;
  if (kind == "off") {
    reason = "this daemon runs with --gpu=off";
  } else if (kind == "simulated") {
    device = std::make_unique<SimulatedDevice>();
  } else if (kind == "auto" || kind == "cuda") {
#ifdef CKPT_HAVE_CUDA
    ASSIGN_OR_RETURN(device, CudaDevice::Create());
#else
    if (kind == "cuda") {
      return absl::FailedPreconditionError(
          "--gpu=cuda, but ckptd was built without CUDA (CKPT_WITH_CUDA)");
    }
    reason = "ckptd was built without CUDA support";
#endif
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu must be auto, cuda, simulated or off, not '", kind, "'"));
  }
  if (pool_share_percent < 1 || pool_share_percent > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu_pool_share_percent must be 1 to 100, not ", pool_share_percent));
  }
  std::unique_ptr<GpuBackend> backend(
      new GpuBackend(std::move(device), std::move(reason), pool, pool_share_percent));
  if (kind == "cuda") RETURN_IF_ERROR(backend->Prepare());
  return backend;
}

absl::StatusOr<bool> GpuBackend::Pin(char* data, uint64_t size) {
  if (device_ == nullptr) return false;
  {
    absl::MutexLock lock(&mu_);
    if (!prepared_ || !prepare_status_.ok()) return false;
  }
  const uint64_t chunk = RegistrationChunk(pool_->buffer_bytes());
  RETURN_IF_ERROR(device_->RegisterHostMemory(data, size, chunk));
  absl::MutexLock lock(&mu_);
  pinned_[data] = size;
  return true;
}

void GpuBackend::Unpin(char* data, uint64_t size) {
  {
    absl::MutexLock lock(&mu_);
    pinned_.erase(data);
  }
  absl::Status s = device_->UnregisterHostMemory(
      data, size, RegistrationChunk(pool_->buffer_bytes()));
  if (!s.ok()) LogWarning("unpin a memory tier image: ", s.ToString());
}

void GpuBackend::SplitAtChunks(std::vector<GpuCopy>* copies) const {
  const uint64_t chunk = RegistrationChunk(pool_->buffer_bytes());
  std::vector<GpuCopy> out;
  absl::MutexLock lock(&mu_);
  for (const GpuCopy& c : *copies) {
    auto it = pinned_.upper_bound(c.host);
    if (it == pinned_.begin() ||
        static_cast<uint64_t>(c.host - std::prev(it)->first) >= std::prev(it)->second) {
      out.push_back(c);  // not pinned: the driver stages it
      continue;
    }
    --it;
    const char* base = it->first;
    GpuCopy rest = c;
    while (rest.length > 0) {
      const uint64_t at = static_cast<uint64_t>(rest.host - base);
      const uint64_t room = chunk - at % chunk;
      GpuCopy piece = rest;
      piece.length = std::min(rest.length, room);
      out.push_back(piece);
      rest.device += piece.length;
      rest.host += piece.length;
      rest.length -= piece.length;
    }
  }
  copies->swap(out);
}

GpuBackend::~GpuBackend() {
  abandoned_.reset();
  absl::MutexLock lock(&mu_);
  if (prepared_ && prepare_status_.ok()) {
    absl::Status s = device_->UnregisterHostMemory(
        pool_->base(), pool_->pool_bytes(), RegistrationChunk(pool_->buffer_bytes()));
    if (!s.ok()) LogWarning("unregister staging pool: ", s.ToString());
  }
}

absl::Status GpuBackend::Prepare() {
  if (device_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this daemon cannot take CUDA regions: ", unavailable_reason_));
  }
  absl::MutexLock lock(&mu_);
  if (!prepared_) {
    prepared_ = true;
    const absl::Time start = absl::Now();
    prepare_status_ = Annotate(
        device_->RegisterHostMemory(pool_->base(), pool_->pool_bytes(),
                                    RegistrationChunk(pool_->buffer_bytes())),
        "register the staging pool with the GPU");
    if (prepare_status_.ok()) {
      pinned_[pool_->base()] = pool_->pool_bytes();
      LogInfo("staging pool of ", pool_->pool_bytes(), " bytes registered with the ",
              device_->name(), " device in ",
              absl::FormatDuration(absl::Now() - start));
    } else {
      LogWarning(prepare_status_.ToString());
    }
  }
  return prepare_status_;
}

}  // namespace ckpt

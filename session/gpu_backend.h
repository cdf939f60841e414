// GpuBackend: the daemon's GPU device, chosen by --gpu, and the one-time
// work before its first use.
//
//   auto       CUDA when ckptd was built with it; a host without a usable
//              driver or device then refuses CUDA regions with the reason
//              and serves host regions as before
//   cuda       the same, but start-up fails without a usable device
//   simulated  the simulated device (gpu/simulated_device.h), for tests
//   off        no GPU: CUDA regions are refused
//
// The device's contexts are created lazily: nothing touches the GPU until a
// trainer registers its first CUDA region. Then Prepare registers the
// staging pool with the device (page-locked for DMA, in chunks, every
// buffer inside one chunk), once for the daemon's life. From then on the
// memory tier's images are pinned too when their checkpoint commits
// (ImagePinner), so restores into GPU memory copy from them directly.
// SplitAtChunks cuts copies at the chunk boundaries of what was pinned: a
// copy whose host side spans two registrations is not a DMA copy.
//
// Thread-safety: safe for concurrent use.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/gpu_device.h"
#include "io/staging_pool.h"
#include "session/abandoned_copies.h"
#include "session/pool_share.h"
#include "session/staged_completer.h"
#include "storage/memory_tier.h"

namespace ckpt {

class GpuBackend final : public ImagePinner {
 public:
  // `pool` outlives the backend. Each session's GPU copies that have not
  // ended may hold `pool_share_percent` (1..100) of its buffers
  // (session/pool_share.h).
  static absl::StatusOr<std::unique_ptr<GpuBackend>> Open(const std::string& kind,
                                                          StagingPool* pool,
                                                          uint32_t pool_share_percent = 50);
  ~GpuBackend() override;

  // Null when the daemon has no GPU; then unavailable_reason() says why.
  GpuDevice* device() const { return device_.get(); }
  const std::string& unavailable_reason() const { return unavailable_reason_; }
  std::string name() const { return device_ ? device_->name() : "none"; }

  // Registers the staging pool with the device on the first call; later
  // calls return the first call's result.
  absl::Status Prepare();

  // The chunk size the pool is registered in: the largest multiple of the
  // buffer size not above 1 GiB.
  static uint64_t RegistrationChunk(uint32_t buffer_bytes);

  // ImagePinner: pins only once Prepare succeeded (a GPU trainer exists).
  absl::StatusOr<bool> Pin(char* data, uint64_t size) override;
  void Unpin(char* data, uint64_t size) override;

  // Cuts `copies` where their host side crosses a registration chunk.
  void SplitAtChunks(std::vector<GpuCopy>* copies) const;

  // A new session's share of the staging pool.
  std::shared_ptr<PoolShare> NewSessionShare() const {
    return PoolShare::OfPool(pool_->iovecs().size(), pool_share_percent_);
  }

  // Where saves leave copies whose end they could not make sure of.
  AbandonedCopies& abandoned() { return *abandoned_; }
  // Where saves leave staged records they did not make on a stream.
  StagedCompleter& staged_completer() { return staged_completer_; }

 private:
  GpuBackend(std::unique_ptr<GpuDevice> device, std::string reason,
             StagingPool* pool, uint32_t pool_share_percent)
      : device_(std::move(device)),
        unavailable_reason_(std::move(reason)),
        pool_(pool),
        pool_share_percent_(pool_share_percent) {}

  const std::unique_ptr<GpuDevice> device_;
  const std::string unavailable_reason_;
  StagingPool* const pool_;
  const uint32_t pool_share_percent_;
  // Reset first at destruction: its leftovers are settled while the device
  // and the pool's registration still exist.
  std::unique_ptr<AbandonedCopies> abandoned_ = std::make_unique<AbandonedCopies>();
  StagedCompleter staged_completer_;

  mutable absl::Mutex mu_;
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status prepare_status_ ABSL_GUARDED_BY(mu_);
  // Registered host ranges: start -> length (chunked from the start).
  std::map<const char*, uint64_t> pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

// GpuRegions: one session's CUDA regions, opened through the GPU seam.
//
// A region is the trainer's device memory [address, address + length) and
// the allocations under it. Add opens the allocations once (GpuDevice::Map:
// cudaIpcOpenMemHandle, or the POSIX-FD handles taken from the verified
// peer with pidfd_getfd) and the trainer's ready/staged events, and every
// later save reuses them. Two rules keep an opened allocation from ever
// being stale or kept alive (invariant 13):
//   - a region is released when the trainer says so (ReleaseRegions), when
//     the trainer registers an overlapping range (it freed the memory and
//     allocated again there), and when the session ends; a released
//     region's range stays known, so a save that still refers to it fails
//     instead of reading whatever is there now;
//   - the mapping is a shared_ptr: a copy in flight holds it, so releasing
//     a region unmaps it as soon as the last copy that uses it completes,
//     and never before.
//
// Thread-safety: safe for concurrent use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ckpt/v1/control.pb.h"
#include "gpu/gpu_device.h"
#include "session/address_ranges.h"
#include "session/gpu_backend.h"
#include "session/gpu_region.h"
#include "session/memory_source.h"
#include "session/pool_share.h"
#include "session/staged_records.h"

namespace ckpt {

// Events one session may open: each is a page the daemon maps (and pins,
// on CUDA), and a trainer needs two per device (ready, staged), so this
// only stops a client that sends a new event with every region.
inline constexpr size_t kMaxGpuEventsPerSession = 64;

class GpuRegions {
 public:
  // `backend` may be null or have no device: then every Add fails, saying
  // why. It outlives this object.
  GpuRegions(GpuBackend* backend, PeerFdTaker take_fd,
             absl::Duration copy_timeout);
  ~GpuRegions();

  // Opens `region` under id `id`; a live region it overlaps is released.
  absl::Status Add(uint64_t id, const v1::CudaRegion& region);
  // Releases region `id` (no-op if it is not a live GPU region).
  void Release(uint64_t id);
  void ReleaseAll();
  size_t live_regions() const;

  // The live region that holds [address, address + length); nullptr when
  // the range is in no GPU region (host memory); an error when it lies in
  // a released region or straddles a region's end.
  absl::StatusOr<std::shared_ptr<const GpuRegion>> Find(uint64_t address,
                                                        uint64_t length) const;

  // How many regions were released so far. A region Find returned is
  // still live while this has not changed since before that Find, so a
  // caller may keep using it for later spans without asking again (a save
  // enqueues thousands of spans, most of them in the region of the last).
  uint64_t releases() const { return releases_.load(std::memory_order_acquire); }

  // Starts copies of spans that all lie in GPU regions (restore); Wait on
  // the result ends them. Copies that do not end within copy_timeout() of
  // that Wait fail it with an error HostMemoryInUse (common/status.h) says
  // is one: the spans' host memory may still be read or written, so the
  // caller must keep it. Errors before any copy ran are reported by Wait.
  std::unique_ptr<CopiesInFlight> StartCopy(absl::Span<const CopySpan> spans,
                                            bool to_host);
  // StartCopy, waited for.
  absl::Status Copy(absl::Span<const CopySpan> spans, bool to_host) {
    return StartCopy(spans, to_host)->Wait();
  }

  // Reserves the next record of each staged event of the live regions
  // (session/staged_records.h): the records a save accepted now promises.
  StagedRecords ReserveStaged();

  GpuBackend* backend() const { return backend_; }
  // The session's share of the staging pool; null without a backend.
  const std::shared_ptr<PoolShare>& pool_share() const { return pool_share_; }
  GpuDevice* device() const { return device_; }
  absl::Duration copy_timeout() const { return copy_timeout_; }

 private:
  absl::StatusOr<std::shared_ptr<GpuEvent>> OpenEvent(int device,
                                                      const v1::CudaEventRef& ref)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  GpuBackend* const backend_;
  GpuDevice* const device_;
  const PeerFdTaker take_fd_;
  const absl::Duration copy_timeout_;
  const std::shared_ptr<PoolShare> pool_share_;

  mutable absl::Mutex mu_;
  // Live regions by peer address; they never overlap.
  std::map<uint64_t, std::shared_ptr<const GpuRegion>> live_ ABSL_GUARDED_BY(mu_);
  // Where released regions were, so later references fail clearly.
  AddressRanges released_ ABSL_GUARDED_BY(mu_);
  // Bumped (under mu_) whenever a region leaves live_; read without it.
  std::atomic<uint64_t> releases_{0};
  // The trainer's events, opened once per handle (a trainer uses one pair
  // per device for all its regions).
  std::map<std::string, std::shared_ptr<GpuEvent>> events_ ABSL_GUARDED_BY(mu_);
  // One stream per device for the synchronous copies of restores.
  absl::Mutex copy_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<int, std::unique_ptr<GpuStream>> copy_streams_
      ABSL_GUARDED_BY(copy_mu_);
};

}  // namespace ckpt

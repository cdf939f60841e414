// FetchBuffers: the memory of the remote tier's fetches (the windows a
// restore fetches with ranged GETs, storage/remote_tier.h), within one
// budget (--remote_fetch_bytes), with the mappings reused.
//
// Why reuse: an image on a fresh anonymous mapping has every page zeroed
// by the kernel at its first touch, then overwritten at once by the fetch.
// In the remote benchmark's profile that zeroing (clear_page_erms) was 59%
// of the restoring daemon's CPU, on a machine where the daemon, the S3
// server and the trainer share two cores. So a dropped image's mapping is
// kept as a spare and handed, with its pages, to the next fetch it is large
// enough for; each page is zeroed once per restore instead of once per
// window. Spares count against the budget with the images in use, are
// unmapped to make room for a fetch none fits, and are all unmapped by
// Trim, which the loader calls at the end of each round, so an idle
// daemon holds none.
//
// Resident spares: the first windows of a fresh daemon's first restore
// (a replacement node's) would still land on fresh pages, half of a 1 GiB
// restore of two files, and the kernel's zeroing of them was 45% of the
// restoring daemon's CPU in the remote benchmark's profile. So
// MakeResident maps and faults in spares once the daemon is ready (on a
// thread of the remote tier: RemoteTier::StartResidentFetchWindows), much
// as the staging pool is faulted in at start, and Trim keeps them: the
// zeroing moves from the restore to the daemon's first second, and those
// bytes stay in memory for the daemon's life (counted against the budget
// like any spare).
//
// A spare's old bytes never reach anyone: a fetch overwrites its whole
// window or fails (RemoteTier::FetchRange).
//
// Thread-safety: all methods may be called from any thread; images may be
// dropped on any thread, after this object's owner is gone too (each holds
// a reference to it).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/memory_tier.h"

namespace ckpt {

class FetchBuffers : public std::enable_shared_from_this<FetchBuffers> {
 public:
  // Make it with std::make_shared: images hold a reference.
  explicit FetchBuffers(uint64_t budget) : budget_(budget) {}
  ~FetchBuffers();  // unmaps the spares
  FetchBuffers(const FetchBuffers&) = delete;
  FetchBuffers& operator=(const FetchBuffers&) = delete;

  // An image of `size` bytes (1 to budget()), counted against the budget
  // until its last holder drops it: a spare large enough if there is one,
  // else a new mapping. With `wait`, waits until `deadline` for other
  // fetches to drop theirs (DeadlineExceeded then); without, null (OK) if
  // there is no room now. ResourceExhausted if no mapping can be made.
  absl::StatusOr<std::shared_ptr<FileImage>> Take(uint64_t size, bool wait, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Adds `bytes` (rounded down to whole pieces of `piece` bytes, one
  // window) of resident spares, each mapped and faulted in before a fetch
  // can take it, within the budget; stops early, saying so in the log, if
  // memory runs out, and between pieces once `stop` is true. Returns the
  // bytes added. Call once, at start.
  uint64_t MakeResident(uint64_t bytes, uint64_t piece, const std::atomic<bool>& stop)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Unmaps every spare but the resident bytes' worth if no image is in use.
  void Trim() ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t budget() const { return budget_; }
  // For tests: bytes of images in use, and of spares.
  std::pair<uint64_t, uint64_t> HeldAndSpare() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Spare {
    char* mapping;
    uint64_t capacity;
  };
  // An image's last holder dropped it: its mapping becomes a spare.
  void Return(FileImage* image) ABSL_LOCKS_EXCLUDED(mu_);

  const uint64_t budget_;
  mutable absl::Mutex mu_;
  uint64_t resident_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // capacity of the images in use
  uint64_t spare_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Spare> spares_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

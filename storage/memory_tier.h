// MemoryTier: recent checkpoints' data files kept in daemon RAM, so that a
// trainer restarting on the same node restores at memory speed.
//
// While a part is written, ShardWriter copies each window into a file
// image reserved here (Reserve), after the window's write and off the
// staging path (save/shard_writer.h); the images of a checkpoint become
// readable once the node's files of it are durable and the images whole
// (MarkComplete), and are dropped if it fails (Drop). Loads ask for an
// image by file (Find) and read it instead of the file, verifying every
// block as from storage. Once a GPU trainer has connected, every image
// Find returns is pinned (page-locked for DMA): a checkpoint's images are
// pinned in the background after its commit (Pin), and a load that comes
// first pins them itself or waits for that pin to end, so that a restore
// into GPU memory never copies from pageable memory (the driver's bounce
// buffers: a few GB/s where the copy engine does 50); a load asks only for a checkpoint whose COMMIT it
// has read from storage, so marking before the COMMIT is written means that
// a load which sees the COMMIT also sees the images. The tier holds at
// most `budget` bytes: reserving room for a new checkpoint evicts the
// oldest other checkpoints' images that no load is using; if that is not
// enough, the file is simply not kept. Evicted images, and those of a
// checkpoint dropped (failed, or deleted by retention) that nobody holds,
// are not unmapped at once but kept as spares, still counted against the
// budget, and a later Reserve of the same size takes one: saves of a job repeat their file
// sizes (one per rank or file), and unmapping gigabytes only to fault them
// in again would slow the next save's tier copies by the page faults. A
// spare is unmapped only when its room is needed for an image of another
// size. The staging pool and the tier are separate, fixed budgets, so
// together they bound the daemon's memory.
//
// Thread-safety: all methods may be called from any thread. An image stays
// valid while the shared_ptr Find or Reserve returned is held.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon_metrics.h"

namespace ckpt {

// Page-locks host memory for DMA: the GPU backend, once a GPU trainer is
// connected, so that restores into GPU memory copy from an image at the
// copy engine's speed instead of through the driver's bounce buffers.
class ImagePinner {
 public:
  virtual ~ImagePinner() = default;
  // True if pinned; false if there is no GPU in use (nothing to do).
  virtual absl::StatusOr<bool> Pin(char* data, uint64_t size) = 0;
  virtual void Unpin(char* data, uint64_t size) = 0;
};

class FileImage {
 public:
  explicit FileImage(uint64_t size);  // anonymous mapping; data() null on failure
  // Takes over an anonymous mapping of `capacity` bytes that ReleaseMapping
  // gave back (its pages keep their bytes: no zeroing by the kernel again),
  // as an image of its first `size` bytes.
  FileImage(char* mapping, uint64_t capacity, uint64_t size);
  ~FileImage();  // unpins, then unmaps
  FileImage(const FileImage&) = delete;
  FileImage& operator=(const FileImage&) = delete;
  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The length of the mapping (size(), or more for an adopted one).
  uint64_t capacity() const { return capacity_; }
  // Unpins, and hands the mapping to the caller instead of unmapping it
  // (nullptr if there is none); the image is empty after.
  char* ReleaseMapping();
  // Asks the kernel for transparent huge pages over the image (advice: a
  // kernel without them, or with them off, keeps small pages). An image
  // filled at once by many threads, as a remote fetch fills its window,
  // otherwise takes a page fault per 4 KiB, all of them on one mm.
  void AdviseHugePages();
  // Pins the image with `pinner` unless it is already pinned or a pin of
  // it failed (that is logged once; the image is then read unpinned). A
  // second caller waits while the first one pins.
  void PinWith(ImagePinner* pinner) ABSL_LOCKS_EXCLUDED(pin_mu_);

 private:
  char* data_ = nullptr;
  const uint64_t size_;
  const uint64_t capacity_;
  absl::Mutex pin_mu_;
  ImagePinner* pinned_by_ ABSL_GUARDED_BY(pin_mu_) = nullptr;  // set once pinned
  bool pin_failed_ ABSL_GUARDED_BY(pin_mu_) = false;
};

class MemoryTier {
 public:
  explicit MemoryTier(uint64_t budget) : budget_(budget) {}

  // Pin() and Find() pin with `pinner` (which outlives the tier) from now on.
  void SetPinner(ImagePinner* pinner);

  // An image of `size` bytes for a data file being written, or null when
  // the tier is off or has no room.
  std::shared_ptr<FileImage> Reserve(const std::string& job, const std::string& checkpoint,
                                     const std::string& file, uint64_t size);
  // The node's files of the checkpoint are durable and its images hold
  // their bytes: loads that found the checkpoint committed may read them.
  void MarkComplete(const std::string& job, const std::string& checkpoint);
  // Pins the checkpoint's images with the pinner, if one is set (after
  // COMMITTED is published: pinning gigabytes takes a while).
  void Pin(const std::string& job, const std::string& checkpoint);
  // The checkpoint failed or was deleted: forget it; its images nobody
  // holds become spares.
  void Drop(const std::string& job, const std::string& checkpoint);
  // A complete checkpoint's image of `file` whose size is `size`, or null.
  // With a pinner set, the image is pinned first (or its pin in progress
  // waited for); one the pinner could not pin is returned unpinned.
  std::shared_ptr<const FileImage> Find(const std::string& job, const std::string& checkpoint,
                                        const std::string& file, uint64_t size) const;

  // Whether the tier holds the complete images of this node's files of
  // the checkpoint (`ckptctl list`'s "memory").
  bool HoldsComplete(const std::string& job, const std::string& checkpoint) const;

  uint64_t used_bytes() const;

  // The budget from now on (SIGHUP). Shrinking evicts the oldest
  // checkpoints' images that no load or save holds until the rest fit; an
  // image in use stays, and goes at a later Reserve or SetBudget. Returns
  // the bytes evicted.
  uint64_t SetBudget(uint64_t budget);
  uint64_t budget() const;

 private:
  struct Checkpoint {
    uint64_t sequence = 0;  // reservation order: lower is older
    bool complete = false;
    std::map<std::string, std::shared_ptr<FileImage>> files;
  };
  static std::string Key(const std::string& job, const std::string& checkpoint) {
    return job + "/" + checkpoint;
  }

  // Makes `room` bytes fit in the budget. With `reuse_size` (non-zero),
  // returns a spare image of that size as soon as one exists (its bytes are
  // counted already); else frees room: spares first (to `*unmap`), then the
  // oldest checkpoint other than `keep` that nobody holds, whose images
  // become spares. Null with `*fits` false when neither can be done; null
  // with `*fits` true when `room` fits without a spare.
  std::shared_ptr<FileImage> MakeRoomLocked(uint64_t room, const std::string& keep,
                                            uint64_t reuse_size, bool* fits,
                                            std::vector<std::shared_ptr<FileImage>>* unmap)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint other than `keep` that was reserved first and whose
  // images nobody holds; checkpoints_.end() if none.
  std::map<std::string, Checkpoint>::iterator OldestIdleLocked(
      const std::string& keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<ImagePinner*> pinner_{nullptr};
  mutable absl::Mutex mu_;
  uint64_t budget_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Checkpoint> checkpoints_ ABSL_GUARDED_BY(mu_);
  // Evicted images kept for reuse, oldest first; counted in used_.
  std::vector<std::shared_ptr<FileImage>> spares_ ABSL_GUARDED_BY(mu_);

  // Read at each metrics render; last, so unbound before what they read goes.
  GaugeBinding used_gauge_ = DaemonMetrics::Get().memory_tier_used_bytes.Bind(
      [this] { return static_cast<double>(used_bytes()); });
  GaugeBinding budget_gauge_ = DaemonMetrics::Get().memory_tier_budget_bytes.Bind(
      [this] { return static_cast<double>(budget()); });
};

}  // namespace ckpt

// MemorySource: reads and writes the memory a peer registered.
//
// The save path copies chunks out of a trainer's memory into staging
// buffers; the restore path copies verified bytes back. HostProcessMemory
// does this for host memory with pread/pwrite on the peer's
// /proc/<pid>/mem, opened once when the session binds its trainer
// (session/peer_process.h): that file is bound to the exec image the
// process ran then, so no access can reach another program the pid runs
// later. A session's GPU regions (session/gpu_regions.h) implement the same
// interface over the GPU seam. Callers have already checked that every span
// lies inside a region the peer registered (invariant 6).
//
// Saves copy through a CopyOutBatch: copies are enqueued in order and
// complete later (a GPU's copy engine runs ahead of the writer that hashes
// and writes them), and AllEnqueued() tells the peer's GPU streams that the
// last copy is queued (the GPU-side STAGED). For host memory every copy is
// complete when Enqueue returns.
//
// Thread-safety: implementations are safe to call from several threads.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"
#include "io/staging_pool.h"
#include "session/pool_share.h"
#include "session/staged_records.h"

namespace ckpt {

// `length` bytes at `remote` in the peer, and the local bytes they map to.
struct CopySpan {
  uint64_t remote = 0;
  char* local = nullptr;
  uint64_t length = 0;
};

// One save's copies out of a peer. Thread-safety: one thread at a time.
class CopyOutBatch {
 public:
  // Destroying a batch with copies not yet complete is a bug: the caller
  // waits for every ticket first (the local memory is a DMA target).
  virtual ~CopyOutBatch() = default;
  // Starts copying every span from the peer into local memory; returns a
  // ticket for those copies (tickets increase from 1).
  virtual absl::StatusOr<uint64_t> Enqueue(
      absl::Span<const CopySpan> spans) = 0;
  // Whether the copies of `ticket` (and every earlier one) are complete.
  virtual absl::StatusOr<bool> Ready(uint64_t ticket) = 0;
  // Waits until they are, or fails (DeadlineExceeded after the daemon's GPU
  // copy timeout, an error of the copy, a peer that exited).
  virtual absl::Status Wait(uint64_t ticket) = 0;
  // The last span is enqueued: the peer's streams may wait for the copies
  // from now on (records the staged events of the GPU regions read).
  virtual absl::Status AllEnqueued() = 0;
  // Ends the batch after an error: makes sure no copy it enqueued is still
  // running or can run later (GPU copies still waiting for a trainer that
  // will never signal are released and run), so that its local memory can
  // be reused. An error means that could not be made sure: the caller must
  // never reuse the local memory.
  virtual absl::Status Drain() = 0;
  // After a Drain that failed: `buffers`, the local memory the batch's
  // copies may still write, go with the batch and back to their pool only
  // once those copies ended, however long after the batch that is
  // (session/abandoned_copies.h). By default they never go back
  // (StagingLease::Withhold).
  virtual void KeepUntilCopiesEnd(std::vector<StagingLease> buffers);
  // Before the writer stages a window into one more buffer: a claim on the
  // share of the staging pool the batch's session may hold in copies not
  // yet known to have ended (session/pool_share.h), which the writer drops
  // once the window's copies ended. Without room: ResourceExhausted naming
  // the bound at once, or, with `may_wait` (the writer has no window of its
  // own to wait for), once none came back within the copy timeout. By
  // default (copies that end when enqueued) an empty claim.
  virtual absl::StatusOr<PoolShare::Claim> ClaimBuffer(bool may_wait);
};

// Copies started by MemorySource::StartWrite that may still be running.
// Thread-safety: one thread at a time.
class CopiesInFlight {
 public:
  // Destroying copies not waited for is a bug: the destructor waits for
  // them (logging an error), as the local memory may be freed next.
  virtual ~CopiesInFlight() = default;
  // Waits until every copy ended, with the result Write would have given:
  // an error HostMemoryInUse (common/status.h) says is one when copies did
  // not end, so that the local memory must never be reused. Once only.
  virtual absl::Status Wait() = 0;
};

// Copies that ended when they were started, with their result.
class EndedCopies final : public CopiesInFlight {
 public:
  explicit EndedCopies(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  const absl::Status status_;
};

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // Copies every span from the peer into local memory, all or error.
  virtual absl::Status Read(absl::Span<const CopySpan> spans) = 0;
  // Copies every span from local memory into the peer, all or error.
  virtual absl::Status Write(absl::Span<const CopySpan> spans) = 0;
  // Write, except that copies a copy engine runs (GPU memory) may still run
  // when it returns: the caller hashes its next bytes meanwhile, and must
  // keep the local memory unchanged until Wait on the result returned. By
  // default the write is done when this returns.
  virtual std::unique_ptr<CopiesInFlight> StartWrite(absl::Span<const CopySpan> spans);
  // A batch for one save; by default each Enqueue is a synchronous Read.
  // `staged`, if not null, holds the records the save reserved (and
  // outlives the batch): AllEnqueued records those of the devices it
  // copied from and hands the rest to the completer.
  virtual absl::StatusOr<std::unique_ptr<CopyOutBatch>> BeginCopyOut(StagedRecords* staged);
  // Whether Write is much cheaper in few large calls than in many small
  // ones (GPU memory: each call is a DMA with a fixed cost and a wait), so
  // that readers batch a whole staging window per call.
  virtual bool PrefersLargeWrites() const { return false; }
};

// Host memory of one process image through its /proc/<pid>/mem. A span
// that is not mapped in the image is an error (EIO), as is one whose image
// is gone (the process exited or exec'd: the file then reads and writes 0
// bytes, which is Unavailable here). With the kernel's default
// proc_mem.force_override, writes reach even pages the trainer mapped
// read-only (private copies, as a debugger's would): still only its memory.
//
// Borrows the file (or owns it, when it opened it from a pid); safe for
// concurrent use (pread/pwrite at explicit offsets).
class HostProcessMemory final : public MemorySource {
 public:
  // Borrows `memory_fd`, an open /proc/<pid>/mem (read-write) that outlives
  // this object; `pid` names the process in errors. The daemon's sessions
  // use this, with the file PeerProcess::Bind opened.
  HostProcessMemory(int memory_fd, pid_t pid) : fd_(memory_fd), pid_(pid) {}
  // Opens /proc/<pid>/mem now, binding the image `pid` runs at this moment
  // (tests and tools); if that fails, every access reports why.
  explicit HostProcessMemory(pid_t pid);

  absl::Status Read(absl::Span<const CopySpan> spans) override;
  absl::Status Write(absl::Span<const CopySpan> spans) override;

 private:
  absl::Status Transfer(absl::Span<const CopySpan> spans, bool read);
  // Copies `length` bytes between `local` and peer address `remote`.
  absl::Status Copy(uint64_t remote, char* local, uint64_t length, bool read);

  // Constant after construction.
  UniqueFd owned_;           // the file when this object opened it
  absl::Status open_error_;  // why it could not
  int fd_;
  pid_t pid_;
};

}  // namespace ckpt

// IoQueue: the kernel I/O seam of the daemon.
//
// An IoQueue submits positional reads and writes and reports their raw
// completions, exactly like one io_uring: results are byte counts or
// -errno, short transfers are possible, and nothing is retried here
// (IoPipeline does that). Two implementations exist: io_uring with
// registered buffers (the production path) and a synchronous
// pread/pwrite fallback for kernels without io_uring. Tests wrap a queue to
// inject short transfers, -EAGAIN and errors.
//
// Thread-safety: none. One thread owns a queue (each I/O worker has its own).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ckpt {

struct IoRequest {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kWrite;
  int fd = -1;
  char* buffer = nullptr;
  uint32_t length = 0;
  uint64_t offset = 0;  // file offset
  // Index of the registered buffer that contains [buffer, buffer+length), or
  // -1. io_uring uses READ_FIXED/WRITE_FIXED when it is set.
  int registered_index = -1;
  uint64_t tag = 0;  // returned in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  int32_t result = 0;  // bytes transferred, or -errno
};

class IoQueue {
 public:
  virtual ~IoQueue() = default;

  // "io_uring" or "pwrite", for logs and DaemonStatus.
  virtual absl::string_view name() const = 0;

  // Most requests that may be in flight at once.
  virtual uint32_t depth() const = 0;

  // Submits `requests` in order; the caller keeps in-flight count <=
  // depth(). Sets `*submitted` to how many of them (a prefix) reached the
  // queue, on error too: those are in flight, their buffers still in use,
  // and Reap reports them; the rest were not submitted. (A ring can take
  // part of a batch and then fail, and a caller that believed "error means
  // nothing started" would reuse buffers the kernel still writes.)
  virtual absl::Status Submit(absl::Span<const IoRequest> requests,
                              size_t* submitted) = 0;

  // Appends completions to `out`, waiting until at least `min_completions`
  // are available (0: only what is ready now). Completions appended before
  // an error are real and must still be handled.
  virtual absl::Status Reap(uint32_t min_completions,
                            std::vector<IoCompletion>* out) = 0;
};

// io_uring queue of `depth` entries; `registered` buffers are registered
// with the ring once, at creation (index i of the span is registered index
// i). With no registered buffers, requests' registered_index is ignored and
// plain reads/writes are used. Fails if the kernel has no io_uring or
// refuses the registration.
absl::StatusOr<std::unique_ptr<IoQueue>> CreateUringQueue(
    uint32_t depth, absl::Span<const iovec> registered);

// Synchronous pread/pwrite queue: each request runs inside Submit and its
// completion is held until Reap.
std::unique_ptr<IoQueue> CreatePwriteQueue(uint32_t depth);

// io_uring with registered buffers when the kernel allows it; else io_uring
// without registration (registration needs RLIMIT_MEMLOCK headroom); else
// the pwrite queue. Each fallback is logged once per process, with why.
std::unique_ptr<IoQueue> CreateBestIoQueue(uint32_t depth,
                                           absl::Span<const iovec> registered);

}  // namespace ckpt

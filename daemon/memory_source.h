// MemorySource: reads and writes the memory a peer registered.
//
// The save path copies chunks out of a trainer's memory into staging
// buffers; the restore path copies verified bytes back. HostProcessMemory
// does this for host memory with process_vm_readv/process_vm_writev on the
// peer pid the kernel reported at the handshake; the CUDA IPC source will
// implement the same interface. Callers have already checked that every
// span lies inside a region the peer registered (invariant 6).
//
// Thread-safety: implementations are safe to call from several threads.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ckpt {

// `length` bytes at `remote` in the peer, and the local bytes they map to.
struct CopySpan {
  uint64_t remote = 0;
  char* local = nullptr;
  uint64_t length = 0;
};

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // Copies every span from the peer into local memory, all or error.
  virtual absl::Status Read(absl::Span<const CopySpan> spans) = 0;
  // Copies every span from local memory into the peer, all or error.
  virtual absl::Status Write(absl::Span<const CopySpan> spans) = 0;
};

class HostProcessMemory final : public MemorySource {
 public:
  explicit HostProcessMemory(pid_t pid) : pid_(pid) {}
  absl::Status Read(absl::Span<const CopySpan> spans) override;
  absl::Status Write(absl::Span<const CopySpan> spans) override;

 private:
  absl::Status Transfer(absl::Span<const CopySpan> spans, bool read);
  const pid_t pid_;
};

}  // namespace ckpt

// Sealed memfds: memory that a trainer and the daemon both map, where each
// treats the other as untrusted.
//
// A memfd its owner could still shrink would make the other process's next
// access to its mapping a SIGBUS, so a shared page or allocation is created
// sealed against shrinking, growing and further sealing, and an fd taken
// from a peer is checked before it is mapped: a memfd (a regular file that
// has seals) of exactly the expected size, sealed against shrinking.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"

namespace ckpt {

// A new memfd of `bytes` (zero-filled), sealed. `name` shows in
// /proc/<pid>/maps.
absl::StatusOr<UniqueFd> CreateSealedMemfd(const char* name, uint64_t bytes);

// InvalidArgument, naming `what` ("an event page", ...), unless `fd` is a
// memfd of exactly `bytes` sealed against shrinking.
absl::Status CheckSealedMemfd(int fd, uint64_t bytes, absl::string_view what);

}  // namespace ckpt

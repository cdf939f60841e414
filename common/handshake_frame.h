// The handshake frame: the one message on the handshake socket
// (<socket>.session, docs/ARCHITECTURE.md "Processes and sockets").
//
// The daemon writes it once, right after it accepted a trainer's connection
// and read the trainer's pid from the kernel (SO_PEERCRED); the trainer reads
// it and sends nothing back. Wire format, kHandshakeFrameBytes = 20 bytes:
//
//   offset  size  field
//        0    16  session token: random bytes, the credential every session
//                 RPC carries (invariant 6: the pid behind it is the kernel's)
//       16     4  the daemon's pid, a uint32 in host byte order: both ends
//                 are on one host (a Unix socket), and the trainer passes it
//                 to prctl(PR_SET_PTRACER) so Yama lets the daemon read it
//
// The frame has no length or version field: it is the whole of what the
// daemon sends, and the two ends are built from this one definition. A
// frame of any other size, or whose pid is not a process id, is refused
// rather than guessed at: a pid of 0 would silently clear the trainer's
// ptracer instead of naming the daemon.
//
// Thread-safety: pure functions.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

inline constexpr size_t kSessionTokenBytes = 16;
inline constexpr size_t kHandshakeFrameBytes =
    kSessionTokenBytes + sizeof(uint32_t);

struct HandshakeFrame {
  std::string session_token;  // kSessionTokenBytes bytes
  pid_t daemon_pid = 0;       // > 0
};

// The frame's bytes (kHandshakeFrameBytes of them); InvalidArgument if the
// token is not kSessionTokenBytes long or the pid is not positive.
absl::StatusOr<std::string> EncodeHandshakeFrame(const HandshakeFrame& frame);

// Parses exactly one frame. A short (or long) frame is InvalidArgument naming
// both sizes; a pid that is 0 or does not fit pid_t is InvalidArgument naming
// the value.
absl::StatusOr<HandshakeFrame> DecodeHandshakeFrame(absl::string_view bytes);

}  // namespace ckpt

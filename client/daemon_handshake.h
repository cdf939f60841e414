// The handshake with the node's daemon that opens a session (libckpt's
// Client::Connect): a Unix socket beside the gRPC one, on which the daemon
// writes one frame (its pid, the session token; common/handshake_frame.h)
// and which stays open for the session's life, so that each side learns
// at once that the other has gone. Internal to the client library.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "client/call_canceller.h"
#include "common/handshake_frame.h"
#include "common/unique_fd.h"

namespace ckpt {

// Connects to the daemon's handshake socket `path`. A missing or refusing
// socket is tried again for a short while (a starting daemon publishes it
// a moment after its gRPC service answers); then UNAVAILABLE, "is ckptd
// running?". `canceller` (may be null) ends the wait.
absl::StatusOr<UniqueFd> DialHandshake(const std::string& path, CallCanceller* canceller);

// Reads the daemon's one frame from `fd`. A daemon that refuses the session
// (most often: --max_sessions are open) closes the socket without writing
// one: UNAVAILABLE. A daemon that is stopped accepts the connection (the
// kernel does) but never writes: the read waits in slices so that
// `canceller` (may be null) can end it.
absl::StatusOr<HandshakeFrame> ReadHandshakeFrame(int fd, CallCanceller* canceller);

}  // namespace ckpt

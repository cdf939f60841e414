// A listening Unix socket that clients see only once it is ready.
//
// The socket is bound under "<path>.new", given its file mode and group
// (common/socket_access.h) and listened on; PublishUnixSocket then renames
// it to <path> in one step. So a client never reaches a socket whose mode
// is still the umask's, nor one whose server is not yet serving; and a
// stale socket of an earlier run is replaced, not bound around.
//
// Thread-safety: free functions.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/socket_access.h"
#include "common/unique_fd.h"

namespace ckpt {

// The name the socket of `path` is bound under until it is published.
std::string UnpublishedSocketPath(const std::string& path);

// A nonblocking, close-on-exec listening socket bound at
// UnpublishedSocketPath(path), with the mode `access` asks for. Removes
// stale sockets at both names first.
absl::StatusOr<UniqueFd> ListenUnpublished(const std::string& path,
                                           const SocketAccess& access);

// Renames the unpublished socket to `path`.
absl::Status PublishUnixSocket(const std::string& path);

}  // namespace ckpt

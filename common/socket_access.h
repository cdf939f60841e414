// Who may connect to ckptd's sockets, and the file modes that say so.
//
// Connecting to a Unix socket needs write permission on its file, so the
// file's owner, group and mode are the first gate: the daemon's own user
// always, plus the members of one configured group (`--socket_group`), and
// nobody else — never whatever the umask happened to allow. The daemon
// checks the same rule again on every accepted connection from the peer's
// credentials (daemon/connection_listener.h), so a socket directory with
// loose permissions or a file mode changed by hand does not widen it.
//
// Thread-safety: free functions; RestrictSocketFile touches only the file
// it is given.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

struct SocketAccess {
  // Members of this group (primary or supplementary) may connect besides
  // root and the daemon's own user; unset: only those two.
  std::optional<gid_t> group;
};

// A group given by name or by number ("ckpt-users", "1234"); NotFound
// names the group that does not exist.
absl::StatusOr<gid_t> ResolveGroup(absl::string_view name_or_number);

// Gives the socket file at `path`, which the daemon has just bound under a
// name no client uses yet, the group and mode `access` asks for: 0660 with
// the group, 0600 without. The file is opened without following a symlink
// and must be a socket owned by the daemon's user, so a directory others
// can write (a /tmp) cannot make this change another file.
absl::Status RestrictSocketFile(const std::string& path, const SocketAccess& access);

// True if a peer with these credentials may use the daemon: root, the
// daemon's own user, or a member of `access.group`.
bool MayConnect(const SocketAccess& access, uid_t uid, gid_t gid,
                const std::vector<gid_t>& groups);

}  // namespace ckpt

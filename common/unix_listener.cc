#include "common/unix_listener.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt {

std::string UnpublishedSocketPath(const std::string& path) { return path + ".new"; }

absl::StatusOr<UniqueFd> ListenUnpublished(const std::string& path,
                                           const SocketAccess& access) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string unpublished = UnpublishedSocketPath(path);
  if (unpublished.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path too long: ", unpublished));
  }
  std::memcpy(addr.sun_path, unpublished.c_str(), unpublished.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  for (const std::string& stale : {path, unpublished}) {
    if (::unlink(stale.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("remove stale socket ", stale));
    }
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bind ", unpublished));
  }
  RETURN_IF_ERROR(RestrictSocketFile(unpublished, access));
  if (::listen(fd.get(), 128) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("listen ", unpublished));
  }
  return fd;
}

absl::Status PublishUnixSocket(const std::string& path) {
  const std::string unpublished = UnpublishedSocketPath(path);
  if (::rename(unpublished.c_str(), path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", unpublished, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
